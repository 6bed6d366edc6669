"""``dedupe.states`` says, in Python, what ``ledger.lua`` decides per state; here the script
is asked, state by state on a real redis-server, and must agree: which states a claim is
granted on, which records expire, which hold a live claim, and which operator actions the
script accepts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dedupe import ClaimOutcome, Effect, Ledger, State, TransitionRefusedError
from dedupe.states import AT_REST, CLAIMABLE, HELD, OPERATOR_ACTIONS, SETTLED
from tests.support.ledgers import RETENTION_S, charge, fresh_ledger, poll
from workers.dev.redis_server import RedisServer

RECEIPT = {"id": "eff_1"}


def _claimed(ledger: Ledger, effect: Effect, lease_s: float = 30.0) -> int:
    claim = ledger.claim(effect, lease_s=lease_s, holder="test/1")
    assert claim.outcome is ClaimOutcome.ACQUIRED
    return claim.token


def _reconciling(ledger: Ledger, effect: Effect) -> int:
    _claimed(ledger, effect, lease_s=0.05)
    poll(lambda: ledger.claim(effect, lease_s=1, holder="probe"), lambda c: c.outcome == "blocked")
    takeover = ledger.takeover(effect.key, lease_s=30, holder="reconciler/1")
    assert takeover is not None
    return takeover.token


def _done(ledger: Ledger, effect: Effect) -> None:
    assert ledger.commit(effect.key, _claimed(ledger, effect), RECEIPT, retention_s=RETENTION_S)


def _operated(action: str) -> Callable[[Ledger, Effect], None]:
    def make(ledger: Ledger, effect: Effect) -> None:
        _done(ledger, effect)
        ledger.operate(effect.key, action, note="test", retention_s=RETENTION_S)

    return make


REACH: dict[State, Callable[[Ledger, Effect], object]] = {
    State.CLAIMED: _claimed,
    State.DONE: _done,
    State.FAILED: lambda ledger, e: ledger.fail(
        e.key, _claimed(ledger, e), reason="no", retention_s=RETENTION_S
    ),
    State.RECONCILING: _reconciling,
    State.UNKNOWN: lambda ledger, e: ledger.mark_unknown(
        e.key, _reconciling(ledger, e), reason="?"
    ),
    State.REVOKED: _operated("revoke"),
    State.SUPERSEDED: _operated("supersede"),
}
# The ledger's name of each operator action (``Ledger.operate``); replay is a submission.
LEDGER_ACTIONS = {
    "resolve": ("resolve_done", "resolve_failed"),
    "revoke": ("revoke",),
    "supersede": ("supersede",),
}


@pytest.fixture
def ledger(redis_server: RedisServer) -> Ledger:
    return fresh_ledger(redis_server.url)


def test_every_state_is_reachable_here() -> None:
    assert set(REACH) == set(State)


@pytest.mark.parametrize("state", list(State), ids=str)
def test_a_claim_is_granted_exactly_on_the_claimable_states(ledger: Ledger, state: State) -> None:
    effect = charge()
    REACH[state](ledger, effect)
    record = ledger.get(effect.key)
    assert record is not None and record.state is state
    # A message submitted now (after any revoke) carries the generation submit answers.
    generation = ledger.submit(effect, message_id="m-now", pending_s=5).generation
    claim = ledger.claim(effect, lease_s=30, holder="w/2", generation=generation)
    assert (claim.outcome is ClaimOutcome.ACQUIRED) == (state in CLAIMABLE), claim
    if state in HELD:
        assert claim.outcome is ClaimOutcome.IN_FLIGHT or claim.outcome is ClaimOutcome.BLOCKED


@pytest.mark.parametrize("state", list(State), ids=str)
def test_exactly_the_settled_states_expire(ledger: Ledger, state: State) -> None:
    effect = charge()
    REACH[state](ledger, effect)
    record = ledger.get(effect.key)
    assert record is not None and record.state is state
    assert (record.ttl_ms is not None) == (state in SETTLED), record.ttl_ms
    assert (state in AT_REST) == (state in SETTLED or state is State.UNKNOWN)


@pytest.mark.parametrize("state", list(State), ids=str)
def test_the_script_accepts_exactly_the_operator_actions_offered(
    ledger: Ledger, state: State
) -> None:
    offered = OPERATOR_ACTIONS.get(state, ())
    for action, ledger_actions in LEDGER_ACTIONS.items():
        for ledger_action in ledger_actions:
            effect = charge()
            REACH[state](ledger, effect)
            receipt = RECEIPT if ledger_action == "resolve_done" else None
            try:
                ledger.operate(
                    effect.key, ledger_action, note="t", retention_s=RETENTION_S, receipt=receipt
                )
                accepted = True
            except TransitionRefusedError:
                accepted = False
            assert accepted == (action in offered), (state, ledger_action)
    # Replay is a new submission: offered where a claim would be granted.
    assert ("replay" in offered) == (state in CLAIMABLE)
