"""The ledger's state sets: the one home in Python for what ``ledger.lua`` decides per
state, for the code that must predict it (the console's action buttons, a campaign's
recipient view, the demo's "settled", the operator's replay check). The script still
decides every transition; ``tests/integration/test_state_sets.py`` drives a record into
each state and checks that the script agrees with these sets.

The vocabularies read from these states live here too: which states an operator pages
through (``IndexedState``) and what a campaign's recipient reads as (``RecipientState``)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from .records import State

__all__ = [
    "AT_REST", "CLAIMABLE", "HELD", "INDEXED", "OPERATOR_ACTIONS", "RECIPIENT_STATE", "SETTLED",
    "IndexedState", "RecipientState",
]  # fmt: skip

#: A claim on a record in one of these states is granted (as on no record at all).
CLAIMABLE = frozenset({State.FAILED, State.REVOKED, State.SUPERSEDED})
#: Settled: the record carries the tool's retention and expires with it; the others
#: (CLAIMED, RECONCILING, UNKNOWN) never expire.
SETTLED = frozenset({State.DONE, State.FAILED, State.REVOKED, State.SUPERSEDED})
#: A holder (a worker or a reconciler) owns the claim: a claim answers in_flight/blocked.
HELD = frozenset({State.CLAIMED, State.RECONCILING})
#: Nothing changes any more without a new submission or an operator.
AT_REST = SETTLED | {State.UNKNOWN}
#: The operator actions the state table allows from each state (replay also needs the
#: stored request); every other state refuses them all.
OPERATOR_ACTIONS: Mapping[State, tuple[str, ...]] = MappingProxyType(
    {
        State.UNKNOWN: ("resolve",),
        State.DONE: ("revoke", "supersede"),
        State.FAILED: ("replay",),
        State.REVOKED: ("replay",),
        State.SUPERSEDED: ("replay",),
    }
)


class IndexedState(StrEnum):
    """The states an operator pages through: each has an index (the settled states expire,
    and only a scan finds them), listed in this order: what waits for an operator, then
    what a reconciler holds, then what a worker holds."""

    #: Blocked until an operator acts (the ``unknown`` index, by when it became UNKNOWN).
    UNKNOWN = State.UNKNOWN.value
    #: Held by a reconciler (the ``leases`` index, by lease deadline).
    RECONCILING = State.RECONCILING.value
    #: Held by a worker (the ``leases`` index, by lease deadline).
    CLAIMED = State.CLAIMED.value


#: The ledger states of ``IndexedState``, in its order.
INDEXED: tuple[State, ...] = tuple(State(s.value) for s in IndexedState)


class RecipientState(StrEnum):
    """A campaign recipient's state, as its producer reads it (from its record's)."""

    #: No record yet, or a record a worker or a reconciler holds: it settles by itself.
    PENDING = "pending"
    #: Executed (DONE).
    DONE = "done"
    #: Known not executed (FAILED): submitting the campaign again sends it.
    FAILED = "failed"
    #: Uncertain (UNKNOWN): blocked until an operator resolves it.
    UNKNOWN = "unknown"
    #: Revoked or superseded by an operator.
    REVOKED = "revoked"


#: The recipient state of a record in each ledger state (``None``: no record yet).
RECIPIENT_STATE: Mapping[State | None, RecipientState] = MappingProxyType(
    {
        None: RecipientState.PENDING,
        **dict.fromkeys(HELD, RecipientState.PENDING),
        State.DONE: RecipientState.DONE,
        State.FAILED: RecipientState.FAILED,
        State.UNKNOWN: RecipientState.UNKNOWN,
        State.REVOKED: RecipientState.REVOKED,
        State.SUPERSEDED: RecipientState.REVOKED,
    }
)
