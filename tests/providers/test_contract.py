"""The contract every provider adapter passes, each against a local fake of its provider
through the provider's official SDK, with the real reconciler on a real redis-server ledger:

- the provider executed and the worker died before its commit → found after the settle
  window: DONE, one execution;
- the response was lost → found;
- a lagging search inside its settle window → never NotFound;
- a listing that cannot be read whole, or a storm of 429s → UNKNOWN, never FAILED;
- a changed payload under the same key → a conflict, never "not executed", never DONE;
- nothing executed → FAILED once the window is covered (NotFound earned, the key free).

A new adapter joins by adding a harness to ``tests/providers/harnesses.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from dedupe import ConflictError, Ledger, NotExecutedError, derive
from dedupe.spec import Found, LookupContext, NotFound, Unavailable
from reconciler import Reconciler
from tests.providers.fakes.http import serving
from tests.providers.harnesses import HARNESSES, LAG_S, SETTLE_S, Harness
from tests.support.ledgers import fresh_ledger
from workers.dev.redis_server import RedisServer

LEASE_S = 0.2
TERMINAL = {"DONE", "FAILED", "UNKNOWN"}


@pytest.fixture(params=HARNESSES, ids=lambda h: h.name)
def harness(request: pytest.FixtureRequest) -> Harness:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def provider(harness: Harness) -> Iterator[tuple[Any, str]]:
    fake = harness.make_fake()
    with serving(fake) as url:
        yield fake, url


@pytest.fixture
def ledger(shared_redis_server: RedisServer) -> Ledger:
    return fresh_ledger(shared_redis_server.url)


class Effect:
    """One effect of the harness's tool: claimed by a worker that then dies."""

    def __init__(self, harness: Harness, adapter: Any, ledger: Ledger, i: int) -> None:
        self.harness, self.adapter, self.ledger = harness, adapter, ledger
        self.args = harness.args(i)
        self.spec = replace(harness.spec, settle_s=0.0, lookup=adapter)
        self.effect = derive(self.spec, f"scope-{i}", self.args)
        claim = ledger.claim(self.effect, lease_s=LEASE_S, holder="worker/1")
        self.call = SimpleNamespace(key=self.effect.key, idempotency_key=claim.idempotency_key)

    def execute(self, args: dict[str, Any] | None = None) -> Any:
        return self.harness.run(self.adapter, self.call, args or self.args)

    def reconcile(self, budget: int = 12, deadline_s: float = 20.0) -> Any:
        """The real reconciler's passes until the effect is settled; its record."""
        reconciler = Reconciler(
            self.ledger, {self.spec.name: self.spec}, budget=budget, backoff_s=0.05
        )
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            reconciler.run_once()
            record = self.ledger.get(self.effect.key)
            if record is not None and record.state in TERMINAL:
                return record
            time.sleep(0.05)
        raise AssertionError(f"not settled within {deadline_s}s: {record}")

    def context(self, age_s: float, args: dict[str, Any] | None = None) -> LookupContext:
        now_ms = int(time.time() * 1000)
        return LookupContext(
            key=self.effect.key, idempotency_key=self.call.idempotency_key, token=2,
            tool=self.spec.name, generation=0, claimed_ms=now_ms - int(age_s * 1000),
            now_ms=now_ms, args=args or self.args,
        )  # fmt: skip


def test_executed_then_crashed_before_commit_is_found_after_the_settle_window(
    harness: Harness, provider: tuple[Any, str], ledger: Ledger
) -> None:
    fake, url = provider
    harness.lag(fake, LAG_S)
    e = Effect(harness, harness.make_adapter(url), ledger, 1)
    executed = e.execute()
    record = e.reconcile()
    assert record.state == "DONE", record.reason
    assert record.reason == "reconciled: found at the provider"
    assert record.receipt["provider_object_id"] == executed.receipt["provider_object_id"]
    assert harness.executions(fake, e.call.idempotency_key) == 1


def test_a_lost_response_is_uncertain_then_found(
    harness: Harness, provider: tuple[Any, str], ledger: Ledger
) -> None:
    fake, url = provider
    e = Effect(harness, harness.make_adapter(url), ledger, 2)
    fake.lose_response = True
    with pytest.raises(Exception) as raised:
        e.execute()
    assert not isinstance(raised.value, NotExecutedError), "a lost response is not 'not run'"
    record = e.reconcile()
    assert (record.state, record.reason) == ("DONE", "reconciled: found at the provider")
    assert harness.executions(fake, e.call.idempotency_key) == 1


def test_a_lagging_search_is_never_not_found_inside_its_window(
    harness: Harness, provider: tuple[Any, str], ledger: Ledger
) -> None:
    fake, url = provider
    harness.lag(fake, LAG_S)
    adapter = harness.make_adapter(url)
    quiet = Effect(harness, adapter, ledger, 3)
    assert isinstance(adapter.lookup_effect(quiet.context(0.0)), Unavailable)
    assert isinstance(adapter.lookup_effect(quiet.context(SETTLE_S / 2)), Unavailable)
    ran = Effect(harness, adapter, ledger, 4)
    ran.execute()
    assert not isinstance(adapter.lookup_effect(ran.context(0.0)), NotFound)
    # The same lookup past the window earns its NotFound for the effect that never ran.
    past = SETTLE_S + 6.0
    assert adapter.lookup_effect(quiet.context(past)) == NotFound(authoritative=True)


def test_a_listing_not_read_whole_ends_unknown_not_failed(
    harness: Harness, provider: tuple[Any, str], ledger: Ledger
) -> None:
    fake, url = provider
    adapter = harness.make_adapter(url, **harness.partial_overrides)
    e = Effect(harness, adapter, ledger, 5)
    e.execute()
    for i in range(harness.others_for_partial):
        other = Effect(harness, adapter, ledger, 100 + i)
        other.execute(harness.other(e.args, i))
    harness.partial(fake)
    time.sleep(SETTLE_S + 0.1)  # past the settle window: only the listing stands in the way
    result = adapter.lookup_effect(e.context(SETTLE_S + 6.0))
    assert isinstance(result, Unavailable), result
    record = e.reconcile(budget=3)
    assert record.state == "UNKNOWN", record.reason
    assert harness.executions(fake, e.call.idempotency_key) == 1


def test_a_429_storm_ends_unknown_not_failed(
    harness: Harness, provider: tuple[Any, str], ledger: Ledger
) -> None:
    fake, url = provider
    e = Effect(harness, harness.make_adapter(url), ledger, 6)
    fake.rate_limit = True
    record = e.reconcile(budget=3)
    assert record.state == "UNKNOWN", record.reason
    assert "429" in record.reason


def test_a_changed_payload_under_the_same_key_is_a_conflict(
    harness: Harness, provider: tuple[Any, str], ledger: Ledger
) -> None:
    fake, url = provider
    adapter = harness.make_adapter(url)
    e = Effect(harness, adapter, ledger, 7)
    e.execute()
    if harness.keyed:
        with pytest.raises(ConflictError):
            e.execute(harness.changed(e.args))
        assert harness.executions(fake, e.call.idempotency_key) == 1
    # The lookup never settles an effect on an object carrying another payload.
    found = adapter.lookup_effect(e.context(SETTLE_S + 6.0, harness.changed(e.args)))
    assert isinstance(found, Unavailable), found
    assert isinstance(adapter.lookup_effect(e.context(SETTLE_S + 6.0)), Found)


def test_nothing_executed_is_failed_once_the_window_is_covered(
    harness: Harness, provider: tuple[Any, str], ledger: Ledger
) -> None:
    fake, url = provider
    harness.lag(fake, LAG_S)
    e = Effect(harness, harness.make_adapter(url), ledger, 8)
    started = time.monotonic()
    record = e.reconcile()
    assert record.state == "FAILED", record.reason
    assert time.monotonic() - started >= SETTLE_S  # not before the window was covered
    assert harness.executions(fake, e.call.idempotency_key) == 0
