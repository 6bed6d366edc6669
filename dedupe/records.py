"""The ledger's vocabulary: states, claim outcomes, and the typed views of what it returns.

The transitions themselves live only in ``ledger.lua``; this module names and reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from .identity import idempotency_key

__all__ = [
    "Claim",
    "ClaimOutcome",
    "EffectRecord",
    "PendingMarker",
    "State",
    "Submission",
    "SubmitStatus",
    "Takeover",
    "Transition",
    "Write",
]


class State(StrEnum):
    CLAIMED = "CLAIMED"
    DONE = "DONE"
    FAILED = "FAILED"
    RECONCILING = "RECONCILING"
    UNKNOWN = "UNKNOWN"
    REVOKED = "REVOKED"
    SUPERSEDED = "SUPERSEDED"


class ClaimOutcome(StrEnum):
    ACQUIRED = "acquired"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    IN_FLIGHT = "in_flight"
    BLOCKED = "blocked"
    # Older than the provider's window by the ledger's clock, where a claim would be
    # granted: never executed.
    STALE = "stale"


def _iso(at_ms: int) -> str:
    """A ledger time (server ms) as ISO 8601, UTC, to the millisecond."""
    return datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds")


def _json_or_none(text: str | None) -> Any:
    return json.loads(text) if text else None


# The enums by value, read from a reply without the Enum call's machinery (a value not
# here goes through the call, which raises as before).
_OUTCOMES = {o.value: o for o in ClaimOutcome}
_STATES = {s.value: s for s in State}


def _outcome(value: str) -> ClaimOutcome:
    return _OUTCOMES.get(value) or ClaimOutcome(value)


def _state(value: str) -> State:
    return _STATES.get(value) or State(value)


@dataclass(frozen=True)
class Claim:
    """The ledger's answer to a claim. ``token`` is the fencing token to write under when
    acquired, else the record's current token; ``receipt`` is set on a duplicate. A
    duplicate is of a DONE record, or of a REVOKED / SUPERSEDED one when the message was
    submitted for the voided generation (``state`` says which). ``remaining_ms`` (in_flight
    / blocked): ms to the lease deadline on the server's clock, negative once it has
    passed, None when the record has none (UNKNOWN)."""

    outcome: ClaimOutcome
    key: str
    token: int
    generation: int = 0
    state: State | None = None
    receipt: dict[str, Any] | None = None
    remaining_ms: int | None = None
    # stale: the message's age on the ledger's clock
    age_ms: int | None = None

    @property
    def acquired(self) -> bool:
        return self.outcome is ClaimOutcome.ACQUIRED

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.key, self.generation)

    @classmethod
    def from_reply(cls, key: str, reply: list[Any]) -> Claim:
        outcome = _outcome(reply[0])
        if outcome is ClaimOutcome.ACQUIRED:
            return cls(outcome, key, int(reply[1]), int(reply[2]), State.CLAIMED)
        if outcome is ClaimOutcome.DUPLICATE:
            receipt = _json_or_none(reply[3])
            return cls(outcome, key, int(reply[1]), int(reply[2]), _state(reply[4]), receipt)
        if outcome is ClaimOutcome.STALE:
            state = None if reply[1] == "ABSENT" else _state(reply[1])
            return cls(outcome, key, int(reply[2]), state=state, age_ms=int(reply[3]))
        remaining = reply[3] if len(reply) > 3 else None
        return cls(
            outcome,
            key,
            int(reply[2]),
            state=_state(reply[1]),
            remaining_ms=None if remaining is None else int(remaining),
        )


class SubmitStatus(StrEnum):
    ENQUEUE = "enqueue"
    DONE = "done"
    CONFLICT = "conflict"
    PENDING = "pending"
    BLOCKED = "blocked"


@dataclass(frozen=True)
class Submission:
    """The ledger's answer to a producer: enqueue, or why not (with the receipt if done).

    ``generation`` is the generation a message enqueued now is submitted for: the record's
    (0 without one), or the next after a revoke / supersede. The message must carry it (the
    envelope's ``g``): a claim opens a new generation only for a message submitted after
    the revoke, never for an older one still in the queue."""

    status: SubmitStatus
    key: str
    state: str
    token: int
    receipt: dict[str, Any] | None = None
    generation: int = 0
    # The ledger's time at submit (ms): the message carries it; its age is judged on it.
    submitted_ms: int = 0
    # pending because of a confirmed marker: the message id it stands for ('' otherwise),
    # which the producer checks the broker still holds.
    message_id: str = ""

    @classmethod
    def from_reply(cls, key: str, reply: list[Any]) -> Submission:
        status, state, token, receipt, generation, now, message_id = reply
        return cls(
            SubmitStatus(status), key, str(state), int(token), _json_or_none(receipt),
            int(generation), int(now), str(message_id),
        )  # fmt: skip


@dataclass(frozen=True)
class PendingMarker:
    """A key only a broker message stands for (``Ledger.markers``): its record's state
    (ABSENT: none), the message id the marker names, whether the broker's acceptance
    confirmed it (else a reservation), and the ms before it lapses."""

    key: str
    state: str
    tool: str | None
    message_id: str
    confirmed: bool
    ttl_ms: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "state": self.state, "tool": self.tool,
            "message_id": self.message_id, "confirmed": self.confirmed, "ttl_ms": self.ttl_ms,
        }  # fmt: skip


@dataclass(frozen=True)
class Write:
    """Result of a token-guarded write. ``fenced``: the token was stale and nothing changed
    (a fenced commit's receipt was kept as a late receipt)."""

    ok: bool
    state: str
    token: int

    @property
    def fenced(self) -> bool:
        return not self.ok

    @classmethod
    def from_reply(cls, reply: list[Any]) -> Write:
        return cls(reply[0] == "ok", str(reply[1]), int(reply[2]))


@dataclass(frozen=True)
class Takeover:
    """A record the reconciler now holds as RECONCILING under ``token``."""

    key: str
    token: int
    generation: int
    tool: str
    request: dict[str, Any] | None
    attempts: int
    claimed_ms: int
    late_receipts: list[Any]
    reconciling_since_ms: int
    rounds: int
    now_ms: int

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.key, self.generation)


@dataclass(frozen=True)
class Transition:
    state: str
    token: int
    at_ms: int
    note: str


@dataclass(frozen=True)
class EffectRecord:
    """A full ledger record, as ``effectq inspect`` shows it."""

    key: str
    state: State
    token: int
    fingerprint: str
    generation: int
    tool: str
    attempts: int
    created_ms: int
    lease_deadline_ms: int | None
    holder: str | None
    request: dict[str, Any] | None
    receipt: dict[str, Any] | None
    raw_response: str | None
    late_receipts: list[dict[str, Any]] = field(default_factory=list)
    history: list[Transition] = field(default_factory=list)
    ttl_ms: int | None = None

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.key, self.generation)

    @property
    def reason(self) -> str:
        """The note of the latest transition: why it is in its state."""
        return self.history[-1].note if self.history else ""

    @classmethod
    def from_blob(cls, key: str, blob: str, ttl_ms: int | None = None) -> EffectRecord:
        d = json.loads(blob)
        receipt_text = d.get("r")
        late = d.get("lr") or []
        return cls(
            key=key,
            state=State(d["s"]),
            token=int(d["t"]),
            fingerprint=d["f"],
            generation=int(d["g"]),
            tool=d["tool"],
            attempts=int(d.get("n", 0)),
            created_ms=int(d.get("c", 0)),
            lease_deadline_ms=int(d["d"]) if "d" in d else None,
            holder=d.get("h"),
            request=_json_or_none(d.get("q")),
            receipt=_json_or_none(receipt_text),
            # Absent ``raw`` means the provider's raw response was the receipt itself.
            raw_response=d.get("raw", receipt_text),
            late_receipts=[
                {"token": int(t), "receipt": _json_or_none(r), "at_ms": int(ms)}
                for t, r, ms in (late if isinstance(late, list) else [])
            ],
            history=[Transition(s, int(t), int(ms), note) for s, t, ms, note in d.get("y", [])],
            ttl_ms=ttl_ms if ttl_ms is not None and ttl_ms >= 0 else None,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "state": self.state.value,
            "token": self.token,
            "generation": self.generation,
            "idempotency_key": self.idempotency_key,
            "tool": self.tool,
            "fingerprint": self.fingerprint,
            "attempts": self.attempts,
            "created_ms": self.created_ms,
            "lease_deadline_ms": self.lease_deadline_ms,
            "holder": self.holder,
            "request": self.request,
            "receipt": self.receipt,
            "raw_response": self.raw_response,
            "late_receipts": self.late_receipts,
            # ISO beside the ms: what an on-call reads (the CLI and the API alike)
            "history": [{**t.__dict__, "at": _iso(t.at_ms)} for t in self.history],
            "reason": self.reason,
            "ttl_ms": self.ttl_ms,
        }
