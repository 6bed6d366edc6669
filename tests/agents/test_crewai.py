"""CrewAI's own retry loop against a guarded payment tool: real CrewAI 1.15, a scripted
model (no network), real worker processes and the sandbox with its own idempotency off,
so that only effectq stands between CrewAI's retry and a second charge."""

from __future__ import annotations

from tests.agents.extras import OFFLINE_ENV, require

require("crewai", "crewai")

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
import pytest  # noqa: E402
from crewai import Agent, Crew, Task  # noqa: E402
from crewai.tools import BaseTool, tool  # noqa: E402

from tests.agents.scripted import ScriptedLLM, tool_call  # noqa: E402
from workers import EffectCall, EffectTool, ToolResult, effect_tool, get_tool, runtime  # noqa: E402
from workers.agents.crewai import GuardedTool, guarded_tool, task_scope  # noqa: E402
from workers.dev.local import LocalStack  # noqa: E402
from workers.guard import Outcome, OutcomeStatus  # noqa: E402

# CrewAI's own deprecations (its internals use them), not ours.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")

ORDER = {"customer": "cus_7", "amount": "10.50", "currency": "usd"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def charge(fenceless: LocalStack) -> EffectTool:
    return get_tool("charge")


def _crew(payment_tool: BaseTool, llm: ScriptedLLM) -> tuple[Crew, Task]:
    agent = Agent(
        role="billing clerk",
        goal="Charge each order exactly once",
        backstory="You run the till.",
        llm=llm,
        tools=[payment_tool],
        max_retry_limit=1,
    )
    task = Task(
        description="Charge customer cus_7 10.50 USD for order 1042.",
        expected_output="The receipt id.",
        agent=agent,
    )
    return Crew(agents=[agent], tasks=[task]), task


def _charge_then_fail_then_retry() -> ScriptedLLM:
    """The model charges; its next call fails, so CrewAI's max_retry_limit runs the whole
    task again, and the model charges again before answering."""
    return ScriptedLLM(
        model="scripted",
        script=[
            [tool_call("call_1", "charge", **ORDER)],
            RuntimeError("model provider dropped the connection"),
            [tool_call("call_2", "charge", **ORDER)],
            "Charged.",
        ],
    )


def _receipt_text(key: str) -> str:
    record = runtime.ledger().get(key)
    assert record is not None and record.receipt is not None
    return json.dumps(record.receipt, sort_keys=True)


def test_the_model_sees_the_tools_name_description_and_schema(charge: EffectTool) -> None:
    llm = ScriptedLLM(model="scripted", script=["Nothing to do."])
    pay = guarded_tool(charge, scope="order-1", description="Charge the customer for the order.")
    crew, _ = _crew(pay, llm)
    crew.kickoff()
    [[offered]] = llm.tools_seen
    function = offered["function"]
    assert function["name"] == "charge"
    assert function["description"] == "Charge the customer for the order."
    assert set(function["parameters"]["properties"]) == {"customer", "amount", "currency"}
    assert function["parameters"]["additionalProperties"] is False


def test_guarded_tool_also_decorates_a_declared_effect_tool(fenceless: LocalStack) -> None:
    @guarded_tool(scope="refund-1")
    @effect_tool(identity=("charge_id",), bound=("charge_id", "amount"))
    def refund(call: EffectCall, charge_id: str, amount: str, note: str = "") -> ToolResult:
        """Refund a charge."""
        raise AssertionError("declared for its schema only; never run here")

    assert isinstance(refund, GuardedTool) and refund.name == "refund"
    assert refund.description == "Refund a charge."  # the body's docstring
    # Only declared fields reach the schema: note is undeclared, so the model never sees it.
    assert list(refund.args_schema.model_fields) == ["charge_id", "amount"]


def test_a_crew_with_cache_on_keeps_only_done_answers(charge: EffectTool) -> None:
    pay = guarded_tool(charge, scope="order-2")
    assert pay.cache_function(ORDER, Outcome(OutcomeStatus.DONE, "charge done"))
    # Cached, a "still pending" would be the model's answer to every later call.
    assert not pay.cache_function(ORDER, Outcome(OutcomeStatus.PENDING, "still pending"))


def test_crewai_task_retry_after_a_charge_gets_the_original_receipt(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    fenceless.start_workers(1, 2)
    llm = _charge_then_fail_then_retry()
    crew, task = _crew(guarded_tool(charge, description="Charge the customer."), llm)
    assert crew.kickoff().raw == "Charged."
    # The scope is CrewAI's task, which keeps its id through the retry.
    key = charge.derive(f"crewai-task:{task.id}", ORDER).key
    assert fenceless.stats()["executions"] == {key: 1}
    answers = llm.tool_results()
    assert set(answers) == {"call_1", "call_2"}  # the retry really called the tool again
    receipt = _receipt_text(key)
    assert receipt in answers["call_1"] and receipt in answers["call_2"]
    assert "NOT executed again" in answers["call_2"]


def test_unguarded_tool_under_the_same_retry_charges_twice(fenceless: LocalStack) -> None:
    charge = get_tool("charge")

    @tool("charge")
    def charge_directly(customer: str, amount: str, currency: str) -> str:
        """Charge the customer."""
        # Keyed as the guard would key it, so that the provider's counts compare.
        key = charge.derive(str(task_scope()), ORDER).key
        body = {"tool": "charge", "customer": customer, "amount": amount, "currency": currency}
        url = f"{fenceless.sandbox.url}/v1/effects"
        return httpx.post(url, json=body, headers={"Idempotency-Key": key}).text

    llm = _charge_then_fail_then_retry()
    crew, task = _crew(charge_directly, llm)
    assert crew.kickoff().raw == "Charged."
    key = charge.derive(f"crewai-task:{task.id}", ORDER).key
    assert fenceless.stats()["executions"] == {key: 2}
    answers = llm.tool_results()
    assert json.loads(answers["call_1"])["id"] != json.loads(answers["call_2"])["id"]


def test_two_parallel_tool_calls_in_one_turn_make_one_charge(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    fenceless.start_workers(1, 2)
    # Latency keeps the first call in flight while the second arrives.
    fenceless.sandbox.configure(latency_ms=300)
    same_turn = [tool_call("call_a", "charge", **ORDER), tool_call("call_b", "charge", **ORDER)]
    llm = ScriptedLLM(model="scripted", script=[same_turn, "Charged."])
    crew, _ = _crew(guarded_tool(charge, scope="order-1042"), llm)
    crew.kickoff()
    key = charge.derive("order-1042", ORDER).key
    assert fenceless.stats()["executions"] == {key: 1}
    answers = llm.tool_results()
    receipt = _receipt_text(key)
    assert receipt in answers["call_a"] and receipt in answers["call_b"]


def test_worker_killed_after_the_provider_answered_the_agent_gets_the_reconciled_receipt(
    fenceless: LocalStack, charge: EffectTool
) -> None:
    fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS="after_effect=kill")
    fenceless.start_reconciler()
    llm = ScriptedLLM(model="scripted", script=[[tool_call("call_1", "charge", **ORDER)], "Done."])
    crew, _ = _crew(guarded_tool(charge, scope="order-1042", timeout=60), llm)
    assert crew.kickoff().raw == "Done."
    key = charge.derive("order-1042", ORDER).key
    assert "restarting in" in fenceless.log("workers.log")  # the holder really died
    assert fenceless.stats()["executions"] == {key: 1}
    record = runtime.ledger().get(key)
    assert record is not None
    assert any("found at the provider" in h.note for h in record.history), record.history
    provider = httpx.get(f"{fenceless.sandbox.url}/v1/effects/{key}").json()
    assert json.dumps(provider, sort_keys=True) in llm.tool_results()["call_1"]


def test_the_readme_example_runs_offline() -> None:
    env: dict[str, Any] = {**os.environ, **OFFLINE_ENV}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "crewai_payment.py")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "provider executions: 1" in done.stdout
