"""workers.metrics in this process: the hooks count what the ledger records, the scrape-time
collector reads the ledger's counters (never a campaign tag or a key as a label), every
label is on the allowlist, the off switch, and the multiprocess directory's housekeeping."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from redis.backoff import NoBackoff
from redis.retry import Retry

from dedupe import Ledger, ToolSpec, derive
from reconciler import Reconciler
from tests.support.ledgers import charge, fresh_ledger
from workers import metrics, runtime
from workers.dev.redis_server import RedisServer
from workers.metrics import collector, server
from workers.tool import EffectCall, RetryLater, get_tool

KEYISH = re.compile(r"[0-9a-f]{16,}")


def sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def families(source: collector.LedgerCollector) -> dict[str, Metric]:
    return {family.name: family for family in source.collect()}


def values(family: Metric) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


@pytest.fixture
def ledger(shared_redis_server: RedisServer, shared_redis: redis.Redis) -> Iterator[Ledger]:
    """A fresh ledger, installed as this process's ``runtime.ledger()`` for the test."""
    new = fresh_ledger(shared_redis_server.url)
    rt = runtime.current()
    previous = rt._ledger
    rt.set_ledger(new)
    yield new
    rt._ledger = previous


def assert_allowlisted(family: Metric) -> None:
    for s in family.samples:
        assert set(s.labels) <= metrics.LABELS, (s.name, s.labels)
        for label, value in s.labels.items():
            allowed = metrics.LABEL_VALUES.get(label)
            assert allowed is None or value in allowed, (s.name, label, value)
            assert not KEYISH.search(value) and "@" not in value, (s.name, label, value)


# -- the worker path and the reconciler count what the ledger records ------------------


def test_a_fenced_commit_is_counted_with_its_tool(ledger: Ledger) -> None:
    import workers.examples  # noqa: F401  (declares charge)

    tool = get_tool("charge")
    effect = tool.derive("order-fenced", {"customer": "c1", "amount": "5", "currency": "eur"})
    claim = ledger.claim(effect, lease_s=0.05, holder="paused/1")
    time.sleep(0.1)
    assert ledger.takeover(effect.key, lease_s=30, holder="reconciler/1") is not None
    call = EffectCall(
        tool="charge", key=effect.key, idempotency_key=claim.idempotency_key, token=claim.token,
        scope=effect.scope, action=effect.action, generation=0, message_id="m1",
    )  # fmt: skip
    before = sample("effectq_fenced_writes_total", tool="charge", op="commit")
    commits = sample("effectq_claim_duration_seconds_count", op="commit")
    with pytest.raises(RetryLater, match="commit fenced"):
        tool._commit(call, {"id": "late"})
    assert sample("effectq_fenced_writes_total", tool="charge", op="commit") == before + 1
    assert sample("effectq_claim_duration_seconds_count", op="commit") == commits + 1
    assert ledger.counts()[("fenced", "commit")] == 1


def test_reconciler_resolutions_are_counted_by_tool_and_resolution(ledger: Ledger) -> None:
    ghost = ToolSpec(name="ghost", identity=("x",))
    effect = derive(ghost, "s-1", {"x": "1"})
    ledger.claim(effect, lease_s=0.05, holder="dead/1")
    time.sleep(0.1)
    before = sample("effectq_reconciler_resolutions_total", tool="ghost", resolution="unknown")
    # The provider has no lookup: UNKNOWN at once.
    reconciler = Reconciler(ledger, {"ghost": ghost}, observer=metrics.ReconcilerMetrics())
    assert reconciler.reconcile(effect.key) == "unknown"
    after = sample("effectq_reconciler_resolutions_total", tool="ghost", resolution="unknown")
    assert after == before + 1


def test_disabled_metrics_bind_no_ops() -> None:
    metrics.configure(enabled=False)  # EFFECTQ_METRICS_ENABLED=false, through the runtime
    try:
        bound = metrics.for_tool("tool_with_metrics_off")
        assert all(isinstance(c, metrics._Noop) for c in bound.claims.values())
        bound.claims["acquired"].inc()
        bound.duration.observe(1.0)
    finally:
        metrics.configure(enabled=True)
    assert (
        metrics.REGISTRY.get_sample_value(
            "effectq_claims_total", {"tool": "tool_with_metrics_off", "outcome": "acquired"}
        )
        is None
    )


# -- the scrape-time collector -----------------------------------------------------------


def test_collector_reads_the_ledgers_counters_and_lease_heads(
    ledger: Ledger, shared_redis_server: RedisServer
) -> None:
    live = [charge() for _ in range(3)]
    for effect in live:
        ledger.claim(effect, lease_s=60, holder="w/1")
    expired = charge()
    ledger.claim(expired, lease_s=0.05, holder="w/2")
    done = charge()
    granted = ledger.claim(done, lease_s=60, holder="w/3")
    ledger.commit(done.key, granted.token, {"id": "r"}, retention_s=60)
    ledger.claim(done, lease_s=60, holder="w/4")  # a duplicate at claim
    ledger.submit(done, message_id="m", pending_s=60)  # and at submit, twice
    ledger.submit(done, message_id="m", pending_s=60)
    ledger.submit(charge(done.scope, amount="99"), message_id="m", pending_s=60)  # conflict
    # A field the collector does not know (an old campaign counter) never becomes a label.
    ledger.client.hincrby(ledger.keyspace.index(0, "stats"), "cp:0123456789abcdef:CLAIMED", 1)
    time.sleep(0.2)

    broker = shared_redis_server.client(db=1)
    broker.flushdb()
    broker.hset("dramatiq:effectq.msgs", mapping={"a": "1", "b": "2"})
    broker.hset("dramatiq:effectq.XQ.msgs", "c", "3")
    found = families(
        collector.LedgerCollector(
            lambda: ledger, broker_url=f"{shared_redis_server.url[:-1]}1", queues=["effectq"]
        )
    )
    for family in found.values():
        assert_allowlisted(family)
    assert values(found["effectq_ledger_up"]) == {(): 1.0}
    assert values(found["effectq_inflight_claims"]) == {(("tool", "charge"),): 4.0}
    assert values(found["effectq_unknown_effects"]) == {(("tool", "charge"),): 0.0}
    assert values(found["effectq_expired_leases"]) == {(): 1.0}
    [lag] = found["effectq_reconciler_lag_seconds"].samples
    assert 0.15 <= lag.value < 5
    assert values(found["effectq_duplicates_suppressed"]) == {
        (("stage", "claim"), ("tool", "charge")): 1.0,
        (("stage", "submit"), ("tool", "charge")): 2.0,
    }
    assert values(found["effectq_conflicts"]) == {(("tool", "charge"),): 1.0}
    assert values(found["effectq_queue_messages"]) == {
        (("queue", "effectq"), ("state", "queued")): 2.0,
        (("queue", "effectq"), ("state", "delayed")): 0.0,
        (("queue", "effectq"), ("state", "dead")): 1.0,
    }


def test_collector_survives_an_unreachable_ledger() -> None:
    client = redis.Redis(
        port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0), decode_responses=True
    )
    found = families(collector.LedgerCollector(lambda: Ledger(client, allow_volatile=True)))
    assert list(found) == ["effectq_ledger_up"]
    assert values(found["effectq_ledger_up"]) == {(): 0.0}


def test_every_process_local_metric_is_allowlisted() -> None:
    import workers.examples  # noqa: F401

    local = [f for f in metrics.REGISTRY.collect() if f.name.startswith("effectq_")]
    assert {f.name for f in local} >= {
        "effectq_claims", "effectq_effects", "effectq_effect_duration_seconds",
        "effectq_claim_duration_seconds", "effectq_fenced_writes",
        "effectq_reconciler_resolutions",
    }  # fmt: skip
    for family in local:
        assert_allowlisted(family)


def test_a_label_outside_the_allowlist_is_caught() -> None:
    registry = CollectorRegistry()
    bad = Counter("effectq_sent_total", "per recipient: never do this", ["recipient"],
                  registry=registry)  # fmt: skip
    bad.labels("ops@example.com").inc()
    [family] = registry.collect()
    with pytest.raises(AssertionError):
        assert_allowlisted(family)


# -- the multiprocess directory ------------------------------------------------------------


def test_prepare_dir_empties_a_configured_directory(tmp_path: Path) -> None:
    (tmp_path / "counter_123.db").write_bytes(b"x")
    (tmp_path / "gauge_livesum_123.db").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("kept")
    path, created = server.prepare_dir(str(tmp_path))
    assert path == tmp_path and not created
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    fresh, created = server.prepare_dir("")
    assert created and fresh.is_dir() and not any(fresh.iterdir())
    server.remove_dir(fresh)
    assert not fresh.exists()


def test_reap_marks_dead_processes_and_keeps_their_counters(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = (
        "from prometheus_client import Counter, Gauge\n"
        "Counter('effectq_t_total', 'd', ['tool']).labels('charge').inc(3)\n"
        "Gauge('effectq_g', 'd', multiprocess_mode='livesum').set(1)\n"
    )
    env = {**os.environ, server.ENV_DIR: str(tmp_path)}
    dead = subprocess.run([sys.executable, "-c", script], env=env, check=True)
    assert dead.returncode == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names[0].startswith("counter_")
    [pid] = server.reap(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"counter_{pid}.db"]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    assert registry.get_sample_value("effectq_t_total", {"tool": "charge"}) == 3.0
    assert server.reap(tmp_path) == []  # the live ones (none here) are left alone


def test_claims_are_counted_by_the_queue_their_tool_is_consumed_from() -> None:
    """EffectqWorkersIdle is keyed by queue: a dead pool's queue must show no claims even
    while another pool's queue shows plenty. Every outcome is exported at 0 from binding."""
    from workers.tool import effect_tool

    def pay(target: str) -> dict[str, str]:
        return {"id": target}

    tool = effect_tool(identity=("target",), name="queued_probe", queue_name="payments")(pay)
    assert tool.actor.queue_name == "payments"  # bound to this process's runtime
    for outcome in metrics.CLAIM_OUTCOMES:
        labels = {"tool": "queued_probe", "outcome": outcome, "queue": "payments"}
        assert metrics.REGISTRY.get_sample_value("effectq_claims_total", labels) == 0.0, outcome
    metrics.for_tool("queued_probe").claims["acquired"].inc()
    labels = {"tool": "queued_probe", "outcome": "acquired", "queue": "payments"}
    assert metrics.REGISTRY.get_sample_value("effectq_claims_total", labels) == 1.0
