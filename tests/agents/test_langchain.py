"""LangChain: a guarded ``StructuredTool`` against real workers and the sandbox (its own
idempotency off); the same logical call made again from another process."""

from __future__ import annotations

from tests.agents.extras import require

require("langchain_core", "langchain")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from langchain_core.messages import ToolMessage  # noqa: E402

from tests.support.stack import broker_messages  # noqa: E402
from workers import EffectTool, get_tool  # noqa: E402
from workers.agents.langchain import structured_tool, thread_scope  # noqa: E402
from workers.dev.local import LocalStack  # noqa: E402

ORDER = {"customer": "cus_7", "amount": "10.50", "currency": "usd"}
CALLER = Path(__file__).with_name("langchain_call.py")


@pytest.fixture
def charge(fenceless: LocalStack) -> EffectTool:
    return get_tool("charge")


def _call_in_a_new_process(stack: LocalStack, thread: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(CALLER), thread, json.dumps(ORDER)],
        env=stack.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_the_tool_keeps_its_name_description_and_schema(charge: EffectTool) -> None:
    pay = structured_tool(charge, description="Charge the customer for the order.")
    assert pay.name == "charge"
    assert pay.description == "Charge the customer for the order."
    schema = pay.tool_call_schema.model_json_schema()
    assert set(schema["properties"]) == {"customer", "amount", "currency"}
    assert set(schema["required"]) == {"customer", "amount", "currency"}


def test_one_logical_call_from_two_processes_executes_once(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    fenceless.start_workers(1, 2)
    first = _call_in_a_new_process(fenceless, "order-1042")
    again = _call_in_a_new_process(fenceless, "order-1042")
    key = charge.derive("langgraph:order-1042", ORDER).key
    assert first["key"] == again["key"] == key
    assert first["receipt"] is not None and again["receipt"] == first["receipt"]
    assert "NOT executed again" in again["text"]
    assert fenceless.stats()["executions"] == {key: 1}


def test_arguments_outside_the_schema_are_refused_with_a_message(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    pay = structured_tool(charge)
    call = {"type": "tool_call", "id": "c1", "name": "charge", "args": {**ORDER, "scope": "x"}}
    message = pay.invoke(call, config={"configurable": {"thread_id": "order-1"}})
    assert isinstance(message, ToolMessage) and message.status == "error"
    refusal = "charge NOT executed: invalid arguments (scope: Extra inputs are not permitted)."
    assert message.content == refusal
    assert broker_messages(fenceless)["live"] == 0


def test_the_scope_is_the_langgraph_thread_and_node() -> None:
    inside_a_graph = {"configurable": {"thread_id": "t-9"}, "metadata": {"langgraph_node": "pay"}}
    assert thread_scope(inside_a_graph) == "langgraph:t-9:pay"  # type: ignore[arg-type]
    assert thread_scope({"configurable": {"thread_id": "t-9"}}) == "langgraph:t-9"
    assert thread_scope({}) is None
