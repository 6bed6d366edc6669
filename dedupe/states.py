"""The ledger's state sets: the one home in Python for what ``ledger.lua`` decides per
state, for the code that must predict it (the console's action buttons, a campaign's
recipient view, the demo's "settled", the operator's replay check). The script still
decides every transition; ``tests/integration/test_state_sets.py`` drives a record into
each state and checks that the script agrees with these sets."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .records import State

__all__ = ["AT_REST", "CLAIMABLE", "HELD", "OPERATOR_ACTIONS", "SETTLED"]

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
