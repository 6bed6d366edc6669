"""The system checker on hand-made logs: what it must call a violation, and what not."""

from __future__ import annotations

from typing import Any

from dedupe import idempotency_key
from tests.chaos.checker import Event, Final, check, generations

KEY = "a" * 64


def charge(amount: str, mono: float, status: str | None = "enqueued") -> Event:
    args = {"customer": "c1", "amount": amount, "currency": "EUR"}
    return Event(KEY, "submit", mono, "charge", args, status)


def ran(seq: int, generation: int, amount: str, token: int = 1) -> dict[str, Any]:
    body = {"tool": "charge", "customer": "c1", "amount": amount, "currency": "EUR"}
    return {"seq": seq, "id": f"eff_{seq}", "idempotency_key": idempotency_key(KEY, generation),
            "token": token, "body": body}  # fmt: skip


HOLE_1 = [charge("10.00", 1), Event(KEY, "void", 2), charge("12.00", 3)]


def test_the_old_values_run_under_the_new_generation_key_is_a_violation() -> None:
    verdict = check(
        HOLE_1, [ran(1, 0, "10.00"), ran(2, 1, "10.00", 4)],
        {KEY: Final("DONE", 1, "eff_2")}, {"DONE": {KEY}},
    )  # fmt: skip
    assert len(verdict.violations) == 1
    assert "g1: execution #2" in verdict.violations[0] and "'12.00'" in verdict.violations[0]


def test_each_generation_once_with_its_own_values_passes() -> None:
    verdict = check(
        HOLE_1, [ran(1, 0, "10.00"), ran(2, 1, "12.00", 4)],
        {KEY: Final("DONE", 1, "eff_2")}, {"DONE": {KEY}},
    )  # fmt: skip
    assert verdict.violations == []
    assert verdict.figures["generations_opened"] == 1


def test_two_executions_of_one_generation_are_a_violation() -> None:
    verdict = check([charge("1", 1)], [ran(1, 0, "1"), ran(2, 0, "1", 2)],
                    {KEY: Final("DONE", 0, "eff_2")}, {"DONE": {KEY}})  # fmt: skip
    assert any("executed 2 times" in v for v in verdict.violations)


def test_an_effect_without_a_record_or_not_listed_or_stuck_is_a_violation() -> None:
    lost = check([charge("1", 1, "pending")], [], {}, {})
    hidden = check([charge("1", 1)], [], {KEY: Final("FAILED")}, {"FAILED": set()})
    stuck = check([charge("1", 1)], [], {KEY: Final("CLAIMED")}, {"CLAIMED": {KEY}})
    assert "no ledger record" in lost.violations[0]
    assert "does not show it" in hidden.violations[0]
    assert "stuck in CLAIMED" in stuck.violations[0]


def test_a_producer_that_died_before_its_answer_may_have_submitted_nothing() -> None:
    assert check([charge("1", 1, None)], [], {}, {}).violations == []


def test_a_void_opens_a_generation_only_once_a_submission_follows() -> None:
    events = [charge("1", 1), Event(KEY, "void", 2), charge("2", 3, "conflict")]
    assert list(generations(events)) == [0]
    assert list(generations([*events, charge("3", 4)])) == [0, 1]


def test_a_refused_submission_whose_intent_was_recorded_is_not_a_submission() -> None:
    """The recorder writes an intent line before each submission and its answer after: a
    conflict's intent must not stand for a submission of the refused values."""
    intent = Event(KEY, "submit", 2, "charge", {"customer": "c1", "amount": "99.00",
                   "currency": "EUR"}, None, attempt="x")  # fmt: skip
    answer = Event(KEY, "submit", 2.1, "charge", intent.args, "conflict", attempt="x")
    verdict = check([charge("1", 1), intent, answer], [ran(1, 0, "1")],
                    {KEY: Final("DONE", 0, "eff_1")}, {"DONE": {KEY}})  # fmt: skip
    assert verdict.violations == []
    assert verdict.figures["submissions"] == 2
