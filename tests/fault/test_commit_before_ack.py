"""A worker acks a message only after its commit is recorded: a commit that was fenced (the
reconciler took the claim over meanwhile) or that the ledger refused leaves the message
alive, and it comes back. Real Dramatiq workers, the real sandbox, real redis-servers; the
message's return is read from the broker (a retry it holds) and from the ledger (its next
delivery claimed and found the effect DONE: a duplicate, never a second execution)."""

from __future__ import annotations

from dedupe import Ledger, State
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import runtime, submit
from workers.dev.local import LocalStack
from workers.dev.redis_server import RedisServer


def _charge(scope: str) -> str:
    return submit("charge", scope=scope, customer="c-7", amount="31.00", currency="usd").key


def _duplicates(ledger: Ledger) -> int:
    return ledger.counts().get(("dup_claim", "charge"), 0)


def test_a_fenced_commit_leaves_the_message_alive_and_it_comes_back_a_duplicate(
    fenceless: LocalStack,
) -> None:
    # The worker pauses between the effect and its commit, past its 3 s lease (no heartbeat
    # once the effect returned): the reconciler takes the claim over, finds the effect at
    # the provider and records it DONE; the worker's commit then lands fenced.
    fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS="before_commit=sleep:6")
    fenceless.start_reconciler()
    key = _charge("order-fenced-commit")
    ledger = runtime.ledger()
    [record] = wait_states(ledger, [key], timeout=30).values()
    assert record is not None and "found at the provider" in record.reason

    def fenced() -> bool:
        got = ledger.get(key)
        return got is not None and bool(got.late_receipts)

    wait_for(fenced, what="the worker's commit fenced (its receipt kept as a late one)")
    # Not acked: its next delivery claims, finds DONE, and only that one is acked.
    wait_for(lambda: _duplicates(ledger) >= 1, what="the message back after its fenced commit")
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="the duplicate acked")
    assert fenceless.stats()["executions"] == {key: 1}


def test_a_commit_the_ledger_refuses_leaves_the_message_alive(
    fenceless: LocalStack, own_ledger: RedisServer
) -> None:
    fenceless.start_workers(
        1, 2, EFFECTQ_FAILPOINTS="before_commit=sleep:2", EFFECTQ_REDIS_URL=own_ledger.url
    )
    key = _charge("order-refused-commit")
    ledger = runtime.ledger()
    wait_for(lambda: fenceless.stats()["total"] == 1, what="the effect executed")
    # The ledger refuses every write from now on (NOREPLICAS: a server refusal, "ledger
    # unavailable"), so the commit after the failpoint keeps failing until it gives up.
    admin = own_ledger.client()
    admin.config_set("min-replicas-to-write", 1)
    try:
        wait_for(
            lambda: broker_messages(fenceless)["delayed"] >= 1,
            what="the message kept for a retry after its commit failed",
            timeout=20,
        )
        record = ledger.get(key)
        assert record is not None and record.state is State.CLAIMED  # nothing recorded
    finally:
        admin.config_set("min-replicas-to-write", 0)
    # The claim's lease runs out; the reconciler finds the effect and records it; the
    # message, still alive, comes back a duplicate.
    fenceless.start_reconciler(EFFECTQ_REDIS_URL=own_ledger.url)
    wait_states(ledger, [key], timeout=30)
    wait_for(lambda: _duplicates(ledger) >= 1, what="the message back after the refused commit")
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="the duplicate acked")
    assert fenceless.stats()["executions"] == {key: 1}
