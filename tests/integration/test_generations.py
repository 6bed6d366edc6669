"""Generations end to end (issue 15, item 1): real worker processes, the real ledger and
broker, the sandbox provider with its own idempotency off (``fenceless``), so the
provider's execution count is the only witness. Only a submission or replay made after a
revoke may run the effect again; a message queued before it is a duplicate."""

from __future__ import annotations

import dataclasses

import pytest

from dedupe import OperatorError, State, idempotency_key
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import Envelope, get_tool, runtime, submit, submit_campaign, verbs
from workers.dev.local import LocalStack

ARGS = {"customer": "cus_rv", "amount": "25.00", "currency": "usd"}


def test_a_message_queued_before_a_revoke_is_never_executed_after_it(
    fenceless: LocalStack,
) -> None:
    fenceless.start_workers(processes=1, threads=2)
    handle = submit("charge", scope="order-revoked", **ARGS)
    handle.wait(30)
    ledger = runtime.ledger()
    verbs.revoke(handle.key, actor="sre", reason="refunded")
    # The message submitted before the revoke comes again: a redelivery after a worker died
    # at after_commit, or the second copy of a campaign re-submitted while it was queued.
    tool = get_tool("charge")
    old = Envelope.of(tool.derive("order-revoked", ARGS)).model_dump()
    assert old["key"] == handle.key and old.get("g", 0) == 0
    tool.actor.send(old)
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="old message handled", timeout=60)
    assert fenceless.stats()["executions"] == {handle.key: 1}
    record = ledger.get(handle.key)
    assert record is not None and record.state is State.REVOKED and record.generation == 0
    assert [h.state for h in record.history] == ["CLAIMED", "DONE", "REVOKED"]
    assert ledger.counts()[("dup_claim", "charge")] == 1

    # A replay made after the revoke is a new submission: it runs once more, generation 1.
    # The DONE record kept no request: the operator gives the call.
    replayed = verbs.replay(
        handle.key, actor="sre", reason="charge again", scope="order-revoked", args=ARGS
    )
    assert replayed["status"] == "enqueued"
    [again] = wait_states(ledger, [handle.key], timeout=60).values()
    assert again is not None and again.generation == 1
    assert [h.state for h in again.history][-3:] == ["REVOKED", "CLAIMED", "DONE"]
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="replay acked", timeout=60)
    stats = fenceless.stats()
    assert stats["executions"] == {handle.key: 1, idempotency_key(handle.key, 1): 1}
    assert stats["total"] == 2


def test_a_campaign_resubmitted_after_a_revoke_sends_the_next_generation(
    fenceless: LocalStack,
) -> None:
    fenceless.start_workers(processes=1, threads=2)
    recipients = ["ana@example.com", "bo@example.com"]
    args = {"subject": "hello", "body": "hi"}
    assert submit_campaign("camp-rv", "send_email", recipients, args).sent == 2
    ledger = runtime.ledger()
    keys = [get_tool("send_email").derive("camp-rv", {"recipient": r}).key for r in recipients]
    wait_states(ledger, keys, timeout=60)
    verbs.revoke(keys[0], actor="sre", reason="sent to the wrong list")
    # Submitted after the revoke: the fan-out's message carries generation 1 and runs.
    report = submit_campaign("camp-rv", "send_email", recipients, args)
    assert (report.sent, report.skipped) == (1, {"done": 1})
    records = wait_states(ledger, keys, timeout=60)
    assert [r.generation for r in records.values() if r is not None] == [1, 0]
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="fan-out acked", timeout=60)
    stats = fenceless.stats()
    assert stats["executions"] == {keys[0]: 1, idempotency_key(keys[0], 1): 1, keys[1]: 1}


def test_a_replay_whose_stored_request_no_longer_derives_its_key_is_refused(
    live: LocalStack,
) -> None:
    tool = get_tool("charge")
    # A record written under a declaration that has since changed: its stored request now
    # derives another key. Replaying it would run a fresh effect nobody approved. (A FAILED
    # record: it keeps its request; a DONE one drops it, test_replay_call.py.)
    real = tool.derive("order-moved", ARGS)
    other = tool.derive("order-elsewhere", ARGS)
    stored = dataclasses.replace(real, key=other.key)
    ledger = runtime.ledger()
    claim = ledger.claim(stored, lease_s=30, holder="test")
    ledger.fail(other.key, claim.token, reason="declined", retention_s=3600)
    with pytest.raises(OperatorError, match="no longer derives this key"):
        verbs.replay(other.key, actor="sre", reason="charge again")
    assert ledger.audit_log()[0]["outcome"].startswith("refused: replay refused")
    assert broker_messages(live) == DRAINED
