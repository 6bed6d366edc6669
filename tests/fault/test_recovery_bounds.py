"""The recovery bound after a worker dies holding a claim (issue 37, item 8), measured on
real processes: a worker pool whose worker is SIGKILLed right after its claim, a second
pool that gets the redelivered message, ``effectq reconciler`` (interval 1 s), and the
sandbox answering lookups in 2 s (``lookup_latency_ms``), on production retry backoff.

    claim expired  -> decided FAILED   within the reconciler's interval + one lookup
    decided FAILED -> executed         within the worker's poll period of a claim that is
                                       the reconciler's (interval + lookup budget)

The second was "as long again as overdue", or the reconciler's whole takeover lease (30 s)
for a message that found the claim RECONCILING: the freed key waited 12-29 s."""

from __future__ import annotations

import uuid

from dedupe import State, idempotency_key
from tests.support.stack import wait_for
from workers import runtime
from workers.dev.local import LocalStack
from workers.producer import submit

LOOKUP_S = 2.0
INTERVAL_S = 1.0
LEASE_S = 8.0  # the dying worker's lease: the second pool's message meets it live
# The worker's poll period of a claim that is the reconciler's (workers/tool/retry.py,
# _RECONCILER_POLL_MS).
POLL_S = 6.0
SLACK_S = 1.5  # process scheduling, the broker's delay queue, the claim's own round trip


def test_a_dead_holders_effect_is_decided_and_executed_within_the_stated_bounds(
    live: LocalStack,
) -> None:
    live.sandbox.configure(lookup_latency_ms=LOOKUP_S * 1000)
    # Settle 0: one lookup decides (the bound for a lookup inside its settle window adds it).
    live.start_reconciler(interval=INTERVAL_S, EFFECTQ_EXAMPLE_SETTLE_S="0")
    dying = live.start_workers(
        1, 1, EFFECTQ_FAILPOINTS="after_claim=kill", EFFECTQ_EXAMPLE_LEASE_S=str(LEASE_S)
    )
    args = {"recipient": f"r{uuid.uuid4().hex[:8]}@example.com", "subject": "hi"}
    handle = submit("send_email", scope=f"bound-{uuid.uuid4().hex[:8]}", **args)
    ledger = runtime.ledger()

    def claimed() -> bool:
        record = ledger.get(handle.key)
        return record is not None and record.state is State.CLAIMED

    wait_for(claimed, timeout=30, what="the dying worker's claim")
    live.stop_pool(dying)  # its restarted worker would die on the redelivery too
    live.start_workers(
        1, 2, EFFECTQ_RETRY_MIN_BACKOFF_MS="1000", EFFECTQ_RETRY_MAX_BACKOFF_MS="300000"
    )

    def done() -> bool:
        record = ledger.get(handle.key)
        return record is not None and record.state is State.DONE

    wait_for(done, timeout=120, what="the effect executed")
    record = ledger.get(handle.key)
    assert record is not None
    claimed_ms = record.created_ms  # the dying worker's claim made the record
    decided_ms = next(t.at_ms for t in record.history if t.state == "FAILED")
    expired_ms = claimed_ms + LEASE_S * 1000
    provider_key = idempotency_key(handle.key, record.generation)
    [execution] = [e for e in live.sandbox.executions() if e["idempotency_key"] == provider_key]
    executed_ms = execution["created_at"] * 1000

    to_decided = (decided_ms - expired_ms) / 1000
    to_executed = (executed_ms - decided_ms) / 1000
    print(f"expired -> FAILED {to_decided:.1f} s; FAILED -> executed {to_executed:.1f} s")
    assert to_decided <= INTERVAL_S + LOOKUP_S + SLACK_S, to_decided
    assert to_executed <= POLL_S + SLACK_S, to_executed
    assert live.stats()["total"] == 1
