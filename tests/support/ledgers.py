"""Helpers for tests that drive the ledger directly: specs, effects, and polling."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from dedupe import Effect, Ledger, ToolSpec, derive

T = TypeVar("T")

CHARGE = ToolSpec(
    name="charge",
    identity=("customer",),
    bound=("customer", "amount", "currency"),
    normalizers={"customer": "id", "amount": "money", "currency": "upper"},
)
RETENTION_S = 7 * 86400.0


def charge(scope: str | None = None, amount: str = "10.00", customer: str = "cus_1") -> Effect:
    """A charge effect; a fresh scope (so a fresh key) unless one is given."""
    scope = scope or f"order-{uuid.uuid4().hex[:12]}"
    return derive(CHARGE, scope, {"customer": customer, "amount": amount, "currency": "usd"})


def unknown_charge(ledger: Ledger) -> str:
    """The key of a charge left UNKNOWN as a reconciler whose lookups failed leaves it: its
    claim's lease lapses at once, a reconciler takes it over and marks it."""
    effect = charge()
    ledger.claim(effect, lease_s=0.01, holder="w/1")
    takeover = poll(
        lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), lambda t: t is not None
    )
    assert takeover is not None
    ledger.mark_unknown(effect.key, takeover.token, reason="lookup unavailable 5 times")
    return effect.key


def fresh_ledger(url: str, **kwargs: Any) -> Ledger:
    """A ledger in its own namespace, so tests sharing one server never see each other."""
    return Ledger.from_url(url, namespace=f"t{uuid.uuid4().hex[:10]}", **kwargs)


def script_calls(client: Any) -> int:
    """How many ledger calls ``client``'s server has run (EVALSHA on 6.2 and on a cluster,
    FCALL on a single Redis 7), from ``INFO commandstats``."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0)) for cmd in ("evalsha", "fcall"))


def poll(fn: Callable[[], T], until: Callable[[T], bool], *, timeout: float = 10.0) -> T:
    """Call ``fn`` until ``until(result)``; fail with the last result after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = fn()
        if until(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s; last result: {result!r}")
        time.sleep(0.01)
