"""Durable resume (``workers.agents.resume.recover``) at each crash point of a runtime that
checkpoints its conversation (the OpenWorker issue's matrix), against real workers, a real
reconciler and the sandbox with its own idempotency off.

| the runtime crashed                          | effectq holds     | resume            |
|----------------------------------------------|-------------------|-------------------|
| 1 before the call was dispatched             | no record         | executed          |
| 2 dispatched, before a worker ran it         | a queued message  | awaited           |
| 3 the provider executed, its answer was lost | reconciled: DONE  | reconstructed     |
| 3' the same, the provider's lookup is down   | UNKNOWN           | recovery_required |
| 4 DONE, before the result's checkpoint       | DONE              | reconstructed     |
| 5 after the result's checkpoint              | (the runtime's own record: it does not ask) |

Every row ends with one execution at the provider, or none.
"""

from __future__ import annotations

from tests.support.stack import wait_for
from workers import get_tool
from workers.agents.resume import recover
from workers.dev.local import LocalStack
from workers.verbs import submit_call

ORDER = {"customer": "cus_7", "amount": "10.50", "currency": "usd"}


def executions(stack: LocalStack, key: str) -> int:
    # The example tools send the effect key (generation 0) as the provider's idempotency key.
    found: dict[str, int] = stack.stats()["executions"]
    return found.get(key, 0)


def test_resume_at_each_crash_point_executes_at_most_once(fenceless: LocalStack) -> None:
    charge = get_tool("charge")

    # 2: the runtime dispatched (submitted) and crashed before any worker ran the call.
    dispatched = submit_call("charge", scope="run-2", args=ORDER)
    fenceless.start_workers(1, 2)
    # An unavailable lookup is UNKNOWN after one round (default 5, backing off).
    fenceless.start_reconciler(EFFECTQ_RECONCILER_BUDGET="1")
    row2 = recover("charge", scope="run-2", args=ORDER)
    assert (row2.decision, row2.execution_id) == ("awaited", dispatched.key)

    # 1: it crashed before dispatching anything.
    row1 = recover("charge", scope="run-1", args=ORDER)
    assert row1.decision == "executed" and row1.receipt is not None

    # 4: the call was DONE; the runtime crashed before checkpointing its result.
    row4 = recover("charge", scope="run-1", args=ORDER)
    assert (row4.decision, row4.receipt) == ("reconstructed", row1.receipt)

    # 3: the provider executed the call and its answer was lost on the wire: the worker
    # hands the claim to the reconciler, which finds the effect at the provider.
    fenceless.sandbox.configure(drop_ack_rate=1.0)
    lost = submit_call("charge", scope="run-3", args=ORDER)
    wait_for(lambda: executions(fenceless, lost.key) == 1, what="the provider executing")
    fenceless.sandbox.configure(drop_ack_rate=0.0)
    row3 = recover("charge", scope="run-3", args=ORDER)
    assert row3.decision in ("reconstructed", "awaited") and row3.receipt is not None

    # 3': the same with no lookup at the provider: nothing can establish the outcome.
    fenceless.sandbox.configure(drop_ack_rate=1.0, lookup_enabled=False)
    unknown = submit_call("charge", scope="run-3b", args=ORDER)
    wait_for(lambda: executions(fenceless, unknown.key) == 1, what="the provider executing")
    row3b = recover("charge", scope="run-3b", args=ORDER, timeout=15)
    assert row3b.decision == "recovery_required", row3b
    again = recover("charge", scope="run-3b", args=ORDER)  # a second resume asks, never sends
    assert again.decision == "recovery_required"

    keys = [charge.derive(f"run-{n}", ORDER).key for n in ("1", "2", "3", "3b")]
    assert [executions(fenceless, k) for k in keys] == [1, 1, 1, 1]
