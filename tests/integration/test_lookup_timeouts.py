"""A lookup that times out has not answered: it is Unavailable, never "not found". Read as
"not found", a slow provider would make the reconciler record FAILED an effect that did
happen, and the message's next delivery would run it again. Against the real sandbox over
HTTP, its latency set above the lookup's timeout."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from dedupe import State, ToolSpec, Unavailable, derive, idempotency_key
from reconciler import HttpLookup, Reconciler
from tests.support.ledgers import fresh_ledger
from workers.dev.redis_server import RedisServer
from workers.dev.sandbox import SandboxConfig, SandboxProcess

LATENCY_MS = 1500.0  # every answer of the sandbox, a lookup's included
TIMEOUT_S = 0.3  # the lookup's: well below the latency


@pytest.fixture(scope="module")
def slow_sandbox() -> Iterator[SandboxProcess]:
    with SandboxProcess(SandboxConfig(latency_ms=LATENCY_MS)) as sandbox:
        yield sandbox


def _executed(sandbox: SandboxProcess, provider_key: str) -> None:
    """The effect happened at the provider (its POST waits the latency out)."""
    with httpx.Client(base_url=sandbox.url, timeout=10.0, trust_env=False) as client:
        response = client.post(
            "/v1/effects", json={"x": "1"}, headers={"Idempotency-Key": provider_key}
        )
    assert response.status_code == 201, response.text


def test_a_lookup_slower_than_its_timeout_is_unavailable(slow_sandbox: SandboxProcess) -> None:
    key = f"slow-{time.monotonic_ns()}"
    _executed(slow_sandbox, key)
    lookup = HttpLookup(slow_sandbox.url, timeout_s=TIMEOUT_S)

    for k in (key, f"{key}-never-sent"):  # executed or not, the provider did not answer
        started = time.monotonic()
        result = lookup.lookup(k, token=1)
        assert isinstance(result, Unavailable), f"a timed-out lookup answered {result!r}"
        assert "Timeout" in result.reason
        assert time.monotonic() - started < LATENCY_MS / 1000  # it did time out


def test_the_reconciler_never_records_failed_on_timed_out_lookups(
    slow_sandbox: SandboxProcess, shared_redis_server: RedisServer
) -> None:
    ledger = fresh_ledger(shared_redis_server.url)
    lookup = HttpLookup(slow_sandbox.url, timeout_s=TIMEOUT_S)
    spec = ToolSpec(name="slow", identity=("x",), settle_s=0, lookup=lookup)
    effect = derive(spec, "order-slow", {"x": "1"})
    claim = ledger.claim(effect, lease_s=0.05, holder="dead/1")
    assert claim.acquired
    # The holder ran the effect and died before its commit: the provider has it.
    _executed(slow_sandbox, idempotency_key(effect.key, claim.generation))
    reconciler = Reconciler(ledger, {"slow": spec}, budget=3, backoff_s=0.05)

    seen = []
    deadline = time.monotonic() + 30
    while True:
        record = ledger.get(effect.key)
        assert record is not None
        seen.append(record.state)
        assert record.state is not State.FAILED, f"a timed-out lookup made it FAILED: {seen}"
        if record.state is State.UNKNOWN or time.monotonic() > deadline:
            break
        reconciler.run_once()
        time.sleep(0.05)
    assert record.state is State.UNKNOWN, seen
    assert "lookup unavailable 3 times" in record.reason and "Timeout" in record.reason
