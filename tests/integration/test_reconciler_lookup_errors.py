"""A tool's lookup that raises (a bug in code effectq does not own) is an unanswered
question, not a dead reconciler: the pass goes on to the next key, the key is retried
within the budget and then handed to an operator as UNKNOWN with the reason."""

from __future__ import annotations

import time

import redis

from dedupe import NotFound, ToolSpec, derive
from reconciler import Reconciler
from tests.support.ledgers import fresh_ledger
from workers.dev.redis_server import RedisServer


class _Broken:
    def __init__(self) -> None:
        self.calls = 0

    def lookup(self, idempotency_key: str, token: int | None = None) -> NotFound:
        self.calls += 1
        raise KeyError(idempotency_key)  # the key must not reach the reason text


def test_a_raising_lookup_defers_then_marks_unknown_and_the_pass_goes_on(
    shared_redis_server: RedisServer, shared_redis: redis.Redis
) -> None:
    ledger = fresh_ledger(shared_redis_server.url)
    broken = _Broken()
    spec = ToolSpec(name="broken", identity=("x",), settle_s=0, lookup=broken)
    effects = [derive(spec, f"s-{i}", {"x": str(i)}) for i in range(3)]
    for effect in effects:
        ledger.claim(effect, lease_s=0.05, holder="dead/1")
    time.sleep(0.1)
    reconciler = Reconciler(ledger, {"broken": spec}, budget=2, backoff_s=0.05)

    assert reconciler.run_once() == {"defer": 3}  # every key looked at, none raised out
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        ledger.get(e.key).state != "UNKNOWN"  # type: ignore[union-attr]
        for e in effects
    ):
        reconciler.run_once()
        time.sleep(0.05)
    for effect in effects:
        record = ledger.get(effect.key)
        assert record is not None and record.state == "UNKNOWN"
        assert "lookup raised KeyError" in record.reason
        assert effect.key not in record.reason
    assert broken.calls == 3 * 2
