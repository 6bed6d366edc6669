"""What a provider adapter decides, and the one rule every lookup method obeys (DESIGN §4).

An adapter sits on both sides of an effect:

- ``execute`` (called from the tool body) attaches effectq's key where the provider keeps
  it, sends the provider's own idempotency key (``provider_key``: derived from the effect's
  idempotency key, which already carries the generation, within the provider's length and
  charset), maps the provider's answer to the claim's outcome, and returns the receipt with
  the provider's object id in it (``evidence``):

      the provider did it                   → the receipt (the worker commits DONE)
      it certainly did not (refused, 429
        before execution)                   → NotExecutedError / RejectedError: FAILED
      same key, another payload             → ConflictError: never "not executed", the
                                              reconciler asks the provider what ran
      anything else (5xx, timeout, a saved
        500 replayed)                       → the SDK's error, uncertain: handed over

- ``lookup_effect`` answers Found / NotFound / Unavailable for the effect as the reconciler
  took it over. NotFound is *earned*: ``judge`` grants it only to a search that covered the
  whole window — every page read, no page capped, no rate limit met, the claim older than
  the method's settle window and younger than its retention. Anything less is Unavailable
  (the reconciler retries within its budget, then UNKNOWN), never "not executed".

The SDKs are imported inside each adapter module's functions, so the core install does not
need them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, overload

from dedupe.spec import Found, LookupContext, LookupResult, NotFound, Unavailable

__all__ = [
    "EVIDENCE",
    "CallLike",
    "Executed",
    "Method",
    "Page",
    "RateLimited",
    "Scan",
    "combine",
    "evidence",
    "judge",
    "provider_key",
    "scan",
    "setting",
]

T = TypeVar("T")

#: Where an adapter's receipt keeps the provider's object id (read back from late receipts).
EVIDENCE = "provider_object_id"
_HEX = re.compile(r"[0-9a-f]+")


class CallLike(Protocol):
    """What ``execute`` needs from the worker's ``EffectCall`` (read structurally: the
    reconciler floor does not import workers)."""

    @property
    def key(self) -> str: ...

    @property
    def idempotency_key(self) -> str: ...


class Executed(NamedTuple):
    """An adapter's answer to a successful call: ``ToolResult(*executed)`` in a tool."""

    receipt: dict[str, Any]
    raw: str | None = None


def provider_key(
    idempotency_key: str, *, max_len: int, prefix: str = "effectq-", dash: bool = True
) -> str:
    """The provider's idempotency key for an effect: ``prefix`` + the effect's idempotency
    key (64 hex, generation included), cut to ``max_len``. The key is a SHA-256, so a cut
    keeps at least 128 bits; a provider too short for that, or for the prefix, is refused
    rather than given a key that could collide."""
    if not _HEX.fullmatch(idempotency_key):
        raise ValueError("an effect idempotency key is lowercase hex")
    if not dash:
        prefix = prefix.replace("-", "").replace("_", "")
    if max_len - len(prefix) < 32:
        prefix = ""
    if max_len < 32:
        raise ValueError(f"a provider key of {max_len} characters cannot hold 128 bits")
    return (prefix + idempotency_key)[:max_len]


@overload
def setting(value: str | Callable[[], str]) -> str: ...
@overload
def setting(value: str | Callable[[], str] | None) -> str | None: ...
def setting(value: str | Callable[[], str] | None) -> str | None:
    """A credential or address an adapter was given as a value or as a callable read when
    its client is first built (a secret rotated, a fake's port known late)."""
    return value() if callable(value) else value


def evidence(effect: LookupContext) -> list[str]:
    """The provider object ids recorded so far for an effect (late receipts), newest last."""
    ids: list[str] = []
    for receipt in effect.late_receipts:
        if isinstance(receipt, Mapping) and isinstance(receipt.get(EVIDENCE), str):
            ids.append(receipt[EVIDENCE])
    return ids


class RateLimited(Exception):
    """A page fetch met the provider's rate limit (HTTP 429): the scan stops incomplete."""


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a provider's list or search.

    ``next``: the cursor of the next page (None: the provider says there is none).
    ``capped``: the provider will not serve further pages although more match (Postmark's
    10,000 offset, a search's page limit). ``total``: the match count the provider
    reports, when it does (a last page that leaves some unread is partial).
    """

    items: list[T]
    next: Any = None
    capped: bool = False
    total: int | None = None


@dataclass(frozen=True)
class Scan(Generic[T]):
    """What a scan read: its matches, and whether it read everything that matched."""

    matches: list[T] = field(default_factory=list)
    complete: bool = True
    reason: str = ""


def scan(
    fetch: Callable[[Any], Page[T]], match: Callable[[T], bool], *, max_pages: int = 20
) -> Scan[T]:
    """Read pages until the provider says there are no more; stop at the first match (a
    found effect needs no further proof). Complete only when the last page came with no
    cursor, no cap, and no shortfall against the provider's own count."""
    matches: list[T] = []
    cursor: Any = None
    seen = 0
    for _ in range(max_pages):
        try:
            page = fetch(cursor)
        except RateLimited as exc:
            return Scan(matches, False, f"rate limited: {exc}"[:200])
        seen += len(page.items)
        matches.extend(item for item in page.items if match(item))
        if matches:
            return Scan(matches, True)
        if page.capped:
            return Scan(matches, False, "the provider capped the listing")
        if page.next is None:
            if page.total is not None and seen < page.total:
                return Scan(matches, False, f"partial listing: read {seen} of {page.total}")
            return Scan(matches, True)
        cursor = page.next
    return Scan(matches, False, f"more than {max_pages} pages")


@dataclass(frozen=True)
class Method:
    """One lookup method of a provider: how long its results lag (``settle_s``) and how
    long it keeps them (``retention_s``). ``skew_s`` covers the clocks of the ledger and
    the provider, which need not agree."""

    name: str
    settle_s: float
    retention_s: float
    skew_s: float = 5.0

    def settles_at_ms(self, effect: LookupContext) -> int | None:
        """The ledger-server time from which this method covers the claim (None once
        it does, or when it never will again: past retention)."""
        at = effect.claimed_ms + int((self.settle_s + self.skew_s) * 1000)
        return at if effect.now_ms < at else None

    def window(self, effect: LookupContext) -> str | None:
        """Why this method cannot yet (or can no longer) rule the effect out; None when
        the claim's time is inside what it covers."""
        age_s = (effect.now_ms - effect.claimed_ms) / 1000
        if age_s < self.settle_s + self.skew_s:
            return (
                f"{self.name} settles {self.settle_s:.0f}s after a call; "
                f"the claim is {age_s:.1f}s old"
            )
        if age_s > self.retention_s - self.skew_s:
            return f"the claim is older than {self.name}'s {self.retention_s:.0f}s retention"
        return None


def judge(
    method: Method,
    effect: LookupContext,
    result: Scan[T],
    found: Callable[[T], Found],
    *,
    ambiguous: Callable[[list[T]], str | None] | None = None,
) -> LookupResult:
    """The lookup's answer from one method's scan: Found for one match, NotFound only for
    a complete scan over a settled, retained window, Unavailable for everything else."""
    if result.matches:
        why = ambiguous(result.matches) if ambiguous else None
        if why:
            return Unavailable(why)
        return found(result.matches[0])
    if not result.complete:
        return Unavailable(f"{method.name}: {result.reason}")
    if why := method.window(effect):
        return Unavailable(why, method.settles_at_ms(effect))
    return NotFound(authoritative=True)


def combine(results: Iterable[LookupResult]) -> LookupResult:
    """Several methods asked in turn (lazily): the first Found wins; otherwise NotFound if
    one method earned it (each covers the whole window on its own); otherwise Unavailable,
    with every method's reason."""
    answers = []
    for result in results:
        if isinstance(result, Found):
            return result
        answers.append(result)
    if any(isinstance(a, NotFound) and a.authoritative for a in answers):
        return NotFound(authoritative=True)
    waits = [a for a in answers if isinstance(a, Unavailable)]
    reason = "; ".join(a.reason for a in waits)[:300] or "no lookup method could be asked"
    # Only settling methods: ask again when the first of them covers the window (the
    # reconciler does not count that wait against its budget); any other failure counts.
    settles = [a.settles_at_ms for a in waits]
    if waits and all(at is not None for at in settles):
        return Unavailable(reason, min(at for at in settles if at is not None))
    return Unavailable(reason)
