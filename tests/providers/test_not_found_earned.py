"""NotFound is earned: over lag, pagination, caps, rate limits, retention, no search
that missed part of the window answers NotFound, and an executed effect is never NotFound.

The provider here is a model of a paginated, lagging, rate-limited, forgetful list (the
HTTP fakes in this folder honour the same switches for the real SDKs); the code under test
is the real ``scan`` and ``judge`` every adapter uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dedupe.spec import Found, LookupContext, NotFound, Unavailable
from reconciler.providers.base import Method, Page, RateLimited, judge, scan

SETTLE_S = 60.0
RETENTION_S = 3600.0
SKEW_S = 5.0
METHOD = Method("search", settle_s=SETTLE_S, retention_s=RETENTION_S, skew_s=SKEW_S)
NOW_MS = 10_000_000_000


@dataclass
class Listing:
    """A provider's list, newest first, as the scan sees it at ``NOW_MS``."""

    ages_s: list[float]  # every object's age at NOW_MS; index 0 is the target when executed
    lag_s: list[float]  # each object's visibility delay (≤ the method's settle window)
    page_size: int
    cap_items: int | None  # the provider serves no item past this offset
    rate_limit_at: int | None  # the page number that answers 429
    drop_tail: int  # the last page loses this many items (the count still says them)
    fetched_last: bool = False  # the provider served its true last page, whole
    misread: bool = False  # anything served was capped, rate limited or short

    def visible(self) -> list[int]:
        shown = [
            i for i, age in enumerate(self.ages_s) if age >= self.lag_s[i] and age <= RETENTION_S
        ]
        return sorted(shown, key=lambda i: self.ages_s[i])

    def fetch(self, cursor: Any) -> Page[int]:
        page_no = cursor or 0
        if self.rate_limit_at is not None and page_no == self.rate_limit_at:
            self.misread = True
            raise RateLimited("HTTP 429")
        items = self.visible()
        start = page_no * self.page_size
        if self.cap_items is not None and start + self.page_size > self.cap_items:
            served = items[start : self.cap_items]
            if len(items) > self.cap_items:
                self.misread = True
                return Page(served, None, capped=True, total=len(items))
            return self._last_or_next(items, start, page_no)
        return self._last_or_next(items, start, page_no)

    def _last_or_next(self, items: list[int], start: int, page_no: int) -> Page[int]:
        chunk = items[start : start + self.page_size]
        if start + self.page_size >= len(items):
            if self.drop_tail and chunk:
                self.misread = True
                return Page(chunk[: -self.drop_tail], None, total=len(items))
            self.fetched_last = True
            return Page(chunk, None, total=len(items))
        return Page(chunk, page_no + 1, total=len(items))


@st.composite
def listings(draw: st.DrawFn) -> tuple[Listing, bool, float]:
    executed = draw(st.booleans())
    claim_age_s = draw(st.floats(0, RETENTION_S * 1.5))
    # The call reaches the provider after the claim, within the clock skew allowed for.
    target_age = claim_age_s - draw(st.floats(0, SKEW_S))
    others = draw(st.lists(st.floats(0, RETENTION_S * 1.5), max_size=40))
    ages = ([target_age] if executed else []) + others
    lag = [draw(st.floats(0, SETTLE_S)) for _ in ages]
    listing = Listing(
        ages_s=ages,
        lag_s=lag,
        page_size=draw(st.integers(1, 10)),
        cap_items=draw(st.none() | st.integers(0, 30)),
        rate_limit_at=draw(st.none() | st.integers(0, 6)),
        drop_tail=draw(st.integers(0, 2)),
    )
    return listing, executed, claim_age_s


def effect(claim_age_s: float) -> LookupContext:
    return LookupContext(
        key="0" * 64,
        idempotency_key="0" * 64,
        token=2,
        tool="pay",
        generation=0,
        claimed_ms=NOW_MS - int(claim_age_s * 1000),
        now_ms=NOW_MS,
    )


@settings(max_examples=600, deadline=None)
@given(listings(), st.integers(1, 12))
def test_an_incomplete_search_never_reads_as_not_found(
    case: tuple[Listing, bool, float], max_pages: int
) -> None:
    listing, executed, claim_age_s = case
    result = judge(
        METHOD,
        effect(claim_age_s),
        scan(listing.fetch, lambda i: executed and i == 0, max_pages=max_pages),
        lambda i: Found({"provider_object_id": str(i)}),
    )
    if isinstance(result, NotFound):
        assert not executed, "an executed effect read as NotFound"
        assert listing.fetched_last and not listing.misread, "NotFound from a partial search"
        assert SETTLE_S + SKEW_S <= claim_age_s <= RETENTION_S - SKEW_S
    if isinstance(result, Found):
        assert executed


def test_a_settled_complete_search_does_earn_not_found() -> None:
    """The rule is not "never NotFound": a whole, settled, retained window earns it."""
    listing = Listing([10.0, 20.0], [0.0, 0.0], 1, None, None, 0)
    result = judge(METHOD, effect(120.0), scan(listing.fetch, lambda i: False), lambda i: Found({}))
    assert result == NotFound(authoritative=True)


def test_a_capped_listing_is_unavailable_whatever_it_showed() -> None:
    listing = Listing([10.0, 20.0, 30.0], [0.0] * 3, 2, 2, None, 0)
    result = judge(METHOD, effect(120.0), scan(listing.fetch, lambda i: False), lambda i: Found({}))
    assert isinstance(result, Unavailable)
    assert "capped" in result.reason
