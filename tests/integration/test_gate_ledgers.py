"""The gate's Redis work on a single server and on a 3-master Redis Cluster (the ledger's
two layouts): the pause state, a rate's window and buckets, and the concurrency slots, each
limiter's keys in one slot (its tool's hash tag). Real redis-server processes; the
messages are Dramatiq's own, on its stub broker with effectq's middleware."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from tests.support.cluster import LocalCluster
from tests.support.ledgers import fresh_ledger
from workers.broker.gate import LIMITS_OPTION, Deferred, Gate, Limits, set_paused
from workers.broker.middleware import EffectMiddleware
from workers.dev.redis_server import RedisServer


def _broker(limits: Limits) -> tuple[StubBroker, dramatiq.Actor[..., Any]]:
    broker = StubBroker()
    broker.add_middleware(EffectMiddleware(ledger=lambda: None, dead_letter=lambda **_: None))
    actor = dramatiq.actor(  # type: ignore[call-overload]
        lambda: None, actor_name="limited", broker=broker, redelivery_is_duplicate=True,
        **{LIMITS_OPTION: limits},
    )  # fmt: skip
    return broker, actor


def _admitted(gate: Gate, broker: StubBroker, actor: dramatiq.Actor[..., Any]) -> bool:
    proxy = dramatiq.MessageProxy(actor.message())
    try:
        gate.admit(broker, proxy)
    except Deferred:
        return False
    gate.release(proxy)
    return True


def test_a_rate_holds_on_the_ledgers_layout(ledger_server: RedisServer | LocalCluster) -> None:
    ledger = fresh_ledger(ledger_server.url)
    broker, actor = _broker(Limits(rate=5, window_s=1))
    gate = Gate(lambda: ledger)
    at: list[float] = []
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        if _admitted(gate, broker, actor):
            at.append(time.time())
    per_second: dict[int, int] = {}
    for moment in at:
        per_second[int(moment)] = per_second.get(int(moment), 0) + 1
    assert max(per_second.values()) <= 5 and len(at) >= 8, per_second
    # Spread, not sent at each second's start: one per 200 ms bucket, so any second-long
    # span holds at most one more than the rate (a bucket's end, the next one's start).
    sliding = max(sum(1 for t in at if start <= t < start + 1) for start in at)
    assert sliding <= 6, at


def test_concurrency_slots_hold_on_the_ledgers_layout(
    ledger_server: RedisServer | LocalCluster,
) -> None:
    ledger = fresh_ledger(ledger_server.url)
    broker, actor = _broker(Limits(concurrency=2))
    gate = Gate(lambda: ledger)
    held, go = threading.Barrier(3), threading.Event()
    proxies = [dramatiq.MessageProxy(actor.message()) for _ in range(2)]

    def hold(proxy: dramatiq.MessageProxy) -> None:
        gate.admit(broker, proxy)
        held.wait()
        go.wait()
        gate.release(proxy)

    threads = [threading.Thread(target=hold, args=(p,)) for p in proxies]
    for thread in threads:
        thread.start()
    held.wait()
    with pytest.raises(Deferred) as refused:  # both slots taken: waited 1 s, then held back
        gate.admit(broker, dramatiq.MessageProxy(actor.message()))
    assert refused.value.cause == "concurrency"
    go.set()
    for thread in threads:
        thread.join()
    assert _admitted(gate, broker, actor)


def test_a_pause_holds_on_the_ledgers_layout(ledger_server: RedisServer | LocalCluster) -> None:
    ledger = fresh_ledger(ledger_server.url)
    broker, actor = _broker(Limits(concurrency=1))
    set_paused(ledger, "tool", "limited", pause=True, actor="sre", reason="r")
    with pytest.raises(Deferred) as refused:
        Gate(lambda: ledger).admit(broker, dramatiq.MessageProxy(actor.message()))
    assert refused.value.cause == "paused"
    set_paused(ledger, "tool", "limited", pause=False, actor="sre", reason="r")
    assert _admitted(Gate(lambda: ledger), broker, actor)
