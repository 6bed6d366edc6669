"""A lookup method that lags is waited for, not counted against the budget: an answer
"unavailable until T" defers the reconciler to T inside the provider's window, and is
an ordinary unavailable (budget, then UNKNOWN) once T has passed or outside the window."""

from __future__ import annotations

from dedupe import Takeover, ToolSpec
from dedupe.spec import Unavailable
from reconciler import decide
from tests.providers.harnesses import STRIPE

NOW = 1_000_000_000


def takeover(rounds: int, claimed_ms: int) -> Takeover:
    return Takeover(
        key="0" * 64, token=3, generation=0, tool="pay", request=None, attempts=1,
        claimed_ms=claimed_ms, late_receipts=[], reconciling_since_ms=claimed_ms,
        rounds=rounds, now_ms=NOW,
    )  # fmt: skip


SPEC = ToolSpec(name="pay", identity=("order",), lookup=STRIPE.make_adapter("http://x"))


def test_a_settling_lookup_defers_to_its_time_even_past_the_budget() -> None:
    decision = decide(
        takeover(rounds=9, claimed_ms=NOW - 30_000),
        SPEC,
        Unavailable("search settles 60s after a call", settles_at_ms=NOW + 35_000),
        budget=5,
    )
    assert decision.action == "defer"
    assert decision.delay_s == 35.0


def test_once_settled_or_outside_the_window_it_spends_the_budget() -> None:
    settled = Unavailable("429", settles_at_ms=NOW - 1)
    assert decide(takeover(5, NOW - 30_000), SPEC, settled, budget=5).action == "unknown"
    old = NOW - int(SPEC.provider_window_s * 1000) - 1
    late = Unavailable("search settles", settles_at_ms=NOW + 1000)
    assert decide(takeover(5, old), SPEC, late, budget=5).action == "unknown"
    assert decide(takeover(1, NOW - 30_000), SPEC, Unavailable("x"), budget=5).action == "defer"
