"""A tool's spec: what names its effect, what the effect carries, how long things last.

Plain data (no Dramatiq), so the reconciler and operators read the same declaration the
workers run. ``workers.effect_tool`` builds one from its decorator arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .errors import SpecError
from .normalize import Normalizer, resolve_normalizer

__all__ = [
    "TOOL_NAME",
    "EffectLookup",
    "Found",
    "Lookup",
    "LookupContext",
    "LookupResult",
    "NotFound",
    "ToolSpec",
    "Unavailable",
]

#: A tool's name, and each of its actions: lowercase, as keys and metric labels carry it.
#: Unanchored (``fullmatch`` checks one; a schema anchors it).
TOOL_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
DAY = 86400.0
#: How long a settled record is kept when its tool does not say (never shorter than the
#: provider's window).
DEFAULT_RETENTION_S = 7 * DAY


@dataclass(frozen=True)
class Found:
    """The provider has the effect: its receipt (parsed) and raw response (as sent)."""

    receipt: dict[str, Any]
    raw: str | None = None


@dataclass(frozen=True)
class NotFound:
    """The provider has no record. Only an authoritative answer may ever mean "not executed"."""

    authoritative: bool = True


@dataclass(frozen=True)
class Unavailable:
    """The provider could not say. ``settles_at_ms``: the lookup's method cannot rule the
    effect out before this ledger-server time (its results lag): the reconciler asks again
    then, inside the provider's window, instead of spending its budget on the wait."""

    reason: str
    settles_at_ms: int | None = None


LookupResult = Found | NotFound | Unavailable


@runtime_checkable
class Lookup(Protocol):
    """Asks the provider what really happened to an effect (DESIGN §4)."""

    def lookup(self, idempotency_key: str, token: int | None = None) -> LookupResult: ...


@dataclass(frozen=True)
class LookupContext:
    """The effect a lookup asks about, as the reconciler's takeover read it (DESIGN §4).

    ``args`` are the arguments as submitted (identity, bound and free values), ``claimed_ms``
    the ledger server's time of the claim and ``now_ms`` its time at the takeover: a lookup
    whose method lags or forgets measures its window on them. ``late_receipts`` are the
    receipts holders reported after losing their claim (evidence, such as a provider's
    object id, recorded so far).
    """

    key: str
    idempotency_key: str
    token: int | None
    tool: str
    generation: int
    claimed_ms: int
    now_ms: int
    scope: str | None = None
    action: str | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    late_receipts: tuple[Any, ...] = ()


@runtime_checkable
class EffectLookup(Lookup, Protocol):
    """A lookup that reads the whole effect, not only its key: the reconciler calls
    ``lookup_effect`` when a tool's lookup has it, ``lookup`` otherwise."""

    def lookup_effect(self, effect: LookupContext) -> LookupResult: ...


@dataclass(frozen=True)
class ToolSpec:
    """Declaration of one side-effecting tool.

    ``identity`` fields resolve the target and enter the key (with tool, action, scope and
    generation); ``bound`` fields are effect-bearing and enter the fingerprint; ``free``
    fields (generated text) enter neither. A field may be both identity and bound.
    """

    name: str
    identity: tuple[str, ...]
    bound: tuple[str, ...] = ()
    free: tuple[str, ...] = ()
    action: str = "default"
    actions: tuple[str, ...] = ()
    normalizers: Mapping[str, Any] = field(default_factory=dict)
    lease_s: float = 30.0
    provider_window_s: float = DAY
    retention_s: float = DEFAULT_RETENTION_S
    settle_s: float = 5.0
    lookup: Lookup | None = None
    # Whether the provider deduplicates by the idempotency key effectq sends: the last guard
    # when the ledger forgets an acknowledged write (appendfsync everysec/no on a host
    # crash). A tool whose provider does not refuses such a ledger (workers.settings).
    provider_idempotency: bool = False

    def __post_init__(self) -> None:
        if self.action not in self.actions:
            # The default action is always allowed; ``actions`` lists the others.
            object.__setattr__(self, "actions", (self.action, *self.actions))
        for label, value in (("tool name", self.name), *(("action", a) for a in self.actions)):
            # fullmatch: "$" alone lets a trailing newline through ("charge\n").
            if not TOOL_NAME.fullmatch(value):
                shown = f"^{TOOL_NAME.pattern}$"
                raise SpecError(f"{label} {value!r} must match {shown}", tool=self.name)
        declared = (*self.identity, *self.bound, *self.free)
        if overlap := set(self.free) & (set(self.identity) | set(self.bound)):
            raise SpecError(f"free fields also declared effect-bearing: {sorted(overlap)}")
        if "scope" in declared:
            raise SpecError("'scope' is given separately, not as an argument", tool=self.name)
        if unknown := set(self.normalizers) - set(declared):
            raise SpecError(f"normalizers for undeclared fields: {sorted(unknown)}")
        for value in self.normalizers.values():
            resolve_normalizer(value)
        if not self.lease_s > 0 or not self.provider_window_s > 0 or not self.settle_s >= 0:
            raise SpecError("lease, provider window and settle window must be positive")
        # A DONE record that vanishes before the provider forgets the key would let a late
        # redelivery run again under a key the provider no longer deduplicates.
        if self.retention_s < self.provider_window_s:
            raise SpecError("retention_s must not be shorter than provider_window_s")

    @property
    def fields(self) -> frozenset[str]:
        return frozenset((*self.identity, *self.bound, *self.free))

    def normalizer(self, name: str) -> Normalizer | None:
        value = self.normalizers.get(name)
        return None if value is None else resolve_normalizer(value)
