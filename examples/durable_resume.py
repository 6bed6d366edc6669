"""A runtime that checkpoints its conversation, crashes after a tool call's side effect and
before the call's result reached its checkpoint, and resumes without calling the tool again.

The runtime's execution id for a side-effecting call is the effect key (from its durable
run id and the call's arguments — not the model's tool_call_id). On resume, for each call
with no result in the checkpoint, it asks effectq (``workers.agents.resume.recover``): a
DONE effect is reconstructed from its receipt, an UNKNOWN one is surfaced as recovery
required (never replayed), and only a call with no record is submitted. Each call's audit
fields (tool_call_id, execution_id, attempt, recovery_decision) go into the checkpoint.

Offline: an embedded Redis, the sandbox provider with its own idempotency off (only effectq
stands between a resume and a second charge), a worker pool and a reconciler.

    pip install -e '.[demo]' && python examples/durable_resume.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from workers.dev.local import LocalStack
from workers.dev.sandbox import SandboxConfig

RUN_ID = "run-2026-0412"  # the runtime's durable id of this conversation


class Crash(Exception):
    """The process died here (a real one would be SIGKILLed: nothing after it runs)."""


class Checkpoint:
    """The conversation as the runtime persists it: one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {"calls": []}

    def save(self, state: dict[str, Any]) -> None:
        self.path.write_text(json.dumps(state, indent=2))


def first_run(checkpoint: Checkpoint, calls: list[dict[str, Any]]) -> None:
    """The model asked for ``calls``; the runtime records them, runs them, and dies right
    after the tools ran, before their results are checkpointed."""
    from workers.guard import guarded

    checkpoint.save({"calls": [{**c, "attempt": 1, "result": None} for c in calls]})
    for call in calls:
        guarded(call["tool"], timeout=10).invoke(call["args"], runtime_scope=RUN_ID)
    raise Crash("after the side effects, before the results were checkpointed")


def resume(checkpoint: Checkpoint) -> dict[str, Any]:
    """A fresh runtime: every call without a result asks effectq first."""
    from workers.agents.resume import recover

    state = checkpoint.load()
    for call in state["calls"]:
        if call["result"] is not None:
            continue  # checkpointed: nothing to ask
        found = recover(call["tool"], scope=RUN_ID, args=call["args"], timeout=10)
        call.update(
            execution_id=found.execution_id,
            attempt=call["attempt"] + 1,
            recovery_decision=found.decision,
            result=found.receipt if found.receipt is not None else found.message,
        )
    checkpoint.save(state)
    return state


def main() -> None:
    order = {"customer": "cus_7", "amount": "10.50", "currency": "usd"}
    calls = [
        {"tool_call_id": "call_a1", "tool": "charge", "args": order},
        {"tool_call_id": "call_a2", "tool": "charge", "args": {**order, "customer": "cus_8"}},
    ]
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalStack(
            sandbox=SandboxConfig(provider_idempotency=False),
            env={"EFFECTQ_RECONCILER_BUDGET": "1"},
        ) as stack,
    ):
        stack.apply_env()
        import workers.examples  # noqa: F401  (declares the tools against this stack)

        stack.start_workers(1, 2)
        stack.start_reconciler()
        checkpoint = Checkpoint(Path(tmp) / "conversation.json")
        # The second call's answer is lost on the wire and the provider's lookup is down:
        # nobody can tell whether it happened.
        try:
            first_run(checkpoint, calls[:1])
        except Crash as crash:
            print(f"crashed: {crash}")
        stack.sandbox.configure(drop_ack_rate=1.0, lookup_enabled=False)
        state = checkpoint.load()
        state["calls"].append({**calls[1], "attempt": 1, "result": None})
        checkpoint.save(state)
        try:
            from workers.verbs import submit_call

            submit_call("charge", scope=RUN_ID, args=calls[1]["args"])
            deadline = time.monotonic() + 10
            while stack.stats()["total"] < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            raise Crash("while the second call was in flight")
        except Crash as crash:
            print(f"crashed: {crash}")

        resumed = resume(checkpoint)
        executed = stack.stats()["executions"]  # after the resume: it called nothing
        for call in resumed["calls"]:
            audit = {k: call.get(k) for k in ("tool_call_id", "execution_id", "attempt")}
            print(f"{call['recovery_decision']}: {json.dumps(audit)}")
            print(f"  result: {json.dumps(call['result'])[:160]}")
            print(f"  provider executions: {executed.get(call['execution_id'], 0)}")


if __name__ == "__main__":
    main()
