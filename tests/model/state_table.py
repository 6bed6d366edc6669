"""A pure-Python model of the ledger's state table (DESIGN.md §2 + CONTRACT.md "Ledger").

It knows nothing of Redis: each method says what the ledger must answer to one call and
applies the transition to the model. Time is not modelled as a clock: the state machine
only uses leases that are either long (live for the whole example) or tiny and waited out
on the server's clock, so a lease is simply ``live`` or not.

Settled records (DONE, FAILED, REVOKED, SUPERSEDED) carry a TTL; when one expires the key
is absent again, and the next fresh record's first token is its bucket's floor + 1 (the
floor's INCR: every fresh record raises it), the floor being raised to a record's token
whenever a record is saved with a TTL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CLAIMED, DONE, FAILED = "CLAIMED", "DONE", "FAILED"
RECONCILING, UNKNOWN = "RECONCILING", "UNKNOWN"
REVOKED, SUPERSEDED = "REVOKED", "SUPERSEDED"

SETTLED = frozenset({DONE, FAILED, REVOKED, SUPERSEDED})  # saved with a TTL
LEASED = frozenset({CLAIMED, RECONCILING})  # in the bucket's lease index
FREE = frozenset({FAILED, REVOKED, SUPERSEDED})  # a claim may be granted
COUNTED = frozenset({CLAIMED, RECONCILING, UNKNOWN})  # in the bucket's stats hash
LATE = 8  # late receipts kept per record

OPERATOR = {
    "resolve_done": (UNKNOWN, DONE),
    "resolve_failed": (UNKNOWN, FAILED),
    "revoke": (DONE, REVOKED),
    "supersede": (DONE, SUPERSEDED),
}


@dataclass
class Rec:
    state: str
    token: int
    generation: int
    fingerprint: str
    attempts: int
    holder: str | None = None
    lease_live: bool = False
    receipt: dict[str, Any] | None = None
    late: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    # The last history entry: (state, token, note); ``exact`` False means ``note`` need
    # only occur in it (notes the ledger words itself may carry more words).
    last: tuple[str, int, str] = ("", 0, "")
    exact: bool = True


@dataclass(frozen=True)
class ClaimExpect:
    outcomes: frozenset[str]
    token: int  # the granted token when acquired, else the record's
    generation: int


@dataclass(frozen=True)
class Marker:
    fingerprint: str
    message_id: str
    confirmed: bool


@dataclass(frozen=True)
class SubmitExpect:
    statuses: frozenset[str]
    generation: int
    receipt: dict[str, Any] | None


@dataclass(frozen=True)
class CommitExpect:
    ok: bool
    late: bool  # the receipt is appended to the record's late receipts
    to_unknown: bool  # ... and it lands on FAILED: the record becomes UNKNOWN


class Model:
    """Records of ``keys`` effect keys (indexes 0..keys-1) in buckets ``bucket_of[k]``."""

    def __init__(self, bucket_of: list[int]) -> None:
        self.bucket_of = bucket_of
        self.records: list[Rec | None] = [None] * len(bucket_of)
        self.floor: dict[int, int] = {}
        # Each key's pending marker (None: none): the fingerprint and message id it names,
        # and whether the producer confirmed it (the broker took that message). It outlives
        # records, and only a commit clears it. A marker refuses another fingerprint; only a
        # confirmed one answers "pending", to another message id.
        self.marker: list[Marker | None] = [None] * len(bucket_of)

    def rec(self, k: int) -> Rec | None:
        return self.records[k]

    def _move(self, r: Rec, state: str, token: int, note: str, *, exact: bool = True) -> None:
        r.state, r.token = state, token
        r.last, r.exact = (state, token, note), exact
        if state not in LEASED:
            r.holder, r.lease_live = None, False

    def _saved(self, k: int) -> None:
        """The record was saved: with a TTL when settled, which raises the bucket's floor."""
        r = self.records[k]
        if r is not None and r.state in SETTLED:
            bucket = self.bucket_of[k]
            self.floor[bucket] = max(self.floor.get(bucket, 0), r.token)

    # -- producer -------------------------------------------------------------------------

    def submit(self, k: int, fp: str, message_id: str) -> SubmitExpect:
        r = self.records[k]
        if r is None or r.state in FREE:
            bumped = r is not None and r.state in (REVOKED, SUPERSEDED)
            generation = 0 if r is None else r.generation + (1 if bumped else 0)
            marker = self.marker[k]
            if marker is not None and marker.fingerprint != fp:
                return SubmitExpect(frozenset({"conflict"}), generation, None)
            if marker is not None and marker.confirmed and marker.message_id != message_id:
                return SubmitExpect(frozenset({"pending"}), generation, None)
            if marker != Marker(fp, message_id, confirmed=True):
                self.marker[k] = Marker(fp, message_id, confirmed=False)  # its reservation
            return SubmitExpect(frozenset({"enqueue"}), generation, None)
        if r.fingerprint != fp:
            return SubmitExpect(frozenset({"conflict"}), r.generation, None)
        if r.state == DONE:
            return SubmitExpect(frozenset({"done"}), r.generation, r.receipt)
        if r.state == RECONCILING or (r.state == CLAIMED and r.lease_live):
            return SubmitExpect(frozenset({"pending"}), r.generation, None)
        return SubmitExpect(frozenset({"blocked"}), r.generation, None)

    def confirm(self, k: int, fp: str, message_id: str) -> Marker | None:
        """The broker took this message: its own marker, reserved or confirmed, is confirmed;
        any other (gone, or written by a later submission) stays as it is. The marker after."""
        marker = self.marker[k]
        if marker is not None and (marker.fingerprint, marker.message_id) == (fp, message_id):
            self.marker[k] = Marker(fp, message_id, confirmed=True)
        return self.marker[k]

    # -- worker -------------------------------------------------------------------------

    def claim(self, k: int, fp: str, generation: int, holder: str, live: bool) -> ClaimExpect:
        r = self.records[k]
        if r is None:
            # A record that expired took its generation along: the message's stays its own.
            # The token is the INCR of the bucket's floor.
            token = self.floor[self.bucket_of[k]] = self.floor.get(self.bucket_of[k], 0) + 1
            r = Rec(CLAIMED, token, generation, fp, 1)
            self._move(r, CLAIMED, token, "claim", exact=False)
            r.holder, r.lease_live = holder, live
            self.records[k] = r
            return ClaimExpect(frozenset({"acquired"}), token, generation)
        if generation < r.generation:
            # A message of a voided generation, in any state: never runs, never rewrites.
            return ClaimExpect(frozenset({"duplicate"}), r.token, generation)
        if r.state in (REVOKED, SUPERSEDED) and generation == r.generation:
            # A message queued before the revoke: a duplicate of the voided generation.
            if r.fingerprint != fp:
                return ClaimExpect(frozenset({"duplicate", "conflict"}), r.token, r.generation)
            return ClaimExpect(frozenset({"duplicate"}), r.token, r.generation)
        if r.state in FREE:
            # FAILED: this generation's key is free, for this message's values (its
            # generation is the record's or, after an expiry, a later one).
            r.generation = r.generation + 1 if r.state != FAILED else generation
            r.fingerprint, r.receipt = fp, None
            r.attempts += 1
            self._move(r, CLAIMED, r.token + 1, "claim", exact=False)
            r.holder, r.lease_live = holder, live
            return ClaimExpect(frozenset({"acquired"}), r.token, r.generation)
        if r.fingerprint != fp:
            return ClaimExpect(frozenset({"conflict"}), r.token, r.generation)
        if r.state == DONE:
            return ClaimExpect(frozenset({"duplicate"}), r.token, r.generation)
        if r.state == RECONCILING or (r.state == CLAIMED and r.lease_live):
            return ClaimExpect(frozenset({"in_flight"}), r.token, r.generation)
        return ClaimExpect(frozenset({"blocked"}), r.token, r.generation)

    def heartbeat(self, k: int, token: int, live: bool) -> bool:
        r = self.records[k]
        if r is None or r.token != token or r.state not in LEASED:
            return False
        r.lease_live = live
        return True

    def commit(self, k: int, token: int, receipt: dict[str, Any], note: str) -> CommitExpect:
        r = self.records[k]
        if r is not None and r.token == token and r.state == DONE:
            return CommitExpect(ok=True, late=False, to_unknown=False)  # a retried commit
        if r is None:
            return CommitExpect(ok=False, late=False, to_unknown=False)
        if r.token != token or r.state not in LEASED:
            r.late = [*r.late, (token, receipt)][-LATE:]
            if r.state == FAILED:
                # Evidence of execution on a record said to be not executed: the operator
                # must look; the record blocks claims and replay meanwhile.
                self._move(r, UNKNOWN, r.token + 1, "late receipt", exact=False)
                return CommitExpect(ok=False, late=True, to_unknown=True)
            return CommitExpect(ok=False, late=True, to_unknown=False)
        r.receipt = receipt
        self._move(r, DONE, token, note)
        self._saved(k)
        self.marker[k] = None
        return CommitExpect(ok=True, late=False, to_unknown=False)

    def fail(self, k: int, token: int, reason: str) -> bool:
        r = self.records[k]
        if r is not None and r.token == token and r.state == FAILED:
            return True  # a retried fail
        if r is None or r.token != token or r.state not in LEASED:
            return False
        self._move(r, FAILED, token, reason)
        self._saved(k)
        return True

    def handover(self, k: int, token: int, reason: str) -> bool:
        r = self.records[k]
        if r is None or r.token != token or r.state != CLAIMED:
            return False
        holder = r.holder
        self._move(r, CLAIMED, token, "handover: " + reason, exact=False)
        r.holder, r.lease_live = holder, False
        return True

    # -- reconciler -------------------------------------------------------------------

    def takeover(self, k: int, holder: str, live: bool) -> int | None:
        r = self.records[k]
        if r is None or r.state not in LEASED or r.lease_live:
            return None
        self._move(r, RECONCILING, r.token + 1, "takeover from " + r.state, exact=False)
        r.holder, r.lease_live = holder, live
        return r.token

    def mark_unknown(self, k: int, token: int, reason: str) -> bool:
        r = self.records[k]
        if r is None or r.token != token or r.state != RECONCILING:
            return False
        self._move(r, UNKNOWN, token, reason)
        return True

    # -- operator ---------------------------------------------------------------------

    def operate(
        self,
        k: int,
        action: str,
        note: str,
        receipt: dict[str, Any] | None,
        override_evidence: bool,
    ) -> tuple[bool, int | None]:
        """(ok, evidence): evidence is the number of late receipts that refused it."""
        source, target = OPERATOR[action]
        r = self.records[k]
        if r is None or r.state != source:
            return False, None
        if action == "resolve_failed" and r.late and not override_evidence:
            return False, len(r.late)
        if target == DONE:
            r.receipt = receipt
        self._move(r, target, r.token + 1, note)
        self._saved(k)
        return True, None

    # -- time -------------------------------------------------------------------------

    def expire(self, k: int) -> None:
        """A settled record's retention ran out: the key is absent again."""
        r = self.records[k]
        assert r is not None and r.state in SETTLED
        self.records[k] = None

    def counts(self) -> dict[str, int]:
        """State -> records, for the states the ledger counts (they never expire)."""
        totals = dict.fromkeys(COUNTED, 0)
        for r in self.records:
            if r is not None and r.state in COUNTED:
                totals[r.state] += 1
        return totals
