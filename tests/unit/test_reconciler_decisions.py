"""The reconciler's decision table (DESIGN §4), one row per test."""

from __future__ import annotations

from dedupe import Found, NotFound, Takeover, ToolSpec, Unavailable
from reconciler import decide

NOW = 1_000_000_000


class _Lookup:
    def lookup(self, idempotency_key: str, token: int | None = None) -> NotFound:
        return NotFound()


SPEC = ToolSpec(
    name="charge", identity=("c",), settle_s=5, provider_window_s=3600, lookup=_Lookup()
)


def takeover(*, since_s: float = 10, claimed_s: float = 20, rounds: int = 1,
             late: list[object] | None = None) -> Takeover:  # fmt: skip
    return Takeover(
        key="k" * 64, token=3, generation=0, tool="charge", request=None, attempts=1,
        claimed_ms=NOW - int(claimed_s * 1000), late_receipts=late or [],
        reconciling_since_ms=NOW - int(since_s * 1000), rounds=rounds, now_ms=NOW,
    )  # fmt: skip


def test_found_is_done_with_the_receipt() -> None:
    d = decide(takeover(), SPEC, Found({"id": "r1"}, '{"id":"r1"}'), budget=5)
    assert (d.action, d.receipt, d.raw) == ("done", {"id": "r1"}, '{"id":"r1"}')


def test_not_found_inside_the_settle_window_looks_again_when_it_ends() -> None:
    d = decide(takeover(since_s=2), SPEC, NotFound(), budget=5)
    assert d.action == "defer" and 2.9 < d.delay_s <= 3.0


def test_not_found_after_the_settle_window_is_not_executed() -> None:
    assert decide(takeover(since_s=6), SPEC, NotFound(), budget=5).action == "failed"


def test_not_found_past_the_provider_window_is_unknown() -> None:
    d = decide(takeover(since_s=6, claimed_s=4000), SPEC, NotFound(), budget=5)
    assert d.action == "unknown" and "window" in d.reason


def test_not_found_with_a_late_receipt_is_unknown_not_failed() -> None:
    d = decide(takeover(since_s=6, late=[[2, '{"id":"x"}', NOW]]), SPEC, NotFound(), budget=5)
    assert d.action == "unknown" and "late receipt" in d.reason


def test_not_authoritative_not_found_is_unknown() -> None:
    d = decide(takeover(since_s=6), SPEC, NotFound(authoritative=False), budget=5)
    assert d.action == "unknown"


def test_unavailable_backs_off_then_turns_unknown_at_the_budget() -> None:
    first = decide(takeover(rounds=1), SPEC, Unavailable("HTTP 503"), budget=3)
    third = decide(takeover(rounds=3), SPEC, Unavailable("HTTP 503"), budget=3)
    assert (first.action, first.delay_s) == ("defer", 2.0)
    assert third.action == "unknown" and "HTTP 503" in third.reason


def test_no_lookup_or_undeclared_tool_is_unknown_at_once() -> None:
    blind = ToolSpec(name="charge", identity=("c",))
    assert decide(takeover(), blind, None, budget=5).action == "unknown"
    assert decide(takeover(), None, None, budget=5).action == "unknown"


def test_reconcilers_divide_the_buckets_without_a_leader() -> None:
    from reconciler import Reconciler

    class _Ledger:
        buckets = 256

    members = ["r-a", "r-b", "r-c"]
    owned = [Reconciler(_Ledger(), {}, holder=m).owned_buckets(members) for m in members]  # type: ignore[arg-type]
    assert sorted(b for o in owned for b in o) == list(range(256))  # each bucket once
    assert all(40 < len(o) < 130 for o in owned)
    # A member that falls silent leaves the list; its buckets pass to the others.
    survivors = [
        Reconciler(_Ledger(), {}, holder=m).owned_buckets(members[:2]) for m in members[:2]
    ]  # type: ignore[arg-type]
    assert sorted(b for o in survivors for b in o) == list(range(256))
    assert set(owned[0]) <= set(survivors[0])
