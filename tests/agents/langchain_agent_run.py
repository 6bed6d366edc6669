"""A LangChain 1.x agent run in a process of its own (the environment points it at the
stack): ``python langchain_agent_run.py MODE THREAD_ID ARGS_JSON``.

``crash``: the scripted model asks for one ``charge``; the process SIGKILLs itself as the
guarded call's result comes back, before anything is checkpointed. ``resume``: a fresh
process on the same thread, whose model asks again under a new tool_call_id; prints the
ToolMessage it got (content and artifact) as one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

import workers.examples  # noqa: F401  (declares the tools)
from tests.agents.scripted_chat import ScriptedChat, charge_call
from workers.agents.langchain_agent import EffectGuard


@tool
def charge(customer: str, amount: str, currency: str) -> str:
    """Charge the customer for the order."""
    raise AssertionError("a guarded call never runs the agent's own tool")


class CrashOnReply(AgentMiddleware):
    """Outermost: the process dies with the tool's result in hand, unrecorded."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        handler(request)
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    mode, thread, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    call_id = "call_first" if mode == "crash" else "call_after_resume"
    model = ScriptedChat(script=[charge_call(call_id, **args), AIMessage(content="Charged.")])
    outer = [CrashOnReply()] if mode == "crash" else []
    agent = create_agent(model, tools=[charge], middleware=[*outer, EffectGuard(["charge"])])
    result = agent.invoke(
        {"messages": [HumanMessage(content="Charge the order.")]},
        {"configurable": {"thread_id": thread}},
    )
    answer = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    print(json.dumps({"id": answer.tool_call_id, "text": answer.content, **answer.artifact}))


if __name__ == "__main__":
    main()
