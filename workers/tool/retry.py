"""How the worker path leaves a message alive: ``RetryLater`` (control flow, never a dead
letter), the actor's ``retry_when`` policy, and how long to wait for an effect someone else
holds (``retry_delay_ms``)."""

from __future__ import annotations

from collections.abc import Callable

import dramatiq

from dedupe import Claim, EffectqError, LedgerError, State

from ..broker.gate import Deferred
from ..settings import Settings

__all__ = ["RetryLater", "retry_delay_ms", "retry_when"]


class RetryLater(dramatiq.Retry, EffectqError):
    """Control flow: leave the message alive and deliver it again later (not an error of
    the message). ``delay_ms``: when to deliver it again (None: Dramatiq's exponential
    backoff)."""

    def __init__(
        self,
        reason: str,
        *,
        give_up: bool = False,
        key: str | None = None,
        delay_ms: int | None = None,
    ) -> None:
        dramatiq.Retry.__init__(self, reason, delay=delay_ms)
        self.message = reason
        self.details = {"key": key} if key is not None else {}
        self.reason = reason
        self.give_up = give_up
        self.delay_ms = delay_ms


def retry_when(max_retries: int) -> Callable[[int, BaseException], bool]:
    def retry_when(retries: int, exc: BaseException) -> bool:
        if isinstance(exc, RetryLater):
            return not exc.give_up
        if isinstance(exc, Deferred):
            return True  # held back by a pause or a limit (broker.gate): it only waits
        if isinstance(exc, LedgerError):
            # A ledger that could not answer says nothing about the message: never a dead
            # letter.
            return True
        return retries < max_retries

    return retry_when


# Past a lease deadline, a retry comes this long after it (the reconciler's turn).
_LEASE_MARGIN_MS = 500
# The reconciler's turn is polled at this period at most: it decides an expired claim
# within a pass interval and a lookup (reconciler defaults: 1 s interval, 5 s lookup
# timeout), whatever its takeover lease (30 s) or the claim's overdue time says.
_RECONCILER_POLL_MS = 6_000


def retry_delay_ms(claim: Claim, cfg: Settings) -> int | None:
    """When to look again at an effect someone else holds (in_flight / blocked): just after
    its lease deadline while a worker's lease runs; once it has expired, or while the
    reconciler holds it (RECONCILING: its lease is a takeover's, not a decision time), after
    as long again as it has been overdue, at most ``_RECONCILER_POLL_MS`` — so a key the
    reconciler frees runs within one poll period, while a claim no reconciler takes is not
    polled every second. No deadline (UNKNOWN: an operator's turn): None, Dramatiq's
    exponential backoff. Bounded by the retry settings."""
    if claim.remaining_ms is None:
        return None
    if claim.remaining_ms > 0:
        delay = claim.remaining_ms + _LEASE_MARGIN_MS
        if claim.state is State.RECONCILING:
            delay = min(delay, _RECONCILER_POLL_MS)
    else:
        delay = min(max(-claim.remaining_ms, cfg.retry_min_backoff_ms), _RECONCILER_POLL_MS)
    return min(delay, cfg.retry_max_backoff_ms)
