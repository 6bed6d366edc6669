"""The ledger against a model of its state table: hypothesis drives ``dedupe.Ledger`` on a
real redis-server (AOF on; the system Redis 7 and the embedded 6.2) and checks every answer
and every record against ``tests/model/state_table.py`` (DESIGN.md §2, CONTRACT.md
"Ledger").

Rules: submit (the generation a message is sent for), claim by a message (redelivered or
stale: any message submitted earlier, with the generation it was submitted for), replay (a
submit and at once a claim), heartbeat, commit, fail, handover by any holder (stale tokens
included), takeover and mark_unknown by reconcilers, every operator action through
``Ledger.operate`` (resolve_failed with and without override_evidence), lease expiry
(leases are either 600 s or 1 ms waited out on the server's clock, so the model never
guesses) and record expiry (1 ms retention, or a settled record's TTL cut short), over
three keys (two sharing a bucket) and several holders. After every step: the records agree
with the model (state, token, generation, fingerprint, receipt, late receipts, holder,
attempts, TTL, lease and unknown indexes, counters); tokens per key only grow, also across
expiry; no two holders hold one live token; a refused or fenced write changed nothing (a
fenced commit only appends its late receipt, and turns FAILED into UNKNOWN); each record's
last history entry is its last transition.

The table restates the script, so a wrong rule in both would agree: every ledger call is
also held to DESIGN's rules stated without the table (``design_rules.py``: the generation
rule in every state, what may change a fingerprint, request, generation, a DONE or UNKNOWN
record, no request kept once an effect happened (DONE, REVOKED, SUPERSEDED), no grant on a
live or settled record, tokens across expiry, each record's whole history), and targeted
rules make a voided generation's message arrive in every state its resubmission can reach
(revoke, resubmit g+1, FAILED by worker, reconciler or operator, ...).

    python -m pytest tests/model -q -p no:cacheprovider          # bounded: 100 examples x 40 steps
    EFFECTQ_MODEL_EXAMPLES=2000 python -m pytest tests/model -q  # long run, random seed
    EFFECTQ_MODEL_EXAMPLES=2000 EFFECTQ_MODEL_STEPS=60 python -m pytest tests/model -q -k system

Every run draws new examples (a fixed sample missed holes that random ones found):
a failure prints its steps and a ``@reproduce_failure`` blob, and hypothesis keeps it in
.hypothesis/ so the next run replays it first.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dedupe import ClaimOutcome, Effect, Ledger, TransitionRefusedError
from tests.model.design_rules import RunChecker, Step
from tests.model.state_table import (
    DONE,
    FAILED,
    LEASED,
    OPERATOR,
    REVOKED,
    SETTLED,
    SUPERSEDED,
    UNKNOWN,
    Model,
)
from tests.support.ledgers import charge, fresh_ledger, poll
from workers.dev.redis_server import RedisServer

EXAMPLES = int(os.environ.get("EFFECTQ_MODEL_EXAMPLES") or 0)
STEPS = int(os.environ.get("EFFECTQ_MODEL_STEPS") or 40)
PROFILE = settings(
    max_examples=EXAMPLES or 100,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)

BUCKETS = 2
LONG_S = 600.0  # a lease that outlives any example
TINY_S = 0.001  # a lease or retention that is waited out before the next step
RETAIN_S = 3600.0
AMOUNTS = ("10.00", "20.00")  # two fingerprints per key: the second conflicts
WORKERS = st.sampled_from(["w1", "w2", "w3"])
RECONCILERS = st.sampled_from(["rc1", "rc2"])
HOLDER_OPS = st.sampled_from(["commit", "fail", "heartbeat", "handover", "mark_unknown"])
SHORT = st.sampled_from([False, False, False, True])  # a retention of 1 ms, one time in four
# Where a resubmission after a revoke has got to when a message of the voided generation
# arrives (a_voided_generation_comes_back).
ENDINGS = (
    "failed by the worker",
    "failed by the reconciler",
    "resolved not executed",
    "done",
    "unknown",
    "reconciling",
    "claimed",
)


def _scopes() -> list[str]:
    """Three scopes whose keys fall in buckets a, a, b: two keys share a token floor."""
    by_bucket: dict[int, list[str]] = {0: [], 1: []}
    for i in count():
        scope = f"order-{i}"
        by_bucket[int(charge(scope).key[:8], 16) % BUCKETS].append(scope)
        if len(by_bucket[0]) >= 2 and by_bucket[1]:
            return [*by_bucket[0][:2], by_bucket[1][0]]
    raise AssertionError("unreachable")


SCOPES = _scopes()
KEY = st.integers(0, len(SCOPES) - 1)


@dataclass(frozen=True)
class Message:
    """A broker message for key ``k``: which amount, and the generation it was sent for."""

    k: int
    variant: int
    generation: int
    message_id: str


@dataclass(frozen=True)
class Holder:
    """Whoever was granted ``token`` on key ``k`` (a worker's claim or a takeover)."""

    k: int
    token: int
    name: str


def _state(record: dict[str, Any] | None) -> str:
    return "ABSENT" if record is None else str(record["s"])


def _without(record: dict[str, Any] | None, *fields: str) -> dict[str, Any] | None:
    return None if record is None else {f: v for f, v in record.items() if f not in fields}


class LedgerMachine(RuleBasedStateMachine):
    url: ClassVar[str] = ""
    messages = Bundle("messages")
    holders = Bundle("holders")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = fresh_ledger(self.url, buckets=BUCKETS)
        # The same namespace, writing the other spelling of record names (dedupe/keys.py) and
        # its record form: ``the_other_spelling_takes_over`` swaps the two at any step.
        self.other = Ledger.from_url(
            self.url, namespace=self.ledger.namespace, buckets=BUCKETS, short_names=True
        )
        self.effects: list[list[Effect]] = [[charge(s, a) for a in AMOUNTS] for s in SCOPES]
        self.keys = [row[0].key for row in self.effects]
        buckets = [self.ledger.bucket_of(key) for key in self.keys]
        assert buckets[0] == buckets[1] != buckets[2], buckets
        self.model = Model(buckets)
        self.granted: list[Holder] = []
        self.top = [0] * len(self.keys)  # the highest token each key ever showed
        self.serial = count(1)
        self.sent: list[Message] = []  # every message submitted, in order
        self.trace: list[Step] = []  # every ledger call, for design_rules
        self.design = RunChecker(len(self.keys))
        self.snap: dict[int, dict[str, Any] | None] = {}  # see _before
        self.comebacks = 0  # runs of a_voided_generation_comes_back

    def teardown(self) -> None:
        self.ledger.client.close()
        self.other.client.close()

    # -- helpers ----------------------------------------------------------------------

    def _names(self, k: int) -> list[str]:
        """Both names key ``k``'s record may be stored under (hex, short)."""
        names = self.ledger._keys(self.keys[k])
        return sorted([names[0], names[7]], key=len, reverse=True)

    def _record_key(self, k: int) -> str:
        """The name key ``k``'s record is stored under (the hex one when there is none)."""
        hex_name, short_name = self._names(k)
        return short_name if self.ledger.client.exists(short_name) else hex_name

    def _raw(self, k: int) -> dict[str, Any] | None:
        return self.ledger._stored(self.keys[k])

    def _before(self, k: int) -> dict[str, Any] | None:
        """The record as the last call on it left it (read by _log just after that call):
        nothing else writes it — leases run out without a write, and a record that expires
        is waited out by _wait_gone. Read from the server before the first call."""
        return self.snap[k] if k in self.snap else self._raw(k)

    def _unchanged(self, k: int, before: dict[str, Any] | None, what: str, *skip: str) -> None:
        # The record after the call is the one _log read just after it (one read less).
        last = self.trace[-1] if self.trace else None
        after = last.after if last is not None and last.k == k else self._raw(k)
        assert _without(after, *skip) == _without(before, *skip), (
            f"{what} on k{k} changed the record: {before} -> {after}"
        )

    def _log(self, kind: str, k: int, before: dict[str, Any] | None, **answer: Any) -> None:
        """Record the call just made on key ``k``: its answer, the record before and after
        (held to DESIGN's rules by design_rules_hold_over_the_whole_run)."""
        after = self.snap[k] = self._raw(k)
        self.trace.append(Step(len(self.trace), kind, k, before, after, **answer))

    def _wait_lease(self, k: int) -> None:
        """Wait until the server's clock is past the lease just written."""
        record = self.ledger.get(self.keys[k])
        assert record is not None and record.lease_deadline_ms is not None
        deadline = record.lease_deadline_ms
        time.sleep(TINY_S)
        poll(self.ledger.server_time_ms, lambda now: now > deadline, timeout=5)

    def _wait_gone(self, k: int) -> None:
        time.sleep(TINY_S)
        poll(lambda: self.ledger.client.exists(*self._names(k)), lambda n: n == 0, timeout=5)
        self.model.expire(k)
        self.snap[k] = None

    def _lease(self, tiny: bool) -> float:
        return TINY_S if tiny else LONG_S

    def _receipt(self) -> dict[str, Any]:
        return {"id": f"rcpt_{next(self.serial)}", "status": "charged"}

    def _current(self, k: int) -> Holder | None:
        r = self.model.rec(k)
        if r is None or r.state not in LEASED:
            return None
        return next((h for h in self.granted if h.k == k and h.token == r.token), None)

    def _grant(self, k: int, token: int, name: str) -> Holder:
        assert token > self.top[k], (
            f"k{k}: token {token} granted, but the key already showed token {self.top[k]}"
        )
        self.top[k] = token
        holder = Holder(k, token, name)
        self.granted.append(holder)
        return holder

    # -- producer and workers ---------------------------------------------------------

    @initialize(target=messages)
    def first_submissions(self) -> Any:
        """Every key submitted once: a message for each exists from the start."""
        return multiple(*(self._submit(k, 0) for k in range(len(self.keys))))

    @rule()
    def the_other_spelling_takes_over(self) -> None:
        """From here on the other ledger makes the calls: the one writing short names and
        the tight record form, or the one writing hex names and the settled form (a fleet
        of both, as embedding code beside a laid-out pool makes). Every record must read
        the same through either, and move to the writer's name on its next write."""
        self.ledger, self.other = self.other, self.ledger
        event(f"short names: {self.ledger.keyspace.short}")

    @rule(target=messages, k=KEY, variant=st.sampled_from([0, 0, 1]))
    def submit(self, k: int, variant: int) -> Message:
        return self._submit(k, variant)

    def _submit(self, k: int, variant: int) -> Message:
        effect = self.effects[k][variant]
        message_id = f"m{next(self.serial)}"
        before = self._before(k)
        expect = self.model.submit(k, effect.fingerprint, message_id)
        got = self.ledger.submit(effect, message_id=message_id, pending_s=LONG_S)
        self._log("submit", k, before, outcome=got.status.value)
        assert got.status.value in expect.statuses, (
            f"submit k{k}: ledger {got.status.value}, model {sorted(expect.statuses)}"
        )
        assert got.generation == expect.generation, (
            f"submit k{k}: generation {got.generation}, model {expect.generation}"
        )
        if got.status.value == "done":
            assert got.receipt == expect.receipt
        msg = Message(k, variant, got.generation, message_id)
        self.sent.append(msg)
        return msg

    @rule(msg=messages)
    def confirm(self, msg: Message) -> None:
        """The producer heard that the broker took ``msg``: at once, or late (after the
        message ran, or after later submissions of its key)."""
        effect = self.effects[msg.k][msg.variant]
        before = self._before(msg.k)
        expect = self.model.confirm(msg.k, effect.fingerprint, msg.message_id)
        self.ledger.confirm_pending([(effect, msg.message_id)], LONG_S)
        self._log("confirm", msg.k, before)
        stored = self.ledger.client.get(self.ledger._pending_key(effect.key))
        if expect is None:
            wanted = None
        else:
            reserved = "" if expect.confirmed else "|r"
            wanted = f"{expect.fingerprint}|{expect.message_id}{reserved}"
        took = expect is not None and expect.message_id == msg.message_id
        event(f"confirm: {'its own marker' if took else 'left as it was'}")
        assert stored == wanted, (
            f"confirm k{msg.k} {msg.message_id}: marker {stored}, model {wanted}"
        )

    def _claim(self, msg: Message, name: str, tiny: bool) -> Any:
        k = msg.k
        effect = self.effects[k][msg.variant]
        before = self._before(k)
        was = _state(before)
        expect = self.model.claim(k, effect.fingerprint, msg.generation, name, live=not tiny)
        got = self.ledger.claim(
            effect, lease_s=self._lease(tiny), holder=name, generation=msg.generation
        )
        answered = "" if got.receipt is None else json.dumps(got.receipt)
        self._log(
            "claim", k, before, generation=msg.generation, outcome=got.outcome.value,
            receipt=answered, answered_generation=got.generation,
        )  # fmt: skip
        assert got.outcome.value in expect.outcomes, (
            f"claim k{k} (message generation {msg.generation}): ledger {got.outcome.value} "
            f"token {got.token} generation {got.generation}, model {sorted(expect.outcomes)}"
        )
        event(f"claim on {was}: {got.outcome.value}")
        if got.outcome is not ClaimOutcome.ACQUIRED:
            assert got.token == expect.token, f"claim k{k}: token {got.token} != {expect.token}"
            r = self.model.rec(k)
            done = r is not None and r.state == DONE and r.generation == msg.generation
            if got.outcome is ClaimOutcome.DUPLICATE and r is not None and done:
                assert got.receipt == r.receipt, f"claim k{k}: duplicate of {got.receipt}"
            self._unchanged(k, before, f"a {got.outcome.value} claim")
            return multiple()
        holder = self._grant(k, got.token, name)
        assert (got.token, got.generation) == (expect.token, expect.generation), (
            f"claim k{k}: acquired token {got.token} generation {got.generation}, "
            f"model token {expect.token} generation {expect.generation}"
        )
        if tiny:
            self._wait_lease(k)
        return holder

    @rule(target=holders, msg=messages, name=WORKERS, tiny=st.booleans())
    def claim(self, msg: Message, name: str, tiny: bool) -> Any:
        """A delivery of ``msg``: its first, a redelivery, or one that a revoke made stale."""
        return self._claim(msg, name, tiny)

    @rule(target=holders, k=KEY, name=WORKERS, tiny=st.booleans())
    def replay(self, k: int, name: str, tiny: bool) -> Any:
        """A submission (or an operator's replay) delivered at once."""
        return self._claim(self._submit(k, 0), name, tiny)

    def _voided(self, k: int) -> list[Message]:
        """Messages of key ``k`` submitted for a voided generation: older than its record's,
        or the record's own while it is REVOKED / SUPERSEDED."""
        r = self.model.rec(k)
        if r is None:
            return []
        void = r.state in (REVOKED, SUPERSEDED)
        return [
            m
            for m in self.sent
            if m.k == k and (m.generation < r.generation or (void and m.generation == r.generation))
        ]

    @precondition(lambda self: any(self._voided(k) for k in range(len(self.keys))))
    @rule(target=holders, data=st.data())
    def a_voided_generation_arrives(self, data: st.DataObject) -> Any:
        """A message of a voided generation is delivered (a redelivery after a lost ack, a
        campaign's second copy), whatever state the record is in."""
        k = data.draw(st.sampled_from([k for k in range(len(self.keys)) if self._voided(k)]))
        msg = data.draw(st.sampled_from(self._voided(k)), label="voided")
        return self._claim(msg, data.draw(WORKERS, label="name"), tiny=False)

    def _settled_or_absent(self) -> list[int]:
        return [k for k, r in enumerate(self.model.records) if r is None or r.state in SETTLED]

    # One argument, its choices drawn inside: hypothesis orders rules by how many arguments
    # they take and draws the first ones more often (at six, this rule ran in one example of
    # ten). Twice an example at most: it is ten calls, and more runs of it find nothing new.
    @precondition(lambda self: self.comebacks < 2 and self._settled_or_absent())
    @rule(data=st.data())
    def a_voided_generation_comes_back(self, data: st.DataObject) -> None:
        """DESIGN §2's generation rule, made reachable in one step: a DONE effect (run to
        DONE first from no record or FAILED) is revoked (or superseded), resubmitted
        (generation g+1, the same or other values), that attempt goes on to ``ending`` —
        FAILED by the worker's known failure, by the reconciler's "not found" or by an
        operator's resolve --not-executed from UNKNOWN; or DONE, UNKNOWN, RECONCILING, still
        CLAIMED — and then a message of the voided generation is delivered (``early``: one
        is delivered right after the revoke too)."""
        self.comebacks += 1
        k = data.draw(st.sampled_from(self._settled_or_absent()), label="k")
        action = data.draw(st.sampled_from(["revoke", "supersede"]), label="action")
        variant = data.draw(st.sampled_from([0, 1]), label="variant")
        ending = data.draw(st.sampled_from(ENDINGS), label="ending")
        early = data.draw(st.booleans(), label="early")
        name = data.draw(WORKERS, label="name")
        r = self.model.rec(k)
        if r is None or r.state == FAILED:
            first = self._claim(self._submit(k, 0), name, tiny=False)
            assert isinstance(first, Holder), f"k{k}: a claim on no record or FAILED refused"
            self._commit(first, short=False)
        if (r := self.model.rec(k)) is not None and r.state == DONE:
            self._operate(k, action, override=False, short=False)
        if early and (voided := self._voided(k)):
            self._claim(data.draw(st.sampled_from(voided), label="early"), name, tiny=False)
        holder = self._claim(self._submit(k, variant), name, tiny=False)
        if not isinstance(holder, Holder):
            event("voided generation: the resubmission was not granted")
            return
        if ending == "failed by the worker":
            self._fail(holder, short=False)
        elif ending == "done":
            self._commit(holder, short=False)
        elif ending != "claimed":
            self._handover(holder)
            taken = self._takeover(k, "rc1", tiny=False)
            assert taken is not None
            if ending == "failed by the reconciler":
                self._fail(taken, short=False)
            elif ending in ("unknown", "resolved not executed"):
                self._mark_unknown(taken)
            if ending == "resolved not executed":
                self._operate(k, "resolve_failed", override=False, short=False)
        older = self._voided(k)
        event(f"voided generation comes back after {ending}: {'yes' if older else 'none older'}")
        if older:
            self._claim(data.draw(st.sampled_from(older), label="old"), name, tiny=False)

    @precondition(lambda self: self._in(DONE))
    @rule(target=holders, data=st.data())
    def a_voided_record_expires_before_the_resubmission_runs(self, data: st.DataObject) -> Any:
        """A DONE effect is revoked and resubmitted (generation g+1); the revoked record's
        retention ends before that message is delivered: the claim on no record opens it
        under the message's generation (its provider key is g+1's, not the voided one's)."""
        k = data.draw(st.sampled_from(self._in(DONE)), label="k")
        variant = data.draw(st.sampled_from([0, 1]), label="variant")
        self._operate(k, "revoke", override=False, short=False)
        resubmitted = self._submit(k, variant)
        before = self._before(k)
        assert self.ledger.client.pexpire(self._record_key(k), 1)
        self._wait_gone(k)
        self._log("expire", k, before)
        return self._claim(resubmitted, data.draw(WORKERS, label="name"), tiny=False)

    def _heartbeat(self, h: Holder, tiny: bool) -> None:
        before = self._before(h.k)
        ok = self.model.heartbeat(h.k, h.token, live=not tiny)
        got = self.ledger.heartbeat(self.keys[h.k], h.token, lease_s=self._lease(tiny))
        self._log("heartbeat", h.k, before, outcome="ok" if got.ok else "fenced")
        event(f"heartbeat: {'ok' if got.ok else 'fenced'}")
        assert got.ok == ok, f"heartbeat k{h.k} t{h.token}: ledger ok={got.ok}, model ok={ok}"
        if not ok:
            self._unchanged(h.k, before, f"a fenced heartbeat under t{h.token}")
        elif tiny:
            self._wait_lease(h.k)

    def _commit(self, h: Holder, short: bool) -> None:
        before = self._before(h.k)
        settles = before is not None and before["s"] in LEASED
        receipt = self._receipt()
        expect = self.model.commit(h.k, h.token, receipt, "commit")
        got = self.ledger.commit(
            self.keys[h.k], h.token, receipt, retention_s=TINY_S if short else RETAIN_S
        )
        self._log("commit", h.k, before, outcome="ok" if got.ok else "fenced")
        assert got.ok == expect.ok, (
            f"commit k{h.k} t{h.token}: ledger ok={got.ok} ({got.state} t{got.token}), "
            f"model ok={expect.ok}"
        )
        event(f"commit on {_state(before)}: {'ok' if got.ok else 'fenced'}")
        if not expect.ok:
            # Fenced: only the late receipt is added (and FAILED becomes UNKNOWN).
            skip = ("lr", "s", "t", "y") if expect.to_unknown else ("lr",)
            self._unchanged(h.k, before, f"a fenced commit under t{h.token}", *skip)
        elif settles and short:
            self._wait_gone(h.k)

    def _fail(self, h: Holder, short: bool) -> None:
        before = self._before(h.k)
        settles = before is not None and before["s"] in LEASED
        ok = self.model.fail(h.k, h.token, "declined")
        got = self.ledger.fail(
            self.keys[h.k], h.token, reason="declined", retention_s=TINY_S if short else RETAIN_S
        )
        self._log("fail", h.k, before, outcome="ok" if got.ok else "fenced")
        event(f"fail on {_state(before)}: {'ok' if got.ok else 'fenced'}")
        assert got.ok == ok, f"fail k{h.k} t{h.token}: ledger ok={got.ok}, model ok={ok}"
        if not ok:
            self._unchanged(h.k, before, f"a fenced fail under t{h.token}")
        elif settles and short:
            self._wait_gone(h.k)

    def _handover(self, h: Holder) -> None:
        before = self._before(h.k)
        ok = self.model.handover(h.k, h.token, "uncertain")
        got = self.ledger.handover(self.keys[h.k], h.token, reason="uncertain")
        self._log("handover", h.k, before, outcome="ok" if got.ok else "fenced")
        event(f"handover: {'ok' if got.ok else 'fenced'}")
        assert got.ok == ok, f"handover k{h.k} t{h.token}: ledger ok={got.ok}, model ok={ok}"
        if not ok:
            self._unchanged(h.k, before, f"a fenced handover under t{h.token}")

    def _mark_unknown(self, h: Holder) -> None:
        before = self._before(h.k)
        ok = self.model.mark_unknown(h.k, h.token, "lookup unavailable")
        got = self.ledger.mark_unknown(self.keys[h.k], h.token, reason="lookup unavailable")
        self._log("mark_unknown", h.k, before, outcome="ok" if got.ok else "fenced")
        event(f"mark_unknown: {'ok' if got.ok else 'fenced'}")
        assert got.ok == ok, f"mark_unknown k{h.k} t{h.token}: ledger ok={got.ok}, model ok={ok}"
        if not ok:
            self._unchanged(h.k, before, f"a fenced mark_unknown under t{h.token}")

    def _act(self, h: Holder, op: str, tiny: bool, short: bool) -> None:
        """``h`` writes under its token (``tiny``: a 1 ms lease, ``short``: retention)."""
        if op == "heartbeat":
            self._heartbeat(h, tiny=tiny)
        elif op == "commit":
            self._commit(h, short=short)
        elif op == "fail":
            self._fail(h, short=short)
        elif op == "handover":
            self._handover(h)
        else:
            self._mark_unknown(h)

    @rule(h=holders, op=HOLDER_OPS, tiny=st.booleans(), short=SHORT)
    def holder_acts(self, h: Holder, op: str, tiny: bool, short: bool) -> None:
        """Any holder, stale or not, writes under the token it was granted."""
        self._act(h, op, tiny, short)

    def _stale(self) -> list[Holder]:
        return [
            h
            for h in self.granted
            if (r := self.model.rec(h.k)) is not None
            and (r.token != h.token or r.state not in LEASED)
        ]

    @precondition(lambda self: self._stale())
    @rule(data=st.data(), op=HOLDER_OPS, tiny=st.booleans(), short=SHORT)
    def stale_holder_acts(self, data: st.DataObject, op: str, tiny: bool, short: bool) -> None:
        """A holder whose claim was taken over or settled wakes up and writes: fenced (a
        commit leaves a late receipt)."""
        self._act(data.draw(st.sampled_from(self._stale()), label="holder"), op, tiny, short)

    @precondition(lambda self: any(self._current(k) for k in range(len(self.keys))))
    @rule(data=st.data(), op=HOLDER_OPS, tiny=st.booleans(), short=SHORT)
    def live_holder_acts(self, data: st.DataObject, op: str, tiny: bool, short: bool) -> None:
        """The live holder of a key writes (so the happy paths are as likely as fenced ones)."""
        live = [h for k in range(len(self.keys)) if (h := self._current(k))]
        self._act(data.draw(st.sampled_from(live), label="holder"), op, tiny, short)

    # -- reconciler ---------------------------------------------------------------------

    def _leased(self, expired: bool) -> list[int]:
        return [
            k
            for k, r in enumerate(self.model.records)
            if r is not None and r.state in LEASED and not (expired and r.lease_live)
        ]

    @precondition(lambda self: self._leased(expired=False))
    @rule(target=holders, data=st.data(), name=RECONCILERS, tiny=st.booleans())
    def takeover(self, data: st.DataObject, name: str, tiny: bool) -> Any:
        """A reconciler takes a key over: one whose lease ran out when there is one (else
        one with a live lease: refused)."""
        candidates = self._leased(expired=True) or self._leased(expired=False)
        k = data.draw(st.sampled_from(candidates), label="k")
        return self._takeover(k, name, tiny) or multiple()

    def _takeover(self, k: int, name: str, tiny: bool) -> Holder | None:
        before = self._before(k)
        token = self.model.takeover(k, name, live=not tiny)
        got = self.ledger.takeover(self.keys[k], lease_s=self._lease(tiny), holder=name)
        self._log(
            "takeover", k, before, outcome="acquired" if got else "refused",
            now_ms=got and got.now_ms,
        )  # fmt: skip
        event(f"takeover: {'acquired' if got else 'refused'}")
        assert (got and got.token) == token, (
            f"takeover k{k}: ledger {got and got.token}, model {token}"
        )
        if got is None:
            self._unchanged(k, before, "a refused takeover")
            return None
        holder = self._grant(k, got.token, name)
        if tiny:
            self._wait_lease(k)
        return holder

    # -- operator -----------------------------------------------------------------------

    def _in(self, state: str) -> list[int]:
        return [k for k, r in enumerate(self.model.records) if r is not None and r.state == state]

    @precondition(lambda self: self._in(UNKNOWN))
    @rule(
        data=st.data(),
        executed=st.booleans(),
        override=st.sampled_from([False, False, True]),  # late receipts refuse the others
        short=SHORT,
    )
    def resolve(self, data: st.DataObject, executed: bool, override: bool, short: bool) -> None:
        """An operator settles an UNKNOWN effect, with or without overriding late receipts
        (on one that holds late receipts when there is one: the evidence rule)."""
        unknown = self._in(UNKNOWN)
        evidence = [k for k in unknown if (r := self.model.rec(k)) is not None and r.late]
        k = data.draw(st.sampled_from(evidence or unknown), label="k")
        action = "resolve_done" if executed else "resolve_failed"
        self._operate(k, action, override, short)

    @precondition(lambda self: self._in(DONE))
    @rule(data=st.data(), action=st.sampled_from(["revoke", "supersede"]), short=SHORT)
    def void(self, data: st.DataObject, action: str, short: bool) -> None:
        """An operator revokes or supersedes a DONE effect."""
        k = data.draw(st.sampled_from(self._in(DONE)), label="k")
        self._operate(k, action, override=False, short=short)

    @precondition(lambda self: any(self.model.records))
    @rule(data=st.data(), action=st.sampled_from(sorted(OPERATOR)), override=st.booleans())
    def operate_anywhere(self, data: st.DataObject, action: str, override: bool) -> None:
        """An operator action on any record: refused unless the state table allows it."""
        k = data.draw(st.sampled_from([k for k, r in enumerate(self.model.records) if r]))
        self._operate(k, action, override, short=False)

    def _operate(self, k: int, action: str, override: bool, short: bool) -> None:
        before = self._before(k)
        receipt = self._receipt() if action == "resolve_done" else None
        note = f"{action} by op: model"
        ok, evidence = self.model.operate(k, action, note, receipt, override)
        try:
            write = self.ledger.operate(
                self.keys[k],
                action,
                note=note,
                retention_s=TINY_S if short else RETAIN_S,
                receipt=receipt,
                override_evidence=override,
            )
        except TransitionRefusedError as exc:
            self._log(action, k, before, outcome="refused")
            event(f"{action}: refused" + (" (evidence)" if evidence else ""))
            assert not ok, f"{action} k{k} refused by the ledger ({exc.message}), model allows it"
            assert exc.details.get("evidence") == evidence, (
                f"{action} k{k}: refusal evidence {exc.details.get('evidence')}, model {evidence}"
            )
            self._unchanged(k, before, f"a refused {action}")
            return
        self._log(action, k, before, outcome="ok")
        event(f"{action}: done")
        assert ok, f"{action} k{k}: ledger did it ({write.state} t{write.token}), model refuses"
        if short:
            self._wait_gone(k)

    # -- time ---------------------------------------------------------------------------

    @precondition(
        lambda self: any(r is not None and r.state in SETTLED for r in self.model.records)
    )
    @rule(data=st.data())
    def retention_ends(self, data: st.DataObject) -> None:
        """A settled record's retention runs out (its TTL cut short to 1 ms)."""
        settled = [
            k for k, r in enumerate(self.model.records) if r is not None and r.state in SETTLED
        ]
        k = data.draw(st.sampled_from(settled), label="k")
        before = self._before(k)
        assert self.ledger.client.pexpire(self._record_key(k), 1)
        self._wait_gone(k)
        self._log("expire", k, before)
        event("retention ended")

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def a_record_has_one_name_at_a_time(self) -> None:
        """Never a record under both spellings: two copies could disagree, and a claim that
        found the stale one would run the effect again."""
        pipe = self.ledger.client.pipeline(transaction=False)
        for k in range(len(self.keys)):
            pipe.exists(*self._names(k))
        assert all(n <= 1 for n in pipe.execute())

    @invariant()
    def records_agree_with_the_model(self) -> None:
        records = self.ledger.get_many(self.keys)
        # Each key's lease and unknown index entries, in one round trip.
        pipe = self.ledger.client.pipeline(transaction=False)
        for k, key in enumerate(self.keys):
            tag = self._record_key(k).rsplit(":r:", 1)[0]
            pipe.zscore(f"{tag}:leases", key)
            pipe.zscore(f"{tag}:unknown", key)
        scores = pipe.execute()
        for k, key in enumerate(self.keys):
            got, want = records[key], self.model.rec(k)
            if want is None:
                assert got is None, f"k{k}: ledger {got and got.state.value}, model: no record"
                continue
            assert got is not None, f"k{k}: no record, model {want.state} t{want.token}"
            assert got.token >= self.top[k], (
                f"k{k}: token {got.token} after the key showed {self.top[k]}"
            )
            self.top[k] = got.token
            late = [(lr["token"], lr["receipt"]) for lr in got.late_receipts]
            seen = (got.state.value, got.token, got.generation, got.fingerprint, got.receipt)
            model = (want.state, want.token, want.generation, want.fingerprint, want.receipt)
            assert (seen, late) == (model, want.late), f"k{k}: ledger {got.as_dict()}\nmodel {want}"
            assert (got.holder, got.attempts) == (want.holder, want.attempts), (
                f"k{k}: holder/attempts {(got.holder, got.attempts)}, model "
                f"{(want.holder, want.attempts)}"
            )
            assert (got.ttl_ms is not None) == (want.state in SETTLED), (
                f"k{k}: {want.state} with ttl {got.ttl_ms}"
            )
            # Explained: the last history entry is the last transition.
            assert got.history, f"k{k}: no history"
            last = got.history[-1]
            state, token, note = want.last
            assert (last.state, last.token) == (state, token) and (
                last.note == note if want.exact else note in last.note
            ), f"k{k}: last history entry {last}, model {want.last}"
            score = scores[2 * k]
            deadline = got.lease_deadline_ms if want.state in LEASED else None
            assert (score and int(score)) == deadline, (
                f"k{k}: lease index {score}, record {want.state} deadline {deadline}"
            )
            in_unknown = scores[2 * k + 1] is not None
            assert in_unknown == (want.state == UNKNOWN), f"k{k}: unknown index {in_unknown}"
        counted = self.ledger.counts()
        got_counts = {state: counted.get((state, "charge"), 0) for state in self.model.counts()}
        assert got_counts == self.model.counts(), (
            f"counters {got_counts}, model {self.model.counts()}"
        )

    @invariant()
    def design_rules_hold_over_the_whole_run(self) -> None:
        """Every call so far, every record's whole history: tests/model/design_rules.py."""
        self.design.check(self.trace)

    @invariant()
    def no_two_holders_of_one_live_token(self) -> None:
        for k in range(len(self.keys)):
            r = self.model.rec(k)
            if r is None or r.state not in LEASED:
                continue
            holding = [h for h in self.granted if h.k == k and h.token == r.token]
            assert len(holding) <= 1, f"k{k}: {holding} all hold token {r.token}"


@pytest.fixture(scope="module")
def model_server(
    redis_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """One server per binary (the system Redis 7 and the embedded 6.2) for the module."""
    # AOF on (the ledger refuses a volatile Redis), without an fsync per write: this test is
    # about the state table, not about crashes, and an fsync per write would cost most of it.
    root = tmp_path_factory.mktemp("model")
    fsync = ("--appendfsync", "everysec")
    with RedisServer(redis_binary, root, aof=True, extra_args=fsync) as srv:
        yield srv


# A failure is shrunk for up to 5 minutes before hypothesis reports it: let it report.
# Both protocols, spelled out: redis-py 8 speaks RESP3 unless told otherwise, 6 and 7 (in
# the supported range) RESP2, and the replies of the ledger's scripts differ between them
# (a Lua false is a null in RESP2 and a boolean in RESP3).
@pytest.mark.timeout(900 + EXAMPLES * STEPS // 5)
@pytest.mark.parametrize("protocol", [3, 2], ids=["resp3", "resp2"])
def test_the_ledger_agrees_with_its_state_table_model(
    model_server: RedisServer, protocol: int
) -> None:
    LedgerMachine.url = f"{model_server.url}?protocol={protocol}"
    run_state_machine_as_test(LedgerMachine, settings=PROFILE)
