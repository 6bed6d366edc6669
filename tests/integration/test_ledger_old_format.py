"""Records written by the JSON format (before the struct-packed one) are read, claimed,
reconciled and operated on by today's ledger: a ledger in production is not emptied for an
upgrade. ``ledger_json_format.lua`` is the old script, frozen: it writes the old records
(old argument list: the fingerprint in hex), today's ``Ledger`` drives them through every
path, on both Redis binaries, single and cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dedupe import ClaimOutcome, Effect, Ledger, State, TransitionRefusedError
from dedupe.keys import KeySpace
from reconciler.operator import Operator
from tests.support.cluster import LocalCluster
from tests.support.ledgers import RETENTION_S, charge, fresh_ledger, poll
from workers.dev.redis_server import RedisServer

OLD_SCRIPT = (Path(__file__).parent / "ledger_json_format.lua").read_text(encoding="utf-8")
RECEIPT = {"id": "eff_old", "status": "charged"}
NEW_RECEIPT = {"id": "eff_new", "status": "charged"}


class OldWriter:
    """The old script on the ledger's keys, called with the old argument lists."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.script = ledger.client.register_script(OLD_SCRIPT)
        # It knew hex record names only.
        self.keyspace = KeySpace(ledger.namespace, ledger.buckets)

    def call(self, op: str, key: str, *args: Any) -> list[Any]:
        keys = self.keyspace.script_keys(key)[:7]
        return list(self.script(keys=keys, args=[op, key, *args]))

    def claim(self, effect: Effect, lease_s: float = 30.0, campaign: str = "") -> int:
        request = self.ledger.request_text(effect)
        ms = int(lease_s * 1000)
        reply = self.call(
            "claim", effect.key, effect.fingerprint, effect.tool, ms, "old/1", request,
            campaign, 0,
        )  # fmt: skip
        assert reply[0] == "acquired", reply
        return int(reply[1])

    def commit(self, key: str, token: int, receipt: dict[str, Any], retention_s: float) -> None:
        text = json.dumps(receipt, separators=(",", ":"), sort_keys=True)
        reply = self.call("commit", key, token, text, "", int(retention_s * 1000), "commit")
        assert reply[0] == "ok", reply

    def fail(self, key: str, token: int) -> None:
        assert self.call("fail", key, token, "declined", int(RETENTION_S * 1000))[0] == "ok"

    def handover(self, key: str, token: int) -> None:
        assert self.call("handover", key, token, "lost the reply")[0] == "ok"

    def takeover(self, key: str) -> int:
        reply = self.call("takeover", key, 30_000, "old-rc/1")
        assert reply[0] == "acquired", reply
        return int(reply[1])

    def unknown(self, key: str, token: int) -> None:
        assert self.call("unknown", key, token, "lookup failed")[0] == "ok"

    def submit(self, effect: Effect, message_id: str) -> str:
        reply = self.call(
            "submit", effect.key, effect.fingerprint, effect.tool, 60_000, message_id, "0"
        )
        return str(reply[0])


@pytest.fixture(params=[False, True], ids=["hex-names", "short-names"])
def ledger(ledger_server: RedisServer | LocalCluster, request: pytest.FixtureRequest) -> Ledger:
    """Today's ledger writing hex names (a namespace laid out before short names) or short
    ones (dedupe/keys.py): either must read the old records, under their hex names."""
    return fresh_ledger(ledger_server.url, short_names=request.param)


@pytest.fixture
def old(ledger: Ledger) -> OldWriter:
    return OldWriter(ledger)


def is_json(ledger: Ledger, key: str) -> bool:
    """The stored record is still the old JSON object (not yet rewritten)."""
    names = ledger._keys(key)
    first = ledger.client.eval(
        "return string.sub(redis.call('GET', KEYS[1]) or redis.call('GET', KEYS[2]), 1, 1)",
        2, names[0], names[7],
    )  # fmt: skip
    return bool(first == "{")


def expired_claim(ledger: Ledger, old: OldWriter, effect: Effect) -> int:
    token = old.claim(effect, lease_s=0.05)
    poll(lambda: ledger.claim(effect, lease_s=1, holder="probe"), lambda c: c.outcome == "blocked")
    return token


def old_unknown(ledger: Ledger, old: OldWriter, effect: Effect, *, late: bool = False) -> int:
    token = expired_claim(ledger, old, effect)
    rc = old.takeover(effect.key)
    if late:  # the paused holder's receipt, kept by the old script as evidence
        text = json.dumps({"id": "late"})
        assert old.call("commit", effect.key, token, text, "", 60_000, "commit")[0] == "fenced"
    old.unknown(effect.key, rc)
    return rc


# -- reads ------------------------------------------------------------------------------


def test_an_old_done_record_reads_with_every_field(ledger: Ledger, old: OldWriter) -> None:
    effect = charge()
    token = old.claim(effect)
    old.commit(effect.key, token, RECEIPT, retention_s=3600)
    assert is_json(ledger, effect.key)
    record = ledger.get(effect.key)
    assert record is not None
    assert (record.state, record.token, record.generation) == (State.DONE, token, 0)
    assert record.fingerprint == effect.fingerprint and record.tool == "charge"
    assert record.receipt == RECEIPT and record.raw_response == json.dumps(
        RECEIPT, separators=(",", ":"), sort_keys=True
    )
    assert record.request == json.loads(ledger.request_text(effect))
    assert record.attempts == 1 and record.created_ms > 0
    assert [h.state for h in record.history] == ["CLAIMED", "DONE"]
    assert record.ttl_ms is not None and 3_500_000 < record.ttl_ms <= 3_600_000
    assert effect.key in ledger.keys_in(State.DONE)
    assert is_json(ledger, effect.key)  # a read rewrites nothing


def test_an_old_done_record_answers_duplicate_and_conflict(ledger: Ledger, old: OldWriter) -> None:
    effect = charge()
    old.commit(effect.key, old.claim(effect), RECEIPT, retention_s=3600)
    again = ledger.claim(effect, lease_s=30, holder="w/2")
    assert again.outcome is ClaimOutcome.DUPLICATE and again.receipt == RECEIPT
    other = charge(effect.scope, amount="99.00")
    assert ledger.claim(other, lease_s=30, holder="w/2").outcome is ClaimOutcome.CONFLICT
    submitted = ledger.submit(effect, message_id="m-new", pending_s=60)
    assert submitted.status == "done" and submitted.receipt == RECEIPT
    assert ledger.submit(other, message_id="m-other", pending_s=60).status == "conflict"


def test_an_old_failed_record_is_claimed_and_rewritten(ledger: Ledger, old: OldWriter) -> None:
    effect = charge()
    token = old.claim(effect)
    old.fail(effect.key, token)
    claim = ledger.claim(effect, lease_s=30, holder="w/2")
    assert (claim.outcome, claim.token, claim.generation) == ("acquired", token + 1, 0)
    assert not is_json(ledger, effect.key)
    assert ledger.commit(effect.key, claim.token, NEW_RECEIPT, retention_s=RETENTION_S).ok
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.DONE and record.attempts == 2
    assert [h.state for h in record.history] == ["CLAIMED", "FAILED", "CLAIMED", "DONE"]
    assert record.fingerprint == effect.fingerprint


def test_an_old_live_claim_is_in_flight_and_its_holder_commits(
    ledger: Ledger, old: OldWriter
) -> None:
    effect = charge()
    token = old.claim(effect)
    assert ledger.claim(effect, lease_s=30, holder="w/2").outcome is ClaimOutcome.IN_FLIGHT
    assert ledger.submit(effect, message_id="m-2", pending_s=60).status == "pending"
    assert ledger.heartbeat(effect.key, token, lease_s=60).ok
    assert ledger.commit(effect.key, token + 1, NEW_RECEIPT, retention_s=60).fenced
    assert ledger.commit(effect.key, token, RECEIPT, retention_s=60).ok
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.DONE and record.receipt == RECEIPT
    assert [r["token"] for r in record.late_receipts] == [token + 1]
    assert record.lease_deadline_ms is None and record.holder is None
    assert effect.key not in ledger.expired(limit=1000, now_ms=2**50)
    assert ledger.counts().get(("CLAIMED", "charge"), 0) == 0


def test_an_old_claim_fails_and_hands_over_under_its_token(ledger: Ledger, old: OldWriter) -> None:
    failing, handed = charge(), charge()
    assert ledger.fail(failing.key, old.claim(failing), reason="declined", retention_s=60).ok
    assert ledger.claim(failing, lease_s=30, holder="w/2").acquired
    token = old.claim(handed)
    assert ledger.handover(handed.key, token, reason="lost the reply").ok
    assert handed.key in ledger.expired(limit=1000)
    takeover = ledger.takeover(handed.key, lease_s=30, holder="rc/1")
    assert takeover is not None and takeover.token == token + 1


def test_old_expired_claims_and_unknowns_block_new_claims(ledger: Ledger, old: OldWriter) -> None:
    stale, lost = charge(), charge()
    expired_claim(ledger, old, stale)
    assert ledger.claim(stale, lease_s=30, holder="w/2").outcome is ClaimOutcome.BLOCKED
    assert ledger.submit(stale, message_id="m", pending_s=60).status == "blocked"
    old_unknown(ledger, old, lost)
    assert ledger.claim(lost, lease_s=30, holder="w/2").outcome is ClaimOutcome.BLOCKED
    assert lost.key in ledger.keys_in(State.UNKNOWN)
    assert ledger.counts()[("UNKNOWN", "charge")] == 1


# -- reconciler ---------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["commit", "fail", "unknown"])
def test_an_old_expired_claim_is_taken_over_and_settled(
    ledger: Ledger, old: OldWriter, outcome: str
) -> None:
    effect = charge()
    token = expired_claim(ledger, old, effect)
    late = json.dumps({"id": "late"})
    old.call("commit", effect.key, token - 1, late, "", 60_000, "commit")  # an older holder
    takeover = ledger.takeover(effect.key, lease_s=30, holder="rc/1")
    assert takeover is not None and takeover.token == token + 1 and takeover.rounds == 1
    assert takeover.request == json.loads(ledger.request_text(effect))
    assert takeover.attempts == 1 and takeover.claimed_ms > 0
    assert [r[0] for r in takeover.late_receipts] == [token - 1]
    assert ledger.counts()[("RECONCILING", "charge")] == 1
    if outcome == "commit":
        assert ledger.commit(effect.key, takeover.token, RECEIPT, retention_s=60).ok
    elif outcome == "fail":
        assert ledger.fail(effect.key, takeover.token, reason="not found", retention_s=60).ok
    else:
        assert ledger.mark_unknown(effect.key, takeover.token, reason="lookup failed").ok
    record = ledger.get(effect.key)
    assert record is not None and record.state.value == {
        "commit": "DONE", "fail": "FAILED", "unknown": "UNKNOWN"
    }[outcome]  # fmt: skip
    assert ledger.counts().get(("RECONCILING", "charge"), 0) == 0
    assert effect.key not in ledger.expired(limit=1000, now_ms=2**50)


def test_an_old_reconciling_record_is_taken_over_again(ledger: Ledger, old: OldWriter) -> None:
    effect = charge()
    expired_claim(ledger, old, effect)
    first = old.call("takeover", effect.key, 50, "old-rc/1")
    poll(lambda: ledger.takeover(effect.key, lease_s=30, holder="rc/2"), lambda t: t is not None)
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.RECONCILING
    assert record.token == int(first[1]) + 1 and record.holder == "rc/2"


# -- operator -----------------------------------------------------------------------------


def test_old_unknown_records_are_resolved(ledger: Ledger, old: OldWriter) -> None:
    ops = Operator(ledger)
    done, failed, evidence = charge(), charge(), charge()
    old_unknown(ledger, old, done)
    old_unknown(ledger, old, failed)
    old_unknown(ledger, old, evidence, late=True)
    ops.resolve(done.key, executed=True, actor="ops", reason="seen", receipt=RECEIPT)
    assert ledger.claim(done, lease_s=30, holder="w/2").receipt == RECEIPT
    ops.resolve(failed.key, executed=False, actor="ops", reason="not sent")
    assert ledger.claim(failed, lease_s=30, holder="w/2").acquired
    with pytest.raises(TransitionRefusedError):
        ops.resolve(evidence.key, executed=False, actor="ops", reason="not sent")
    ops.resolve(
        evidence.key, executed=False, actor="ops", reason="refunded", override_evidence=True
    )
    assert ledger.keys_in(State.UNKNOWN) == []
    assert ledger.counts().get(("UNKNOWN", "charge"), 0) == 0


@pytest.mark.parametrize("action", ["revoke", "supersede"])
def test_an_old_done_record_is_voided_and_replayed(
    ledger: Ledger, old: OldWriter, action: str
) -> None:
    ops = Operator(ledger)
    effect = charge()
    token = old.claim(effect)
    old.commit(effect.key, token, RECEIPT, retention_s=3600)
    getattr(ops, action)(effect.key, actor="ops", reason="refund")
    queued_before = ledger.claim(effect, lease_s=30, holder="w/2", generation=0)
    assert queued_before.outcome is ClaimOutcome.DUPLICATE

    def enqueue(record: Any) -> str:
        assert record.request == json.loads(ledger.request_text(effect))
        submitted = ledger.submit(effect, message_id="m-replay", pending_s=60)
        claim = ledger.claim(effect, lease_s=30, holder="w/3", generation=submitted.generation)
        assert (claim.outcome, claim.generation, claim.token) == ("acquired", 1, token + 2)
        return submitted.status.value

    assert ops.replay(effect.key, actor="ops", reason="resend", enqueue=enqueue) == "enqueue"


# -- markers, floors, campaigns -----------------------------------------------------------


def test_an_old_pending_marker_stands_for_its_message(ledger: Ledger, old: OldWriter) -> None:
    effect = charge()
    assert old.submit(effect, "m-1") == "enqueue"
    assert ledger.submit(effect, message_id="m-1", pending_s=60).status == "enqueue"  # a retry
    assert ledger.submit(effect, message_id="m-2", pending_s=60).status == "pending"
    other = charge(effect.scope, amount="99.00")
    assert ledger.submit(other, message_id="m-3", pending_s=60).status == "conflict"


def test_a_key_after_an_old_record_expired_starts_above_its_token(
    ledger: Ledger, old: OldWriter
) -> None:
    effect = charge()
    for _ in range(3):
        old.fail(effect.key, old.claim(effect))
    token = old.claim(effect)
    old.commit(effect.key, token, RECEIPT, retention_s=0.001)
    names = ledger._keys(effect.key)
    poll(lambda: ledger.client.exists(names[0], names[7]), lambda n: n == 0)
    claim = ledger.claim(effect, lease_s=30, holder="w/2")
    assert claim.acquired and claim.token > token


def test_an_old_campaign_record_moves_its_campaign_counts(ledger: Ledger, old: OldWriter) -> None:
    effect = charge()
    token = old.claim(effect, campaign="cmp1")
    assert ledger.campaign_counts("cmp1")["CLAIMED"] == 1
    assert ledger.commit(effect.key, token, RECEIPT, retention_s=60).ok
    counts = ledger.campaign_counts("cmp1")
    assert (counts["CLAIMED"], counts["DONE"]) == (0, 1)
