"""Expired claims are looked up concurrently, up to each provider's limit (issue 37, item 8).

Taken over one at a time, 8 claims whose lookups take 2 s were decided 2 s apart: the last
one 16 s after the first. A pass now runs the lookups on a bounded pool, at most
``lookup_concurrency`` at a time per lookup object (tools sharing one lookup share its
limit). Against the real sandbox over HTTP (its lookups delayed by ``lookup_latency_ms``)
and a real redis-server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from dedupe import Ledger, LookupResult, State, ToolSpec, derive, idempotency_key
from reconciler import HttpLookup, Reconciler
from tests.support.ledgers import fresh_ledger
from workers.dev.redis_server import RedisServer
from workers.dev.sandbox import SandboxConfig, SandboxProcess

LOOKUP_S = 2.0


@pytest.fixture(scope="module")
def slow_lookups() -> Iterator[SandboxProcess]:
    with SandboxProcess(SandboxConfig(lookup_latency_ms=LOOKUP_S * 1000)) as sandbox:
        yield sandbox


class CountingLookup:
    """The real HTTP lookup, counting how many of its calls overlap."""

    def __init__(self, inner: HttpLookup) -> None:
        self.inner = inner
        self.lookup_concurrency = inner.lookup_concurrency
        self.in_flight = self.most = 0
        self._lock = threading.Lock()

    def lookup(self, idempotency_key: str, token: int | None = None) -> LookupResult:
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            return self.inner.lookup(idempotency_key, token)
        finally:
            with self._lock:
                self.in_flight -= 1


def _expired_claims(ledger: Ledger, spec: ToolSpec, n: int, sandbox: SandboxProcess) -> list[str]:
    """``n`` claims whose holders died; every other one executed at the provider first."""
    keys = []
    with httpx.Client(base_url=sandbox.url, timeout=10.0, trust_env=False) as client:
        for i in range(n):
            effect = derive(spec, f"order-{time.monotonic_ns()}-{i}", {"x": str(i)})
            claim = ledger.claim(effect, lease_s=0.05, holder="dead/1")
            assert claim.acquired
            if i % 2 == 0:
                provider_key = idempotency_key(effect.key, claim.generation)
                posted = client.post(
                    "/v1/effects", json={"x": i}, headers={"Idempotency-Key": provider_key}
                )
                assert posted.status_code == 201, posted.text
            keys.append(effect.key)
    deadline = time.monotonic() + 10
    while not set(keys) <= set(ledger.expired(None, limit=100)):
        assert time.monotonic() < deadline, "the claims' leases did not expire"
        time.sleep(0.02)
    return keys


def test_the_sandbox_delays_lookups_only(slow_lookups: SandboxProcess) -> None:
    with httpx.Client(base_url=slow_lookups.url, timeout=10.0, trust_env=False) as client:
        started = time.monotonic()
        posted = client.post("/v1/effects", json={}, headers={"Idempotency-Key": "fast-post"})
        assert posted.status_code == 201
        assert time.monotonic() - started < LOOKUP_S / 2
        started = time.monotonic()
        assert client.get("/v1/effects/fast-post").status_code == 200
        assert time.monotonic() - started >= LOOKUP_S


def test_eight_expired_claims_are_decided_within_one_lookup_time(
    slow_lookups: SandboxProcess, shared_redis_server: RedisServer
) -> None:
    ledger = fresh_ledger(shared_redis_server.url)
    lookup = CountingLookup(HttpLookup(slow_lookups.url, timeout_s=10.0))
    spec = ToolSpec(name="slowlook", identity=("x",), settle_s=0, lookup=lookup)
    keys = _expired_claims(ledger, spec, 8, slow_lookups)
    reconciler = Reconciler(ledger, {"slowlook": spec})

    started = time.monotonic()
    outcomes = reconciler.run_once()
    took = time.monotonic() - started

    assert outcomes == {"done": 4, "failed": 4}, outcomes
    states = [r.state for r in ledger.get_many(keys).values() if r is not None]
    assert sorted(s.value for s in states) == ["DONE"] * 4 + ["FAILED"] * 4
    # One lookup time and change, not 8 of them (16 s one at a time).
    assert took < 1.75 * LOOKUP_S, f"8 lookups of {LOOKUP_S} s took {took:.1f} s"
    assert lookup.most == 8


def test_tools_sharing_a_lookup_share_its_concurrency_limit(
    slow_lookups: SandboxProcess, shared_redis_server: RedisServer
) -> None:
    ledger = fresh_ledger(shared_redis_server.url)
    lookup = CountingLookup(HttpLookup(slow_lookups.url, timeout_s=10.0, lookup_concurrency=2))
    mail = ToolSpec(name="mail", identity=("x",), settle_s=0, lookup=lookup)
    text = ToolSpec(name="text", identity=("x",), settle_s=0, lookup=lookup)
    keys = [*_expired_claims(ledger, mail, 3, slow_lookups)]
    keys += _expired_claims(ledger, text, 3, slow_lookups)
    reconciler = Reconciler(ledger, {"mail": mail, "text": text})

    started = time.monotonic()
    outcomes = reconciler.run_once()
    took = time.monotonic() - started

    assert outcomes.total() == 6, outcomes
    records = ledger.get_many(keys).values()
    assert all(r is not None and r.state in (State.DONE, State.FAILED) for r in records)
    assert lookup.most == 2, f"{lookup.most} lookups at once through a limit of 2"
    # 6 lookups, 2 at a time: 3 rounds.
    assert 3 * LOOKUP_S <= took < 4.5 * LOOKUP_S, took
