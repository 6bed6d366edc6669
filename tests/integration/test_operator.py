"""Operator actions on a real ledger: every refusal with its message, every action (refused
ones too) in the audit stream with its actor and reason."""

from __future__ import annotations

import pytest

from dedupe import (
    ClaimOutcome,
    Effect,
    Ledger,
    OperatorError,
    State,
    TransitionRefusedError,
)
from reconciler import Operator
from tests.support.ledgers import RETENTION_S, charge, poll
from workers import runtime
from workers.dev.local import LocalStack

RECEIPT = {"id": "eff_by_hand"}


@pytest.fixture
def ops(live: LocalStack) -> Operator:
    from workers import registry

    return Operator(runtime.ledger(), registry.specs())


def _unknown(ledger: Ledger, *, late: bool = False) -> str:
    effect = charge()
    claim = ledger.claim(effect, lease_s=0.05, holder="w/1")
    takeover = poll(
        lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), lambda t: t is not None
    )
    assert takeover is not None
    if late:  # the paused holder woke up and reported a receipt under its old token
        assert ledger.commit(effect.key, claim.token, {"id": "late"}, retention_s=60).fenced
    ledger.mark_unknown(effect.key, takeover.token, reason="lookup unavailable 5 times")
    return effect.key


def _done(ledger: Ledger, effect: Effect | None = None) -> str:
    effect = effect or charge()
    claim = ledger.claim(effect, lease_s=30, holder="w/1")
    ledger.commit(effect.key, claim.token, RECEIPT, retention_s=RETENTION_S)
    return effect.key


def test_list_unknown_is_the_work_queue(ops: Operator) -> None:
    keys = {_unknown(ops.ledger) for _ in range(3)}
    _done(ops.ledger)
    listed = ops.list(state=State.UNKNOWN)
    assert {r.key for r in listed} == keys
    assert all(r.reason == "lookup unavailable 5 times" for r in listed)


def test_resolve_executed_with_evidence_makes_the_next_claim_a_duplicate(ops: Operator) -> None:
    key = _unknown(ops.ledger)
    write = ops.resolve(key, executed=True, receipt=RECEIPT, actor="sre-ana", reason="bank ok")
    assert write.state == "DONE"
    [entry] = ops.ledger.audit_log()
    assert entry["action"] == "resolve_done" and entry["actor"] == "sre-ana"
    assert entry["reason"] == "bank ok" and entry["outcome"].startswith("ok: DONE")
    record = ops.inspect(key)
    assert record.receipt == RECEIPT and "resolve_done by sre-ana: bank ok" in record.reason


def test_resolve_executed_without_a_receipt_is_refused(ops: Operator) -> None:
    key = _unknown(ops.ledger)
    with pytest.raises(OperatorError, match="needs the receipt as evidence"):
        ops.resolve(key, executed=True, actor="sre", reason="trust me")
    assert ops.ledger.audit_log()[0]["outcome"].startswith("refused: resolve --executed needs")


def test_resolve_not_executed_against_late_receipts_needs_override(ops: Operator) -> None:
    key = _unknown(ops.ledger, late=True)
    with pytest.raises(TransitionRefusedError, match=r"1 late receipt.*--override-evidence"):
        ops.resolve(key, executed=False, actor="sre", reason="looks unsent")
    assert ops.inspect(key).state is State.UNKNOWN
    ops.resolve(key, executed=False, actor="sre", reason="bank says no", override_evidence=True)
    assert ops.inspect(key).state is State.FAILED


def test_resolve_is_refused_while_the_claim_is_unreconciled(ops: Operator) -> None:
    effect = charge()
    ops.ledger.claim(effect, lease_s=30, holder="w/1")
    with pytest.raises(TransitionRefusedError, match="CLAIMED, its outcome not yet reconciled"):
        ops.resolve(effect.key, executed=False, actor="sre", reason="stuck?")
    assert ops.ledger.audit_log()[0]["outcome"].startswith("refused:")


def test_revoke_and_supersede_only_from_done(ops: Operator) -> None:
    key = _unknown(ops.ledger)
    with pytest.raises(TransitionRefusedError, match="UNKNOWN; resolve it with evidence first"):
        ops.revoke(key, actor="sre", reason="refund")
    effect = charge()
    done = _done(ops.ledger, effect)
    assert ops.supersede(done, actor="sre", reason="new terms").state == "SUPERSEDED"
    with pytest.raises(TransitionRefusedError, match="SUPERSEDED; only a DONE effect"):
        ops.revoke(done, actor="sre", reason="again")
    submitted = ops.ledger.submit(effect, message_id="m-1", pending_s=60)  # after the supersede
    again = ops.ledger.claim(effect, lease_s=30, holder="w", generation=submitted.generation)
    assert again.outcome is ClaimOutcome.ACQUIRED and again.generation == 1


def test_replay_only_where_a_claim_would_be_granted(ops: Operator) -> None:
    done = _done(ops.ledger)
    sent: list[str] = []

    def enqueue(record: object) -> str:
        sent.append(done)
        return "enqueued"

    with pytest.raises(TransitionRefusedError, match="replay refused: effect is DONE"):
        ops.replay(done, actor="sre", reason="resend", enqueue=enqueue)
    ops.revoke(done, actor="sre", reason="bounced")
    assert ops.replay(done, actor="sre", reason="resend", enqueue=enqueue) == "enqueued"
    assert sent == [done]
    actions = [(e["action"], e["outcome"].split(":")[0]) for e in ops.ledger.audit_log()]
    assert actions == [("replay", "enqueued"), ("revoke", "ok"), ("replay", "refused")]


@pytest.mark.parametrize(("actor", "reason"), [("", "x"), ("sre", " "), ("a" * 300, "x")])
def test_actions_need_an_actor_and_a_reason(ops: Operator, actor: str, reason: str) -> None:
    key = _done(ops.ledger)
    with pytest.raises(OperatorError, match=r"actor|reason"):
        ops.revoke(key, actor=actor, reason=reason)


def test_inspect_of_a_missing_key_says_so(ops: Operator) -> None:
    with pytest.raises(OperatorError, match="no effect with key"):
        ops.inspect("0" * 64)


def _failed_with_a_late_receipt(ledger: Ledger) -> str:
    """The reconciler found nothing and marked it FAILED; then the paused holder woke up
    and reported that the provider did charge."""
    effect = charge()
    claim = ledger.claim(effect, lease_s=0.05, holder="w/1")
    takeover = poll(
        lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), lambda t: t is not None
    )
    assert takeover is not None
    assert ledger.fail(effect.key, takeover.token, reason="not found", retention_s=60).ok
    assert ledger.commit(effect.key, claim.token, {"id": "late"}, retention_s=60).fenced
    return effect.key


def test_a_late_receipt_on_a_failed_effect_refuses_replay(ops: Operator) -> None:
    key = _failed_with_a_late_receipt(ops.ledger)
    assert ops.inspect(key).state is State.UNKNOWN
    assert key in {r.key for r in ops.list(state=State.UNKNOWN)}

    def enqueue(record: object) -> str:
        raise AssertionError("a replay against evidence of execution was enqueued")

    with pytest.raises(TransitionRefusedError, match="replay refused: effect is UNKNOWN"):
        ops.replay(key, actor="sre", reason="retry it", enqueue=enqueue)
    with pytest.raises(TransitionRefusedError, match=r"1 late receipt.*--override-evidence"):
        ops.resolve(key, executed=False, actor="sre", reason="looks unsent")
    ops.resolve(key, executed=True, receipt={"id": "late"}, actor="sre", reason="bank: charged")
    assert ops.inspect(key).state is State.DONE


def test_a_late_receipt_landing_during_resolve_not_executed_is_not_overridden(
    ops: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    effect = charge()
    ledger = ops.ledger
    claim = ledger.claim(effect, lease_s=0.05, holder="w/1")
    takeover = poll(
        lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), lambda t: t is not None
    )
    assert takeover is not None
    ledger.mark_unknown(effect.key, takeover.token, reason="lookup unavailable")
    read = ledger.get

    def read_then_late_receipt(key: str) -> object:
        # The operator has read the record (no evidence yet); the paused holder's receipt
        # lands before the operator's write.
        record = read(key)
        assert ledger.commit(key, claim.token, {"id": "late"}, retention_s=60).fenced
        return record

    monkeypatch.setattr(ledger, "get", read_then_late_receipt)
    with pytest.raises(TransitionRefusedError, match=r"1 late receipt.*--override-evidence"):
        ops.resolve(effect.key, executed=False, actor="sre", reason="looks unsent")
    monkeypatch.undo()
    record = ops.inspect(effect.key)
    assert record.state is State.UNKNOWN and len(record.late_receipts) == 1
    outcome = ops.ledger.audit_log()[0]["outcome"]
    assert outcome.startswith("refused: ") and "1 late receipt" in outcome
