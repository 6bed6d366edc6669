"""LangChain 1.x: ``EffectGuard`` (``AgentMiddleware.wrap_tool_call``) in real agents, with a
scripted chat model, against real workers and the sandbox (its own idempotency off)."""

from __future__ import annotations

from tests.agents.extras import require

require("langchain.agents", "langchain-agent")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import AgentMiddleware  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

from tests.agents.scripted_chat import ScriptedChat, charge_call  # noqa: E402
from workers import get_tool  # noqa: E402
from workers.agents.langchain_agent import EffectGuard  # noqa: E402
from workers.dev.local import LocalStack  # noqa: E402

ORDER = {"customer": "cus_7", "amount": "10.50", "currency": "usd"}
RUNNER = Path(__file__).with_name("langchain_agent_run.py")
ROOT = Path(__file__).resolve().parents[2]


@tool
def charge(customer: str, amount: str, currency: str) -> str:
    """Charge the customer for the order."""
    raise AssertionError("a guarded call never runs the agent's own tool")


@tool
def order_total(order: str) -> str:
    """The order's total (read-only)."""
    return "10.50 USD"


class LoseFirstReply(AgentMiddleware):
    """Outermost: the first tool result is lost on its way back (the call happened)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = False

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        message = handler(request)
        if not self.lost:
            self.lost = True
            raise ConnectionError("the tool's reply was lost")
        return message


def test_a_retry_under_a_new_tool_call_id_after_an_exception_executes_once(
    fenceless: LocalStack,
) -> None:
    fenceless.start_workers(1, 2)
    model = ScriptedChat(
        script=[
            charge_call("call_1", **ORDER),
            charge_call("call_2", **ORDER),  # the model's retry: a new id, the same call
            AIMessage(content="Charged."),
        ]
    )
    agent = create_agent(
        model,
        tools=[charge, order_total],
        middleware=[LoseFirstReply(), EffectGuard(["charge"])],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "order-1042"}}
    with pytest.raises(ConnectionError):
        agent.invoke({"messages": [HumanMessage(content="Charge order 1042.")]}, config)
    result = agent.invoke({"messages": [HumanMessage(content="That failed; retry.")]}, config)

    answer = [m for m in result["messages"] if isinstance(m, ToolMessage)][-1]
    print("model read:", answer.content)
    key = get_tool("charge").derive("langgraph:order-1042", ORDER).key
    assert answer.tool_call_id == "call_2" and answer.status == "success"
    assert answer.artifact["key"] == key and answer.artifact["replayed"] is True
    assert "NOT executed again" in answer.content
    assert fenceless.stats()["executions"] == {answer.artifact["receipt"]["key"]: 1}


def test_a_read_only_tool_passes_through_untouched(live: LocalStack) -> None:
    model = ScriptedChat(
        script=[
            AIMessage(
                content="",
                tool_calls=[{"id": "t1", "name": "order_total", "args": {"order": "1042"}}],
            ),
            AIMessage(content="It is 10.50 USD."),
        ]
    )
    agent = create_agent(model, tools=[charge, order_total], middleware=[EffectGuard(["charge"])])
    result = agent.invoke(
        {"messages": [HumanMessage(content="Total?")]}, {"configurable": {"thread_id": "t"}}
    )
    answer = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    assert answer.content == "10.50 USD"
    assert live.stats()["total"] == 0


def _run(stack: LocalStack, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUNNER), mode, "order-77", json.dumps(ORDER)],
        env=stack.env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def test_a_run_resumed_in_a_fresh_process_gets_the_recorded_result(
    fenceless: LocalStack,
) -> None:
    fenceless.start_workers(1, 2)
    crashed = _run(fenceless, "crash")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert fenceless.stats()["total"] == 1  # the effect happened; its result was never recorded

    resumed = _run(fenceless, "resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    answer = json.loads(resumed.stdout.splitlines()[-1])
    print("model read after resume:", answer["text"])
    assert answer["id"] == "call_after_resume"
    assert (answer["status"], answer["replayed"]) == ("done", True)
    assert fenceless.stats()["executions"] == {answer["receipt"]["key"]: 1}


def test_the_scope_is_the_thread_and_identity_never_the_tool_call_id() -> None:
    import workers.examples  # noqa: F401  (declares the tools)

    runtime = SimpleNamespace(config={"configurable": {"thread_id": "t-9"}})
    call = {"name": "charge", "id": "call_123", "args": ORDER}
    request: Any = SimpleNamespace(tool_call=call, runtime=runtime)
    assert EffectGuard(["charge"]).scope(request) == "langgraph:t-9"
    by_order = EffectGuard(["charge"], identity=lambda r: "order-1042")
    assert by_order.scope(request) == "langgraph:t-9:order-1042"
    assert "call_123" not in by_order.scope(request)


def test_the_readme_langchain_example_runs_offline_and_charges_once() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "langchain_agent.py")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "tool answered call_2: charge was already done" in done.stdout
    assert "provider executions: 1" in done.stdout
