"""The ledger's state table (DESIGN §2), transition by transition, on real redis-server
processes: the machine's own Redis 7 and the embedded Redis 6.2."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import redis

from dedupe import (
    ClaimOutcome,
    Effect,
    Ledger,
    RecordTooLargeError,
    State,
    TransitionRefusedError,
    VolatileLedgerError,
)
from tests.support.cluster import LocalCluster
from tests.support.ledgers import RETENTION_S, charge, fresh_ledger, poll
from workers.dev.redis_server import RedisServer

RECEIPT = {"id": "eff_1", "status": "charged"}


@pytest.fixture
def ledger(ledger_server: RedisServer | LocalCluster) -> Ledger:
    return fresh_ledger(ledger_server.url)


def claimed(ledger: Ledger, effect: Effect, lease_s: float = 30.0) -> int:
    result = ledger.claim(effect, lease_s=lease_s, holder="test/1")
    assert result.outcome is ClaimOutcome.ACQUIRED, result
    return result.token


def expired(ledger: Ledger, effect: Effect) -> int:
    """A CLAIMED record whose lease has run out (waited for on the server's clock)."""
    token = claimed(ledger, effect, lease_s=0.05)
    poll(lambda: ledger.claim(effect, lease_s=1, holder="probe"), lambda c: c.outcome == "blocked")
    return token


def reconciling(ledger: Ledger, effect: Effect, lease_s: float = 30.0) -> int:
    expired(ledger, effect)
    takeover = ledger.takeover(effect.key, lease_s=lease_s, holder="reconciler/1")
    assert takeover is not None
    return takeover.token


def done(ledger: Ledger, effect: Effect) -> int:
    token = claimed(ledger, effect)
    assert ledger.commit(effect.key, token, RECEIPT, retention_s=RETENTION_S).ok
    return token


def unknown(ledger: Ledger, effect: Effect) -> int:
    token = reconciling(ledger, effect)
    assert ledger.mark_unknown(effect.key, token, reason="lookup unavailable").ok
    return token


def state(ledger: Ledger, effect: Effect) -> State:
    record = ledger.get(effect.key)
    assert record is not None
    return record.state


# -- no record ------------------------------------------------------------------------------


def test_first_claim_is_acquired_with_token_one(ledger: Ledger) -> None:
    effect = charge()
    result = ledger.claim(effect, lease_s=30, holder="w/1")
    assert (result.outcome, result.token, result.generation) == ("acquired", 1, 0)
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.CLAIMED
    assert record.holder == "w/1" and record.request == {
        "scope": effect.scope,
        "action": effect.action,
        "args": dict(effect.args),
    }


def test_writes_to_a_missing_record_are_fenced(ledger: Ledger) -> None:
    key = charge().key
    assert ledger.heartbeat(key, 1, lease_s=1).fenced
    assert ledger.commit(key, 1, RECEIPT, retention_s=RETENTION_S).fenced
    assert ledger.get(key) is None


# -- CLAIMED ------------------------------------------------------------------------------


def test_claimed_with_live_lease_answers_in_flight(ledger: Ledger) -> None:
    effect = charge()
    claimed(ledger, effect)
    assert ledger.claim(effect, lease_s=30, holder="w/2").outcome is ClaimOutcome.IN_FLIGHT


def test_claimed_with_other_bound_fields_answers_conflict(ledger: Ledger) -> None:
    effect = charge("order-1")
    claimed(ledger, effect)
    other = charge("order-1", amount="99.00")
    assert ledger.claim(other, lease_s=30, holder="w/2").outcome is ClaimOutcome.CONFLICT


def test_claimed_heartbeat_extends_the_lease(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect, lease_s=1)
    before = ledger.get(effect.key)
    assert ledger.heartbeat(effect.key, token, lease_s=60).ok
    after = ledger.get(effect.key)
    assert before and after and after.lease_deadline_ms > before.lease_deadline_ms  # type: ignore[operator]


def test_claimed_commit_makes_done_with_receipt_and_retention(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    assert ledger.commit(effect.key, token, RECEIPT, raw='{"id": "eff_1"}', retention_s=3600).ok
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.DONE
    assert record.receipt == RECEIPT and record.raw_response == '{"id": "eff_1"}'
    assert record.ttl_ms is not None and 3_500_000 < record.ttl_ms <= 3_600_000
    assert record.lease_deadline_ms is None and record.holder is None


def test_a_raw_response_that_is_the_receipt_is_stored_once(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    raw = '{"status": "charged", "id": "eff_1"}'  # as the provider sent it: unsorted, spaced
    assert ledger.commit(effect.key, token, RECEIPT, raw=raw, retention_s=60).ok
    record = ledger.get(effect.key)
    assert record is not None and record.receipt == RECEIPT and record.raw_response == raw
    copies = ledger.client.eval(
        "return select(2, string.gsub(redis.call('GET', KEYS[1]), 'eff_1', ''))",
        1,
        ledger._keys(effect.key)[0],
    )
    assert copies == 1  # one copy, not receipt + raw


def test_claimed_fail_makes_failed_and_frees_the_key(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    assert ledger.fail(effect.key, token, reason="card declined", retention_s=3600).ok
    assert state(ledger, effect) is State.FAILED
    again = ledger.claim(effect, lease_s=30, holder="w/2")
    assert (again.outcome, again.token, again.generation) == ("acquired", token + 1, 0)


def test_claimed_handover_expires_the_lease_at_once(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    assert ledger.handover(effect.key, token, reason="timeout after send").ok
    assert ledger.claim(effect, lease_s=30, holder="w/2").outcome is ClaimOutcome.BLOCKED
    bucket = ledger.bucket_of(effect.key)
    assert effect.key in ledger.expired([bucket])
    assert ledger.takeover(effect.key, lease_s=30, holder="r/1") is not None


def test_claimed_with_live_lease_cannot_be_taken_over(ledger: Ledger) -> None:
    effect = charge()
    claimed(ledger, effect)
    assert ledger.takeover(effect.key, lease_s=30, holder="r/1") is None
    assert state(ledger, effect) is State.CLAIMED


def test_claimed_cannot_be_marked_unknown_or_operated(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    assert ledger.mark_unknown(effect.key, token, reason="x").fenced
    for action in ("resolve_done", "resolve_failed", "revoke", "supersede"):
        with pytest.raises(TransitionRefusedError, match="effect is CLAIMED"):
            ledger.operate(effect.key, action, note="op", retention_s=60, receipt=RECEIPT)


def test_claimed_writes_under_a_wrong_token_are_fenced(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    assert ledger.heartbeat(effect.key, token + 1, lease_s=1).fenced
    assert ledger.fail(effect.key, token - 1, reason="x", retention_s=60).fenced
    assert ledger.handover(effect.key, token + 5, reason="x").fenced
    assert state(ledger, effect) is State.CLAIMED


# -- CLAIMED, lease expired -------------------------------------------------------------------


def test_expired_claim_is_blocked_never_acquired(ledger: Ledger) -> None:
    effect = charge()
    expired(ledger, effect)
    for _ in range(5):
        assert ledger.claim(effect, lease_s=30, holder="w/2").outcome is ClaimOutcome.BLOCKED
    assert state(ledger, effect) is State.CLAIMED


def test_expired_claim_taken_over_becomes_reconciling_under_a_new_token(ledger: Ledger) -> None:
    effect = charge()
    old = expired(ledger, effect)
    takeover = ledger.takeover(effect.key, lease_s=30, holder="r/1")
    assert takeover is not None and takeover.token == old + 1
    assert takeover.request == {
        "scope": effect.scope,
        "action": effect.action,
        "args": dict(effect.args),
    }
    assert state(ledger, effect) is State.RECONCILING


def test_live_holder_may_heartbeat_an_expired_claim_not_yet_taken_over(ledger: Ledger) -> None:
    effect = charge()
    token = expired(ledger, effect)
    assert ledger.heartbeat(effect.key, token, lease_s=30).ok
    assert ledger.claim(effect, lease_s=30, holder="w/2").outcome is ClaimOutcome.IN_FLIGHT


# -- RECONCILING ----------------------------------------------------------------------------


def test_reconciling_answers_in_flight(ledger: Ledger) -> None:
    effect = charge()
    reconciling(ledger, effect)
    assert ledger.claim(effect, lease_s=30, holder="w/2").outcome is ClaimOutcome.IN_FLIGHT


def test_stale_holder_commit_is_fenced_and_kept_as_late_receipt(ledger: Ledger) -> None:
    effect = charge()
    old = claimed(ledger, effect, lease_s=0.05)
    poll(lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), lambda t: t is not None)
    assert ledger.heartbeat(effect.key, old, lease_s=30).fenced
    late = {"id": "eff_late", "status": "charged"}
    assert ledger.commit(effect.key, old, late, retention_s=RETENTION_S).fenced
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.RECONCILING
    assert [r["receipt"] for r in record.late_receipts] == [late]
    assert record.late_receipts[0]["token"] == old
    assert ledger.counts()[("fenced", "commit")] == 1


def test_reconciler_commit_makes_done(ledger: Ledger) -> None:
    effect = charge()
    token = reconciling(ledger, effect)
    assert ledger.commit(effect.key, token, RECEIPT, retention_s=60, note="found").ok
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.DONE and record.reason == "found"


def test_reconciler_fail_makes_failed(ledger: Ledger) -> None:
    effect = charge()
    token = reconciling(ledger, effect)
    assert ledger.fail(effect.key, token, reason="not found after settle", retention_s=60).ok
    assert state(ledger, effect) is State.FAILED


def test_reconciler_defers_by_heartbeat_and_others_cannot_take_over(ledger: Ledger) -> None:
    effect = charge()
    token = reconciling(ledger, effect, lease_s=0.05)
    assert ledger.heartbeat(effect.key, token, lease_s=30).ok
    assert ledger.takeover(effect.key, lease_s=30, holder="r/2") is None


def test_dead_reconcilers_claim_is_taken_over_again(ledger: Ledger) -> None:
    effect = charge()
    token = reconciling(ledger, effect, lease_s=0.05)
    second = poll(
        lambda: ledger.takeover(effect.key, lease_s=30, holder="r/2"), lambda t: t is not None
    )
    assert second is not None and second.token == token + 1
    assert ledger.mark_unknown(effect.key, token, reason="late").fenced


def test_reconciling_to_unknown(ledger: Ledger) -> None:
    effect = charge()
    token = reconciling(ledger, effect)
    assert ledger.mark_unknown(effect.key, token, reason="no lookup").ok
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.UNKNOWN and record.reason == "no lookup"
    assert record.ttl_ms is None


# -- DONE ---------------------------------------------------------------------------------


def test_done_answers_duplicate_with_the_stored_receipt(ledger: Ledger) -> None:
    effect = charge()
    done(ledger, effect)
    result = ledger.claim(effect, lease_s=30, holder="w/2")
    assert result.outcome is ClaimOutcome.DUPLICATE and result.receipt == RECEIPT


def test_done_with_other_bound_fields_answers_conflict(ledger: Ledger) -> None:
    effect = charge("order-5")
    done(ledger, effect)
    other = charge("order-5", amount="11.00")
    assert ledger.claim(other, lease_s=30, holder="w/2").outcome is ClaimOutcome.CONFLICT


def test_done_commit_retry_is_idempotent_and_other_writes_fenced(ledger: Ledger) -> None:
    effect = charge()
    token = done(ledger, effect)
    assert ledger.commit(effect.key, token, RECEIPT, retention_s=60).ok
    assert ledger.fail(effect.key, token, reason="x", retention_s=60).fenced
    assert ledger.heartbeat(effect.key, token, lease_s=1).fenced
    assert ledger.handover(effect.key, token, reason="x").fenced
    assert ledger.takeover(effect.key, lease_s=1, holder="r") is None
    with pytest.raises(TransitionRefusedError, match="effect is DONE"):
        ledger.operate(effect.key, "resolve_done", note="x", retention_s=60, receipt=RECEIPT)
    assert state(ledger, effect) is State.DONE


@pytest.mark.parametrize(("action", "end"), [("revoke", "REVOKED"), ("supersede", "SUPERSEDED")])
def test_done_revoked_or_superseded_opens_the_next_generation(
    ledger: Ledger, action: str, end: str
) -> None:
    effect = charge()
    token = done(ledger, effect)
    write = ledger.operate(effect.key, action, note="actor=ops reason=refund", retention_s=60)
    assert write.ok and write.state == end and write.token == token + 1
    submitted = ledger.submit(effect, message_id="m-2", pending_s=60)  # made after the revoke
    again = ledger.claim(effect, lease_s=30, holder="w/2", generation=submitted.generation)
    assert (again.outcome, again.generation, again.token) == ("acquired", 1, token + 2)
    assert again.idempotency_key != effect.key
    record = ledger.get(effect.key)
    assert record is not None
    assert [h.state for h in record.history] == ["CLAIMED", "DONE", end, "CLAIMED"]


def test_token_sequence_strictly_increases_across_generations(ledger: Ledger) -> None:
    effect = charge()
    for _ in range(3):
        token = claimed(ledger, effect)
        assert ledger.fail(effect.key, token, reason="declined", retention_s=60).ok
    token = done(ledger, effect)
    ledger.operate(effect.key, "revoke", note="r", retention_s=60)
    replay = ledger.submit(effect, message_id="m-replay", pending_s=60)
    claim = ledger.claim(effect, lease_s=30, holder="w/2", generation=replay.generation)
    assert ledger.commit(effect.key, claim.token, RECEIPT, retention_s=RETENTION_S).ok
    token = claim.token
    record = ledger.get(effect.key)
    assert record is not None and record.generation == 1
    tokens = [h.token for h in record.history]  # a DONE record keeps its last 4 steps
    assert tokens == sorted(tokens) and set(tokens) == set(range(tokens[0], token + 1))
    assert len(record.history) == 4 and record.attempts == 5
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(tokens))


# -- FAILED -------------------------------------------------------------------------------


def test_failed_does_not_hold_the_key_even_for_other_bound_fields(ledger: Ledger) -> None:
    effect = charge("order-7")
    token = claimed(ledger, effect)
    ledger.fail(effect.key, token, reason="declined", retention_s=60)
    changed = charge("order-7", amount="5.00")
    result = ledger.claim(changed, lease_s=30, holder="w/2")
    assert result.outcome is ClaimOutcome.ACQUIRED and result.generation == 0
    record = ledger.get(effect.key)
    assert record is not None and record.fingerprint == changed.fingerprint
    assert record.ttl_ms is None  # back in CLAIMED: never expires


# -- UNKNOWN ------------------------------------------------------------------------------


def test_unknown_blocks_every_claim(ledger: Ledger) -> None:
    effect = charge("order-8")
    unknown(ledger, effect)
    assert ledger.claim(effect, lease_s=30, holder="w/2").outcome is ClaimOutcome.BLOCKED
    other = charge("order-8", amount="1.00")
    assert ledger.claim(other, lease_s=30, holder="w/2").outcome is ClaimOutcome.CONFLICT
    with pytest.raises(TransitionRefusedError, match="effect is UNKNOWN"):
        ledger.operate(effect.key, "revoke", note="x", retention_s=60)


def test_unknown_resolved_as_executed_becomes_done_with_the_evidence(ledger: Ledger) -> None:
    effect = charge()
    token = unknown(ledger, effect)
    evidence = {"id": "eff_found_by_hand"}
    write = ledger.operate(
        effect.key, "resolve_done", note="actor=sre reason=dashboard", retention_s=60,
        receipt=evidence,
    )  # fmt: skip
    assert write.ok and write.token == token + 1
    assert ledger.claim(effect, lease_s=30, holder="w").receipt == evidence
    assert ledger.commit(effect.key, token, RECEIPT, retention_s=60).fenced


def test_unknown_resolved_as_not_executed_frees_the_key(ledger: Ledger) -> None:
    effect = charge()
    unknown(ledger, effect)
    ledger.operate(effect.key, "resolve_failed", note="actor=sre reason=bank", retention_s=60)
    assert state(ledger, effect) is State.FAILED
    assert ledger.claim(effect, lease_s=30, holder="w").outcome is ClaimOutcome.ACQUIRED


# -- bookkeeping, bounds, durability ------------------------------------------------------


def test_counts_follow_the_never_expiring_states(ledger: Ledger) -> None:
    a, b, c = charge(), charge(), charge()
    claimed(ledger, a)
    reconciling(ledger, b)
    unknown(ledger, c)
    counts = ledger.counts()
    assert counts[("CLAIMED", "charge")] == 1
    assert counts[("RECONCILING", "charge")] == 1
    assert counts[("UNKNOWN", "charge")] == 1


def test_lease_index_holds_only_live_claims(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    bucket = ledger.bucket_of(effect.key)
    leases = ledger.client.zrange(f"{{{ledger.namespace}:{bucket}}}:leases", 0, -1)
    assert leases == [effect.key]
    ledger.commit(effect.key, token, RECEIPT, retention_s=60)
    assert ledger.client.zcard(f"{{{ledger.namespace}:{bucket}}}:leases") == 0


def test_oversized_receipt_is_refused_not_truncated(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    with pytest.raises(RecordTooLargeError, match=r"receipt is .* bytes, over the 16384"):
        ledger.commit(effect.key, token, {"blob": "x" * 20_000}, retention_s=60)
    with pytest.raises(RecordTooLargeError, match="raw response"):
        ledger.commit(effect.key, token, RECEIPT, raw="y" * 70_000, retention_s=60)
    assert state(ledger, effect) is State.CLAIMED


def test_script_cache_flush_is_harmless(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    ledger.client.script_flush()
    assert ledger.commit(effect.key, token, RECEIPT, retention_s=60).ok


def test_keys_of_one_effect_share_one_hash_slot(ledger: Ledger) -> None:
    from redis.crc import key_slot

    keys = ledger._keys(charge().key)
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_ledger_refuses_redis_without_aof(
    redis_binary: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The environment is the settings' business (workers), never read by the ledger itself.
    monkeypatch.setenv("EFFECTQ_ALLOW_VOLATILE_LEDGER", "true")
    with RedisServer(redis_binary, tmp_path, aof=False) as volatile:
        with pytest.raises(VolatileLedgerError, match="no AOF persistence"):
            Ledger.from_url(volatile.url)
        Ledger.from_url(volatile.url, allow_volatile=True)


def test_ledger_is_unavailable_not_permissive_when_redis_is_gone(
    redis_binary: str, tmp_path: Path
) -> None:
    from dedupe import LedgerUnavailableError

    with RedisServer(redis_binary, tmp_path) as srv:
        ledger = Ledger(srv.client(decode_responses=True))
    with pytest.raises(LedgerUnavailableError):
        ledger.claim(charge(), lease_s=30, holder="w")


def test_namespace_is_validated() -> None:
    with pytest.raises(ValueError, match="namespace"):
        Ledger(redis.Redis(), namespace="a{b}", allow_volatile=True)
    # It prefixes every key: bounded, and refused without echoing it (ledger adopt takes it
    # from a command line).
    with pytest.raises(ValueError, match="namespace must be 1 to 64") as refused:
        Ledger(redis.Redis(), namespace="n" * 65, allow_volatile=True)
    assert "nnnn" not in str(refused.value)
    Ledger(redis.Redis(decode_responses=True), namespace="n" * 64, allow_volatile=True)


# -- generations: only a submission made after a revoke opens n+1 (issue 15, item 1) ------


@pytest.mark.parametrize(("action", "end"), [("revoke", "REVOKED"), ("supersede", "SUPERSEDED")])
def test_a_message_queued_before_a_revoke_never_opens_a_new_generation(
    ledger: Ledger, action: str, end: str
) -> None:
    effect = charge()
    submitted = ledger.submit(effect, message_id="m-1", pending_s=60)
    assert (submitted.status, submitted.generation) == ("enqueue", 0)
    token = done(ledger, effect)  # the message, submitted for generation 0, ran
    ledger.operate(effect.key, action, note="actor=ops reason=refunded", retention_s=60)
    # The same message again (a redelivery after a kill at after_commit, or a second copy
    # queued before the revoke): it was submitted for generation 0, which is voided.
    old = ledger.claim(effect, lease_s=30, holder="w/2", generation=submitted.generation)
    assert old.outcome is ClaimOutcome.DUPLICATE and old.state == end
    assert (old.token, old.generation, old.receipt) == (token + 1, 0, RECEIPT)
    record = ledger.get(effect.key)
    assert record is not None and record.state == end and record.generation == 0
    assert [(h.state, h.token) for h in record.history] == [
        ("CLAIMED", 1), ("DONE", 1), (end, 2),
    ]  # fmt: skip
    assert ledger.counts()[("dup_claim", "charge")] == 1


def test_a_submission_after_a_revoke_opens_the_next_generation_once(ledger: Ledger) -> None:
    effect = charge()
    done(ledger, effect)
    ledger.operate(effect.key, "revoke", note="actor=ops reason=bounced", retention_s=60)
    replay = ledger.submit(effect, message_id="m-2", pending_s=60)
    assert (replay.status, replay.state, replay.generation) == ("enqueue", "REVOKED", 1)
    claim = ledger.claim(effect, lease_s=30, holder="w/2", generation=replay.generation)
    assert (claim.outcome, claim.generation, claim.token) == ("acquired", 1, 3)
    assert ledger.submit(effect, message_id="m-3", pending_s=60).generation == 1  # CLAIMED g1
    assert ledger.commit(effect.key, claim.token, RECEIPT, retention_s=60).ok
    ledger.operate(effect.key, "revoke", note="actor=ops reason=again", retention_s=60)
    # The replay's message delivered twice: its second copy is of the voided generation 1.
    again = ledger.claim(effect, lease_s=30, holder="w/3", generation=replay.generation)
    assert again.outcome is ClaimOutcome.DUPLICATE and again.generation == 1
    assert ledger.submit(effect, message_id="m-4", pending_s=60).generation == 2


# -- tokens grow across the expiry of a settled record (issue 15, item 5) -----------------


def test_tokens_keep_growing_after_a_settled_record_expires(ledger: Ledger) -> None:
    effect = charge()
    stale = claimed(ledger, effect, lease_s=0.05)  # this holder pauses past its lease
    takeover = poll(
        lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), lambda t: t is not None
    )
    assert takeover is not None
    assert ledger.fail(effect.key, takeover.token, reason="not found", retention_s=0.2).ok
    poll(lambda: ledger.get(effect.key), lambda r: r is None)  # the FAILED record expired
    live = ledger.claim(effect, lease_s=30, holder="w/2")
    assert live.acquired and live.token > takeover.token > stale
    # The stale holder wakes up: its commit must not pass for the live holder's.
    assert ledger.commit(effect.key, stale, {"id": "stale"}, retention_s=60).fenced
    assert ledger.heartbeat(effect.key, stale, lease_s=30).fenced
    assert ledger.commit(effect.key, live.token, RECEIPT, retention_s=60).ok
    record = ledger.get(effect.key)
    assert record is not None and record.receipt == RECEIPT and record.token == live.token


def test_the_first_token_of_a_fresh_namespace_is_one(ledger: Ledger) -> None:
    a, b = charge(), charge()
    assert claimed(ledger, a) == 1
    assert claimed(ledger, b) == 1


# -- a late receipt on FAILED is evidence that blocks (issue 15, item 9) -------------------


def test_a_late_receipt_on_a_failed_record_blocks_the_next_claim(ledger: Ledger) -> None:
    effect = charge()
    stale = claimed(ledger, effect, lease_s=0.05)
    takeover = poll(
        lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), lambda t: t is not None
    )
    assert takeover is not None
    assert ledger.fail(effect.key, takeover.token, reason="not found", retention_s=60).ok
    late = {"id": "eff_late", "status": "charged"}
    write = ledger.commit(effect.key, stale, late, retention_s=60)
    assert write.fenced and (write.state, write.token) == ("UNKNOWN", takeover.token + 1)
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.UNKNOWN and record.ttl_ms is None
    assert record.reason == "late receipt after FAILED"
    assert [r["receipt"] for r in record.late_receipts] == [late]
    assert effect.key in ledger.keys_in(State.UNKNOWN)
    assert ledger.claim(effect, lease_s=30, holder="w/2").outcome is ClaimOutcome.BLOCKED
    assert ledger.submit(effect, message_id="m", pending_s=60).status == "blocked"


def test_resolve_not_executed_is_refused_by_the_ledger_against_late_receipts(
    ledger: Ledger,
) -> None:
    effect = charge()
    stale = claimed(ledger, effect, lease_s=0.05)
    takeover = poll(
        lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), lambda t: t is not None
    )
    assert takeover is not None
    assert ledger.commit(effect.key, stale, {"id": "late"}, retention_s=60).fenced
    assert ledger.mark_unknown(effect.key, takeover.token, reason="lookup down").ok
    with pytest.raises(TransitionRefusedError) as refused:
        ledger.operate(effect.key, "resolve_failed", note="n", retention_s=60)
    assert refused.value.details["evidence"] == 1 and refused.value.state == "UNKNOWN"
    assert state(ledger, effect) is State.UNKNOWN
    write = ledger.operate(
        effect.key, "resolve_failed", note="n", retention_s=60, override_evidence=True
    )
    assert write.ok and write.state == "FAILED"


# -- the request bound is enforced at submit too (issue 15, item 10) ----------------------


def test_submit_refuses_an_oversized_request_before_writing_anything(ledger: Ledger) -> None:
    from dedupe import ToolSpec, derive

    ledger = Ledger(ledger.client, namespace=ledger.namespace, max_request_bytes=1024)
    spec = ToolSpec(name="mail", identity=("to",), bound=("to",), free=("body",))
    small = derive(spec, "evt-1", {"to": "a@example.com", "body": "hi"})
    big = derive(spec, "evt-2", {"to": "b@example.com", "body": "x" * 2000})
    with pytest.raises(RecordTooLargeError, match=r"request is \d+ bytes, over the 1024"):
        ledger.submit(big, message_id="m-big", pending_s=60)
    with pytest.raises(RecordTooLargeError):
        ledger.submit_many([(small, "m-small"), (big, "m-big")], pending_s=60)
    for effect in (small, big):
        assert ledger.client.exists(ledger._keys(effect.key)[3]) == 0  # no pending marker
    assert ledger.submit(small, message_id="m-small", pending_s=60).status == "enqueue"


def test_a_long_note_is_cut_so_the_packed_record_stays_readable(ledger: Ledger) -> None:
    effect = charge()
    token = claimed(ledger, effect)
    note = "reconciled: " + "é" * 70_000  # over the 2-byte length a history step carries
    assert ledger.commit(effect.key, token, RECEIPT, retention_s=60, note=note).ok
    record = ledger.get(effect.key)
    assert record is not None and record.reason == note[:500]


def test_text_bounds_over_the_records_3_byte_lengths_are_refused(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="16 MiB"):
        Ledger(ledger.client, namespace=ledger.namespace, max_receipt_bytes=2**24)


def test_a_late_confirm_never_turns_a_later_reservation_into_a_pending_answer(
    ledger: Ledger,
) -> None:
    """A producer's confirm may land long after its message ran: here after the effect was
    done, revoked, and submitted again by a producer that died before its enqueue. The
    confirm is of the first message only; the later reservation still stands for no
    message, so the next submission is enqueued (it answered "pending" for a message that
    had run, until the marker lapsed)."""
    effect = charge()
    assert ledger.submit(effect, message_id="m-1", pending_s=60).status == "enqueue"
    done(ledger, effect)  # m-1 ran; its commit cleared the marker
    ledger.operate(effect.key, "revoke", note="actor=ops reason=refund", retention_s=60)
    assert ledger.submit(effect, message_id="m-2", pending_s=60).status == "enqueue"
    ledger.confirm_pending([(effect, "m-1")], 3600)  # m-1's producer, late
    assert ledger.submit(effect, message_id="m-3", pending_s=60).status == "enqueue"
    ledger.confirm_pending([(effect, "m-3")], 3600)  # the broker took m-3
    ledger.confirm_pending([(effect, "m-3")], 3600)  # a confirm may be sent twice
    assert ledger.submit(effect, message_id="m-4", pending_s=60).status == "pending"


# -- the generation rule holds in every state (issue 37, item 1) ---------------------------


def _generation_one(ledger: Ledger, reach: str) -> tuple[Effect, Effect, int]:
    """generation 0 charged 10.00 and revoked; generation 1 (12.00, submitted after the
    revoke) brought to ``reach``. Returns (the old message's effect, the new one's, the
    old message's generation)."""
    old = charge(amount="10.00")
    new = charge(scope=old.scope, amount="12.00")
    first = ledger.submit(old, message_id="m-0", pending_s=60)
    done(ledger, old)
    ledger.operate(old.key, "revoke", note="actor=ops reason=refunded", retention_s=60)
    again = ledger.submit(new, message_id="m-1", pending_s=60)
    assert (again.status, again.generation) == ("enqueue", 1)
    lease = 0.05 if reach in ("expired", "RECONCILING", "UNKNOWN", "reconciler FAILED") else 30
    claim = ledger.claim(new, lease_s=lease, holder="w/1", generation=again.generation)
    assert claim.acquired and claim.generation == 1
    if reach == "FAILED":  # its first attempt got a 503
        assert ledger.fail(new.key, claim.token, reason="503", retention_s=60).ok
    elif reach == "DONE":
        assert ledger.commit(new.key, claim.token, RECEIPT, retention_s=60).ok
    elif reach in ("expired", "RECONCILING", "UNKNOWN", "reconciler FAILED", "resolved FAILED"):
        if reach == "resolved FAILED":
            assert ledger.handover(new.key, claim.token, reason="timeout").ok
        poll(lambda: ledger.claim(new, lease_s=1, holder="probe", generation=1),
             lambda c: c.outcome == "blocked")  # fmt: skip
        if reach != "expired":
            took = ledger.takeover(new.key, lease_s=30, holder="r/1")
            assert took is not None
            if reach in ("UNKNOWN", "resolved FAILED"):
                assert ledger.mark_unknown(new.key, took.token, reason="lookup down").ok
            if reach == "resolved FAILED":
                ledger.operate(new.key, "resolve_failed", note="actor=a reason=r", retention_s=60)
            if reach == "reconciler FAILED":
                assert ledger.fail(new.key, took.token, reason="not found", retention_s=60).ok
    return old, new, first.generation


@pytest.mark.parametrize(
    "reach",
    ["FAILED", "reconciler FAILED", "resolved FAILED", "CLAIMED", "expired", "RECONCILING",
     "UNKNOWN", "DONE"],
)  # fmt: skip
def test_a_message_of_an_older_generation_never_claims_nor_rewrites_the_record(
    ledger: Ledger, reach: str
) -> None:
    old, new, generation = _generation_one(ledger, reach)
    before = ledger.get(new.key)
    assert before is not None and before.generation == 1
    # The generation-0 message comes again (a redelivery after a kill at after_commit, a
    # campaign's second copy, a lost batched ack), now that generation 1 is in `reach`.
    stale = ledger.claim(old, lease_s=30, holder="w/old", generation=generation)
    assert stale.outcome is ClaimOutcome.DUPLICATE, stale
    assert stale.generation == 0 and stale.receipt is None
    after = ledger.get(new.key)
    assert after is not None
    assert (after.state, after.token, after.generation, after.fingerprint, after.request) == (
        before.state, before.token, 1, new.fingerprint, before.request,
    )  # fmt: skip
    if reach == "DONE":  # a DONE record keeps no request: its fingerprint (above) is new's
        assert after.request is None
    else:
        assert after.request is not None and after.request["args"]["amount"] == "12.00"
    assert len(after.history) == len(before.history)


def test_a_failed_record_accepts_a_claim_of_its_own_generation_with_new_values(
    ledger: Ledger,
) -> None:
    """FAILED (known not executed) frees the key for its own generation: the customer may
    correct the amount; the provider sees the same idempotency key for that generation."""
    _old, new, _ = _generation_one(ledger, "FAILED")
    corrected = charge(scope=new.scope, amount="13.00")
    ledger.clear_pending(new.key)  # the 12.00 message gave up (a live one is a conflict)
    submitted = ledger.submit(corrected, message_id="m-2", pending_s=60)
    assert (submitted.status, submitted.generation) == ("enqueue", 1)
    claim = ledger.claim(corrected, lease_s=30, holder="w/2", generation=1)
    assert claim.acquired and claim.generation == 1
    record = ledger.get(new.key)
    assert record is not None and record.fingerprint == corrected.fingerprint


# -- a message's age is judged on the ledger's clock (issue 37, item 4) -------------------


def test_a_message_older_than_the_window_by_the_ledger_clock_is_stale_where_it_would_run(
    ledger: Ledger,
) -> None:
    fresh, failed, settled = charge(), charge(), charge()
    submitted = ledger.submit(fresh, message_id="m-1", pending_s=60)
    now = submitted.submitted_ms
    assert abs(now - ledger.server_time_ms()) < 5_000
    day = 86_400.0
    old = now - 2 * 86_400_000
    # no record: it would run — stale, and nothing is written
    claim = ledger.claim(fresh, lease_s=30, holder="w", submitted_ms=old, window_s=day)
    assert claim.outcome is ClaimOutcome.STALE and claim.state is None
    assert claim.age_ms is not None and claim.age_ms >= 2 * 86_400_000
    assert ledger.get(fresh.key) is None
    # inside the window by the ledger's clock: runs, whatever any producer's clock said
    assert ledger.claim(fresh, lease_s=30, holder="w", submitted_ms=now, window_s=day).acquired
    # FAILED: it would run again — stale, record unchanged
    token = claimed(ledger, failed)
    assert ledger.fail(failed.key, token, reason="503", retention_s=60).ok
    claim = ledger.claim(failed, lease_s=30, holder="w", submitted_ms=old, window_s=day)
    assert (claim.outcome, claim.state, claim.token) == ("stale", State.FAILED, token)
    assert state(ledger, failed) is State.FAILED
    # DONE: still a duplicate (it ran; the receipt answers); no stamp (0): not judged
    done(ledger, settled)
    dup = ledger.claim(settled, lease_s=30, holder="w", submitted_ms=old, window_s=day)
    assert dup.outcome is ClaimOutcome.DUPLICATE and dup.receipt == RECEIPT
    again = ledger.claim(failed, lease_s=30, holder="w", submitted_ms=0, window_s=day)
    assert again.acquired


def test_a_claim_on_an_expired_voided_record_answers_the_messages_generation(
    ledger: Ledger,
) -> None:
    """The revoked record's retention ran out before the resubmission's message ran: the
    fresh record takes the message's generation, and the claim must answer it — the worker
    derives the provider's idempotency key from it (generation 0's key would be answered
    with the refunded charge's saved receipt, and the resubmission never run)."""
    effect = charge()
    done(ledger, effect)
    ledger.operate(effect.key, "revoke", note="actor=ops reason=refunded", retention_s=0.2)
    again = ledger.submit(effect, message_id="m-2", pending_s=60)
    assert again.generation == 1
    poll(lambda: ledger.get(effect.key), lambda r: r is None)  # the REVOKED record expired
    claim = ledger.claim(effect, lease_s=30, holder="w/2", generation=again.generation)
    assert claim.acquired and claim.generation == 1
    assert claim.idempotency_key != effect.key
    record = ledger.get(effect.key)
    assert record is not None and record.generation == 1
