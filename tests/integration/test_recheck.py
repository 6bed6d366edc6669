"""The bulk re-check end to end: a lookup outage turns every unresolved claim UNKNOWN once
the reconciler's budget is spent; lookups come back; one ``effectq recheck`` sends them all
back to the reconciler, which asks the provider again — DONE where it executed, FAILED
(then run once by the message's own next delivery) where it never did. Real worker
processes, a real reconciler, the real sandbox; the provider's counts decide."""

from __future__ import annotations

import json
import subprocess
import sys

from dedupe import State
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import runtime, submit
from workers.dev.local import LocalStack

# Short leases and settle windows, a small lookup budget, and a broker that requeues a
# killed worker's message within seconds (not the default minute).
FAST = {
    "EFFECTQ_EXAMPLE_LEASE_S": "2",
    "EFFECTQ_EXAMPLE_SETTLE_S": "1",
    "EFFECTQ_RECONCILER_BUDGET": "2",
    "EFFECTQ_RECONCILER_BACKOFF_S": "0.1",
    "EFFECTQ_RETRY_MAX_BACKOFF_MS": "2000",
    "EFFECTQ_BROKER_HEARTBEAT_TIMEOUT_MS": "3000",
    "EFFECTQ_BROKER_MAINTENANCE_INTERVAL_MS": "1000",
}


def _cli(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers", *args], env=stack.env(**FAST), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


def _email(scope: str) -> str:
    return submit("send_email", scope=scope, recipient="ops@example.com", subject="s").key


def test_one_recheck_after_a_lookup_outage_settles_every_unknown_by_lookup(
    fenceless: LocalStack,
) -> None:
    ledger = runtime.ledger()
    fenceless.sandbox.configure(lookup_enabled=False, drop_ack_rate=1.0)
    fenceless.start_reconciler(0.3, **FAST)
    # Executed, the answer lost: each worker hands its claim over, unsure.
    pool = fenceless.start_workers(1, 2, **FAST)
    executed = [_email(f"evt-recheck-sent-{i}") for i in range(3)]
    wait_states(ledger, executed, {State.UNKNOWN}, timeout=90)
    fenceless.stop_pool(pool)
    # Never executed: each worker dies right after its claim.
    fenceless.sandbox.configure(drop_ack_rate=0.0)
    pool = fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS="after_claim=kill", **FAST)
    unsent = [_email(f"evt-recheck-unsent-{i}") for i in range(2)]
    wait_states(ledger, unsent, {State.UNKNOWN}, timeout=90)
    fenceless.stop_pool(pool)
    fenceless.start_workers(1, 2, **FAST)
    keys = executed + unsent
    assert fenceless.stats()["total"] == len(executed)

    words = ["--tool", "send_email", "--since", "600", "--actor", "sre-kim"]
    counted = _cli(fenceless, "recheck", *words, "--reason", "outage over?", "--dry-run",
                   "--json")  # fmt: skip
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout)["matched"] == len(keys)
    assert all(r.state is State.UNKNOWN for r in ledger.get_many(keys).values() if r)

    fenceless.sandbox.configure(lookup_enabled=True)
    done = _cli(fenceless, "recheck", *words, "--reason", "lookups restored", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert (document["matched"], document["rechecked"], document["refused"]) == (5, 5, {})

    records = wait_states(ledger, keys, timeout=90)
    for key in executed:
        assert "found at the provider" in records[key].reason  # type: ignore[union-attr]
    for key in unsent:  # FAILED by lookup after the settle window, then run by its message
        notes = [h.note for h in records[key].history]  # type: ignore[union-attr]
        assert "reconciled: not found after the settle window" in notes, notes
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="acked", timeout=90)
    assert fenceless.stats()["executions"] == dict.fromkeys(keys, 1)

    trail = _cli(fenceless, "audit", executed[0], "--json")
    assert trail.returncode == 0, trail.stderr
    [entry] = json.loads(trail.stdout)["audit"]
    assert (entry["action"], entry["actor"], entry["reason"]) == (
        "recheck", "sre-kim", "lookups restored",
    )  # fmt: skip
    assert entry["outcome"].startswith("ok: RECONCILING")
    again = _cli(fenceless, "recheck", *words, "--reason", "again", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["matched"] == 0
