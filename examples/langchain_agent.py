"""A LangChain 1.x agent whose ``charge`` tool is guarded by ``EffectGuard``, offline.

The whole pipeline runs on this machine (an embedded Redis, the sandbox provider with its
own idempotency off, a worker pool) and the model is scripted: it charges the customer, the
tool's reply is lost on its way back (the charge happened), and the model, asked again,
charges again under a new tool_call_id. The guard keys the call on the thread, never the
tool_call_id: the provider executes the charge once and the retry reads the original
receipt. No network, no API key:

    pip install -e '.[langchain-agent]' && python examples/langchain_agent.py
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from workers.dev.local import LocalStack
from workers.dev.sandbox import SandboxConfig

ORDER = {"customer": "cus_7", "amount": "10.50", "currency": "usd"}


def _charge_call(call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"id": call_id, "name": "charge", "args": ORDER}])


class ScriptedChat(BaseChatModel):
    """Answers each model call with the next message of a script (no provider)."""

    script: list[AIMessage] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChat:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script.pop(0))])


@tool
def charge(customer: str, amount: str, currency: str) -> str:
    """Charge the customer for the order."""
    # Gives the model the schema only: EffectGuard sends the call to effectq's `charge`.
    raise AssertionError("a guarded call never runs the agent's own tool")


class LoseFirstReply(AgentMiddleware):
    """Outside the guard: the first tool reply is lost on the wire (the call happened)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = False

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        message = handler(request)
        if not self.lost:
            self.lost = True
            print(f"reply to {request.tool_call['id']} lost: {message.content}")
            raise ConnectionError("the tool's reply was lost")
        return message


def main() -> int:
    with LocalStack(sandbox=SandboxConfig(provider_idempotency=False)) as stack:
        stack.apply_env()
        import workers.examples  # noqa: F401  (declares the tools against this stack)
        from workers.agents.langchain_agent import EffectGuard

        stack.start_workers(1, 2)
        model = ScriptedChat(
            script=[
                _charge_call("call_1"),
                _charge_call("call_2"),  # the model's retry: a new id, the same charge
                AIMessage(content="Order 1042 is paid."),
            ]
        )
        agent = create_agent(
            model,
            tools=[charge],
            middleware=[LoseFirstReply(), EffectGuard(["charge"])],
            checkpointer=InMemorySaver(),
        )
        # The thread is the run's durable identity: the guard's scope (langgraph:order-1042).
        config: Any = {"configurable": {"thread_id": "order-1042"}}
        try:
            agent.invoke({"messages": [HumanMessage(content="Charge order 1042.")]}, config)
        except ConnectionError as lost:
            print(f"agent run failed: {lost}  -> the user asks again")
        result = agent.invoke({"messages": [HumanMessage(content="That failed; retry.")]}, config)
        for message in result["messages"]:
            if isinstance(message, ToolMessage):
                print(f"tool answered {message.tool_call_id}: {message.content}")
        executions = stack.stats()["total"]
        print(f"agent answered: {result['messages'][-1].content}")
        print(f"provider executions: {executions}")
        return 0 if executions == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
