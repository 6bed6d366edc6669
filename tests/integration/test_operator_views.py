"""The operator's bulk tools and views on a real ledger: the re-check transition (refused
from any other state, a fresh lookup budget), paging through the state indexes and the
audit and dead-letter streams without gaps or repeats, an effect's whole audit trail, and
key search by prefix."""

from __future__ import annotations

import dataclasses

import pytest

from dedupe import EffectqError, NotFound, OperatorError, State, TransitionRefusedError
from reconciler import Operator
from tests.support.cluster import LocalCluster
from tests.support.ledgers import CHARGE, RETENTION_S, charge, fresh_ledger, unknown_charge
from workers import runtime, verbs
from workers.dev.local import LocalStack
from workers.dev.redis_server import RedisServer


@pytest.fixture
def ops(live: LocalStack) -> Operator:
    from workers import registry

    return Operator(runtime.ledger(), registry.specs())


def _recheck(ops: Operator, **kwargs: object) -> dict[str, object]:
    args: dict[str, object] = {"since_ms": None, "until_ms": None, "actor": "sre", "reason": "r"}
    return ops.recheck("charge", **{**args, **kwargs})  # type: ignore[arg-type]


def test_recheck_hands_an_unknown_back_with_a_fresh_budget_and_an_expired_lease(
    ops: Operator,
) -> None:
    key = unknown_charge(ops.ledger)
    before = ops.inspect(key)
    assert _recheck(ops, dry_run=True)["matched"] == 1
    assert ops.inspect(key).state is State.UNKNOWN  # a dry run changes nothing
    assert ops.ledger.audit_log() == []
    assert _recheck(ops)["rechecked"] == 1
    record = ops.inspect(key)
    assert record.state is State.RECONCILING and record.token == before.token + 1
    assert ops.ledger.expired() == [key]  # the next reconciler pass takes it at once
    takeover = ops.ledger.takeover(key, lease_s=30, holder="r/2")
    assert takeover is not None and takeover.rounds == 1  # the lookup budget starts afresh
    assert takeover.reconciling_since_ms == takeover.now_ms  # and the settle window too
    actions = [(e["action"], e["key"], e["outcome"][:2]) for e in ops.ledger.audit_log()]
    assert actions == [("recheck", "", "ok"), ("recheck", key, "ok")]


@pytest.mark.parametrize("state", ["CLAIMED", "DONE", "RECONCILING"])
def test_the_ledger_refuses_recheck_from_any_state_but_unknown(ops: Operator, state: str) -> None:
    effect = charge()
    claim = ops.ledger.claim(effect, lease_s=30, holder="w/1")
    if state == "DONE":
        ops.ledger.commit(effect.key, claim.token, {"id": "x"}, retention_s=RETENTION_S)
    if state == "RECONCILING":
        ops.ledger.handover(effect.key, claim.token, reason="unsure")
        assert ops.ledger.takeover(effect.key, lease_s=30, holder="r/1") is not None
    with pytest.raises(TransitionRefusedError, match=f"recheck refused: effect is {state}"):
        ops.ledger.recheck(effect.key, tool="charge", note="n", holder="op/sre")
    assert ops.inspect(effect.key).state.value == state


def test_recheck_leaves_other_tools_and_other_times_alone(ops: Operator) -> None:
    key = unknown_charge(ops.ledger)
    with pytest.raises(TransitionRefusedError):
        ops.ledger.recheck(key, tool="send_email", note="n", holder="op/sre")
    became = ops.ledger.index_page("unknown")[0][1]
    assert _recheck(ops, until_ms=became - 1)["matched"] == 0
    assert _recheck(ops, since_ms=became + 1)["matched"] == 0
    assert _recheck(ops, since_ms=became, until_ms=became)["rechecked"] == 1


def test_recheck_of_a_tool_without_lookup_is_refused_and_audited(ops: Operator) -> None:
    with pytest.raises(OperatorError, match="tool nope is not declared here"):
        ops.recheck("nope", since_ms=None, until_ms=None, actor="sre", reason="r")
    assert ops.ledger.audit_log()[0]["outcome"].startswith("refused: recheck refused")


def test_paging_the_state_indexes_visits_each_effect_once(ops: Operator) -> None:
    unknown = {unknown_charge(ops.ledger) for _ in range(7)}
    claimed = set()
    for _ in range(4):
        effect = charge()
        ops.ledger.claim(effect, lease_s=60, holder="w/1")
        claimed.add(effect.key)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = verbs.effects_page(ops, cursor=cursor, limit=3)
        seen += [e["key"] for e in page["effects"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(unknown | claimed) and pages == 4
    assert [e for e in seen[:7]] and set(seen[:7]) == unknown  # UNKNOWN first, then leases
    only = verbs.effects_page(ops, state=State.CLAIMED, tool="charge", limit=1000)
    assert {e["key"] for e in only["effects"]} == claimed and only["next_cursor"] is None
    assert verbs.effects_page(ops, tool="send_email")["effects"] == []


@pytest.mark.parametrize("cursor", ["x", "u12", "u12.zz", "u-1." + "a" * 64, "q1." + "a" * 64])
def test_a_cursor_not_handed_out_is_refused(ops: Operator, cursor: str) -> None:
    with pytest.raises(EffectqError, match="not a cursor"):
        verbs.effects_page(ops, cursor=cursor)


def test_an_effects_whole_audit_trail_beyond_the_last_thousand_entries(ops: Operator) -> None:
    key = unknown_charge(ops.ledger)
    ops.ledger.audit(action="resolve_done", key=key, actor="sre", reason="r", outcome="refused")
    pipe = ops.ledger.client.pipeline(transaction=False)
    for n in range(1500):  # other effects' actions, all newer than this one's
        pipe.xadd(f"{ops.ledger.namespace}:audit", {"action": "revoke", "key": "", "n": str(n)})
    pipe.execute()
    for n in range(1100):
        ops.ledger.audit(action="revoke", key=key, actor="sre", reason=str(n), outcome="refused")
    trail = verbs.audit_trail(ops, key)
    assert len(trail) == 1101 and trail[-1]["action"] == "resolve_done"
    assert trail[0]["reason"] == "1099"


def test_stream_pages_filter_and_go_on_by_cursor(ops: Operator) -> None:
    for n in range(5):
        tool = "charge" if n % 2 else "send_email"
        ops.ledger.dead_letter(message_id=f"m-{n}", tool=tool, key=None, reason="bad input")
    first = verbs.dead_letters(ops, tool="charge", limit=1)
    assert [e["message_id"] for e in first["dead_letters"]] == ["m-3"]
    rest = verbs.dead_letters(ops, tool="charge", cursor=first["next_cursor"])
    assert [e["message_id"] for e in rest["dead_letters"]] == ["m-1"]
    assert rest["next_cursor"] is None
    assert verbs.dead_letters(ops, since_ms=ops.ledger.server_time_ms() + 1000) == {
        "dead_letters": [], "next_cursor": None,
    }  # fmt: skip
    ops.ledger.audit(action="revoke", key="", actor="ana", reason="r", outcome="o")
    ops.ledger.audit(action="revoke", key="", actor="bo", reason="r", outcome="o")
    assert [e["actor"] for e in verbs.audit_page(ops, actor="ana")["audit"]] == ["ana"]
    with pytest.raises(Exception, match="not a cursor of this stream"):
        verbs.dead_letters(ops, cursor="$")


def test_a_key_prefix_finds_a_settled_effect(ops: Operator) -> None:
    effect = charge()
    claim = ops.ledger.claim(effect, lease_s=30, holder="w/1")
    ops.ledger.commit(effect.key, claim.token, {"id": "x"}, retention_s=RETENTION_S)
    [found] = verbs.find_keys(ops, effect.key[:12])
    assert found.key == effect.key and found.state is State.DONE
    assert [r.key for r in verbs.find_keys(ops, effect.key.upper())] == [effect.key]
    for text in ("abc", effect.key[:11], "z" * 12, effect.key + "0"):
        with pytest.raises(Exception, match="a key search needs"):
            verbs.find_keys(ops, text)


class _Lookup:
    def lookup(self, idempotency_key: str, token: int | None = None) -> NotFound:
        return NotFound(authoritative=True)


def test_recheck_paging_trail_and_search_hold_on_a_cluster_too(
    ledger_server: RedisServer | LocalCluster,
) -> None:
    ledger = fresh_ledger(ledger_server.url)
    ops = Operator(ledger, {"charge": dataclasses.replace(CHARGE, lookup=_Lookup())})
    keys = {unknown_charge(ledger) for _ in range(5)}
    seen: list[str] = []
    cursor: str | None = None
    while True:
        records, cursor = ops.page(state=State.UNKNOWN, cursor=cursor, limit=2)
        seen += [r.key for r in records]
        if cursor is None:
            break
    assert sorted(seen) == sorted(keys)
    assert _recheck(ops)["rechecked"] == 5
    assert sorted(ledger.expired()) == sorted(keys)
    key = seen[0]
    assert [e["action"] for e in verbs.audit_trail(ops, key)] == ["recheck"]
    assert [r.key for r in verbs.find_keys(ops, key[:12])] == [key]
