"""What DESIGN.md §2 and §7 promise of any run of the ledger, stated without its state table.

``state_table.py`` restates the script's table, so a wrong rule in ``ledger.lua`` and the
same rule in the table agree. These checks read only what happened: each ledger call made
(who called, with which message generation, what it answered) and the stored record just
before and just after it (the script's own reading, ``Ledger._stored``). They are checked
for every call of a run, over the whole run, every time (a later step never excuses an
earlier one), and over each record's whole history, not only its last entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FREE = frozenset({"FAILED", "REVOKED", "SUPERSEDED"})  # the states a claim may be granted on
VOID = frozenset({"REVOKED", "SUPERSEDED"})
# The states of an effect that happened: DONE and what only a DONE record becomes.
HAPPENED = frozenset({"DONE", *VOID})
LEASED = frozenset({"CLAIMED", "RECONCILING"})
# What an effect is, for the rules below: a call that is not allowed to change one of these
# changes none of them.
EFFECT = ("s", "t", "f", "q", "g", "r", "raw")
OPERATOR_KINDS = frozenset({"resolve_done", "resolve_failed", "revoke", "supersede"})

Record = dict[str, Any]


@dataclass(frozen=True)
class Step:
    """One ledger call on key ``k``: ``kind`` (claim, commit, fail, heartbeat, handover,
    mark_unknown, takeover, an operator action, submit, confirm, expire), ``generation`` the
    claiming message's, ``outcome`` the answer (acquired, duplicate, ... / ok, fenced,
    refused), ``receipt`` and ``answered_generation`` a claim's answer ('' for no receipt),
    ``now_ms`` the server's time a takeover answered, and the record before and after."""

    n: int
    kind: str
    k: int
    before: Record | None
    after: Record | None
    generation: int | None = None
    outcome: str = ""
    receipt: str = ""
    answered_generation: int | None = None
    now_ms: int | None = None

    def __str__(self) -> str:
        gen = "" if self.generation is None else f" (message generation {self.generation})"
        return (
            f"step {self.n}: {self.kind} on k{self.k}{gen} -> {self.outcome or '-'}: "
            f"{_brief(self.before)} => {_brief(self.after)}"
        )


def _brief(r: Record | None) -> str:
    if r is None:
        return "ABSENT"
    return f"{r['s']} t{r['t']} g{r['g']} f{r['f'][:6]}"


def _effect(r: Record | None) -> tuple[Any, ...] | None:
    return None if r is None else tuple(r.get(f) for f in EFFECT)


def check_history(k: int, r: Record | None, where: str) -> None:
    """A record's whole history: every entry's token at most the record's and never falling,
    the last entry its state and token."""
    if r is None:
        return
    steps = r.get("y") or []
    assert steps, f"k{k} {where}: a record without history"
    tokens = [int(e[1]) for e in steps]
    assert tokens == sorted(tokens), f"k{k} {where}: history tokens fall: {steps}"
    assert tokens[-1] <= int(r["t"]) and all(t <= int(r["t"]) for t in tokens), (
        f"k{k} {where}: a history entry above the record's token t{r['t']}: {steps}"
    )
    assert (steps[-1][0], tokens[-1]) == (r["s"], int(r["t"])), (
        f"k{k} {where}: last history entry {steps[-1]} is not the record's {r['s']} t{r['t']}"
    )


def _appended(before: list[Any], after: list[Any]) -> bool:
    """``after`` is ``before`` with at most one entry appended and the oldest dropped."""
    if after == before:
        return True
    grown = [*before, after[-1]] if after else before
    return bool(after) and grown[len(grown) - len(after) :] == after


def check_step(step: Step) -> None:
    """One call against the rules of DESIGN §2 and §7.3 that do not depend on the table."""
    b, a, kind = step.before, step.after, step.kind
    if b is not None and a is not None:
        assert _appended(b.get("y") or [], a.get("y") or []), (
            f"{step}: the history was rewritten, not appended to: {b.get('y')} -> {a.get('y')}"
        )
        # Tokens per key only grow; a generation never falls while the record lives.
        assert int(a["t"]) >= int(b["t"]), f"{step}: the token fell"
        assert int(a["g"]) >= int(b["g"]), f"{step}: the generation fell"
    if kind in ("submit", "confirm"):
        assert _effect(a) == _effect(b), f"{step}: a producer's call changed the record"
        return
    if kind == "claim":
        assert step.generation is not None
        if step.outcome == "acquired":
            # No claim is granted while another is live, or on a settled effect.
            assert b is None or b["s"] in FREE, f"{step}: a claim granted on {b and b['s']}"
            # The holder derives the provider's idempotency key from the answered
            # generation: it is the record's, and never older than the message's.
            assert a is None or step.answered_generation == int(a["g"]), (
                f"{step}: acquired generation {step.answered_generation}, record g{a and a['g']}"
            )
            assert step.answered_generation is not None
            assert step.answered_generation >= step.generation, (
                f"{step}: a message of generation {step.generation} runs under generation "
                f"{step.answered_generation}'s provider key"
            )
        if b is not None and step.generation < int(b["g"]):
            # The generation rule, in every state: an older message never executes and
            # never rewrites the record.
            assert step.outcome == "duplicate", (
                f"{step}: a message of a generation older than the record's answered "
                f"{step.outcome}, not duplicate"
            )
            assert step.receipt == "", (
                f"{step}: an older generation's message got this generation's receipt"
            )
            assert _effect(a) == _effect(b), f"{step}: an older generation's message changed it"
        if b is not None and b["s"] in VOID and step.generation == int(b["g"]):
            # A message queued before the revoke: a duplicate of the voided generation.
            assert step.outcome == "duplicate" and _effect(a) == _effect(b), (
                f"{step}: a message of the voided generation was not a duplicate"
            )
    if kind == "takeover" and step.outcome == "acquired":
        assert b is not None and b["s"] in LEASED and step.now_ms is not None, str(step)
        assert int(b["d"]) <= step.now_ms, f"{step}: a live lease ({b['d']}) was taken over"
    # An effect that happened keeps no raw arguments for its retention (issue 39): a record
    # of this release in DONE, REVOKED or SUPERSEDED holds no request (replay from there
    # takes the call from the operator). Only a granted claim brings one back.
    if a is not None and a["s"] in HAPPENED:
        assert not a.get("q"), f"{step}: a {a['s']} record holds a request"
    if b is None or a is None:
        return
    # Fingerprint and request change only when a claim is granted: on FAILED to a message
    # of this generation or a later one, on REVOKED / SUPERSEDED to a later one. The one
    # other change: the request dropped as the record settles DONE (checked above).
    settled = a["s"] == "DONE" and b["s"] != "DONE" and not a.get("q")
    if a["f"] != b["f"] or a["g"] != b["g"] or (a.get("q") != b.get("q") and not settled):
        assert kind == "claim" and step.outcome == "acquired", (
            f"{step}: fingerprint, request or generation changed by a {kind}"
        )
        assert step.generation is not None
        assert (b["s"] == "FAILED" and step.generation >= int(b["g"])) or (
            b["s"] in VOID and step.generation > int(b["g"])
        ), f"{step}: the record was rewritten for a message of generation {step.generation}"
    if a["g"] != b["g"]:
        opened = b["s"] in VOID and int(a["g"]) == int(b["g"]) + 1
        assert opened or int(a["g"]) == step.generation, (
            f"{step}: generation moved from {b['g']} to {a['g']}"
        )
    if b["s"] == "DONE" and kind not in OPERATOR_KINDS:
        # A DONE effect's receipt is authority: only an operator changes it (late receipts
        # are evidence, kept apart).
        assert _effect(a) == _effect(b), f"{step}: a DONE record changed without an operator"
    if b["s"] == "UNKNOWN" and kind not in OPERATOR_KINDS:
        assert _effect(a) == _effect(b), f"{step}: an UNKNOWN record changed without an operator"


class RunChecker:
    """The rules over a whole run, one call after another: each call against check_step
    and its record's whole history, and per key across the run (its record's expiry and
    the fresh record after it included): tokens never fall, and every granted token is above
    any the key showed before. Snapshots never change once taken, so each call is checked
    once, as it joins the run; what carries over from call to call (the highest token each
    key showed) spans the run from its first call."""

    def __init__(self, keys: int) -> None:
        self.top = [0] * keys
        self.checked = 0

    def check(self, steps: list[Step]) -> None:
        for step in steps[self.checked :]:
            self._check(step)
            self.checked += 1

    def _check(self, step: Step) -> None:
        check_step(step)
        check_history(step.k, step.after, str(step))
        b, a, top = step.before, step.after, self.top
        if b is not None:
            assert int(b["t"]) >= top[step.k], f"{step}: token below t{top[step.k]} seen before"
            top[step.k] = int(b["t"])
        if a is not None:
            if step.kind in ("claim", "takeover") and step.outcome == "acquired":
                assert int(a["t"]) > top[step.k], (
                    f"{step}: granted t{a['t']}, the key showed t{top[step.k]} before"
                )
            assert int(a["t"]) >= top[step.k], (
                f"{step}: token t{a['t']} after the key showed t{top[step.k]}"
            )
            top[step.k] = int(a["t"])
