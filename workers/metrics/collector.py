"""The series read from Redis at scrape time: the ledger's counters and lease indexes, and
the Redis broker's queue depths."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from dedupe import EffectqError, Ledger
from dedupe.states import INDEXED

from .. import registry
from ..broker.gate import paused
from ..broker.keys import queue_hash

__all__ = ["LedgerCollector"]

log = logging.getLogger("effectq.metrics")


class LedgerCollector:
    """Series read from Redis at scrape time: the ledger's counters and lease indexes (one
    pipelined pass over the buckets' stats hashes and the heads of their lease indexes; no
    keyspace scan) and the broker's queue depths. A Redis error makes ``effectq_ledger_up``
    0 and drops the other series of that scrape; it never fails the scrape."""

    def __init__(
        self,
        ledger: Callable[[], Ledger],
        *,
        broker_url: str = "",
        queues: Sequence[str] = (),
    ) -> None:
        self._ledger = ledger
        self._broker_url = broker_url
        self._queues = list(queues)
        self._broker: redis.Redis | None = None

    def describe(self) -> list[Metric]:
        return []  # nothing to ask Redis at registration

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "effectq_ledger_up", "1 if this scrape read the ledger's counters from Redis."
        )
        try:
            ledger = self._ledger()
            counts = ledger.counts()
            now_ms, oldest_ms, expired = _lease_heads(ledger)
        except (EffectqError, redis.RedisError) as exc:
            log.warning("metrics: cannot read the ledger: %s", exc)
            up.add_metric([], 0)
            yield up
        else:
            up.add_metric([], 1)
            yield up
            yield from _ledger_families(counts, now_ms, oldest_ms, expired)
            yield from self._paused_family(ledger)
        yield from self._queue_families()

    def _paused_family(self, ledger: Ledger) -> Iterator[Metric]:
        """``effectq_paused``: 1 for each declared tool and each of these queues an operator
        paused, 0 for the others (every series born at 0: a pause is a change, not a new
        series)."""
        try:
            held = paused(ledger)
        except (EffectqError, redis.RedisError) as exc:
            log.warning("metrics: cannot read the pause state: %s", exc)
            return
        family = GaugeMetricFamily(
            "effectq_paused",
            "1 while an operator has paused this tool or queue (effectq pause): its messages "
            "wait, none runs. From the ledger, global.",
            labels=["kind", "name"],
        )
        targets = [("tool", t.name) for t in registry.tools()]
        targets += [("queue", q) for q in self._queues]
        for target in sorted(set(targets)):
            family.add_metric(list(target), 1 if target in held else 0)
        yield family

    def _queue_families(self) -> Iterator[Metric]:
        url = self._broker_url
        if not self._queues:
            return
        if url.startswith(("amqp://", "amqps://")):
            sizes = self._rabbitmq_sizes(url)
        elif url.startswith(("redis://", "rediss://", "unix://")):
            sizes = self._redis_sizes(url)
        else:
            return
        if sizes is None:
            return
        family = GaugeMetricFamily(
            "effectq_queue_messages",
            "Messages the broker holds per queue: queued (waiting; on Redis also those being "
            "worked on, on RabbitMQ only those ready), delayed (retries waiting for their "
            "time), dead (dead-lettered).",
            labels=["queue", "state"],
        )
        for i, queue in enumerate(self._queues):
            for j, state in enumerate(("queued", "delayed", "dead")):
                family.add_metric([queue, state], sizes[3 * i + j])
        yield family

    def _names(self) -> list[str]:
        return [f"{queue}{suffix}" for queue in self._queues for suffix in ("", ".DQ", ".XQ")]

    def _redis_sizes(self, url: str) -> list[int] | None:
        try:
            if self._broker is None:
                self._broker = redis.Redis.from_url(
                    url, socket_timeout=2.0, socket_connect_timeout=2.0
                )
            pipe = self._broker.pipeline(transaction=False)
            for name in self._names():
                pipe.hlen(queue_hash(name))
            return [int(n) for n in pipe.execute()]
        except redis.RedisError as exc:
            log.warning("metrics: cannot read the broker's queues: %s", type(exc).__name__)
            return None

    def _rabbitmq_sizes(self, url: str) -> list[int] | None:
        """Ready messages per queue, by a passive declare on a connection of the scrape's
        own (a queue not declared yet holds none)."""
        import pika  # type: ignore[import-untyped]
        import pika.exceptions  # type: ignore[import-untyped]

        params = pika.URLParameters(url.split(";")[0])
        params.socket_timeout = params.blocked_connection_timeout = 2.0
        sizes: list[int] = []
        try:
            with pika.BlockingConnection(params) as connection:
                for name in self._names():
                    channel = connection.channel()
                    try:
                        declared = channel.queue_declare(queue=name, passive=True)
                        sizes.append(int(declared.method.message_count))
                        channel.close()
                    except pika.exceptions.ChannelClosedByBroker:
                        sizes.append(0)  # 404: not declared yet
        except (pika.exceptions.AMQPError, OSError) as exc:
            log.warning("metrics: cannot read the broker's queues: %s", type(exc).__name__)
            return None
        return sizes


def _lease_heads(ledger: Ledger) -> tuple[int, int | None, int]:
    """(server ms, the earliest lease deadline of any bucket, deadlines already passed).

    Two round trips: TIME, then per bucket the head of its lease index and a ZCOUNT up to
    now (O(log n) each).
    """
    now = ledger.server_time_ms()
    pipe = ledger.client.pipeline(transaction=False)
    for index in ledger.lease_indexes():
        pipe.zrange(index, 0, 0, withscores=True)
        pipe.zcount(index, "-inf", now)
    replies = pipe.execute()
    heads = [float(head[0][1]) for head in replies[::2] if head]
    expired = sum(int(n) for n in replies[1::2])
    return now, int(min(heads)) if heads else None, expired


def _ledger_families(
    counts: dict[tuple[str, str], int], now_ms: int, oldest_ms: int | None, expired: int
) -> Iterator[Metric]:
    tools = sorted(
        {
            label
            for (kind, label) in counts
            # The stats hash counts records of the indexed states, and three events.
            if kind in {*INDEXED, "dup_submit", "dup_claim", "conflict"}
        }
    )

    def per_tool(kind: str) -> Iterator[tuple[str, int]]:
        for tool in tools:
            yield tool, counts.get((kind, tool), 0)

    dups = CounterMetricFamily(
        "effectq_duplicates_suppressed",
        "Duplicates suppressed, by stage: submit (the producer's call found the effect DONE or "
        "already pending: not enqueued) and claim (a delivered message found it DONE: acked "
        "without executing). From the ledger's counters, global.",
        labels=["tool", "stage"],
    )
    for tool in tools:
        dups.add_metric([tool, "submit"], counts.get(("dup_submit", tool), 0))
        dups.add_metric([tool, "claim"], counts.get(("dup_claim", tool), 0))
    yield dups
    conflicts = CounterMetricFamily(
        "effectq_conflicts",
        "Calls refused because their bound fields differ from the recorded effect's (at "
        "submit or at claim). From the ledger's counters, global.",
        labels=["tool"],
    )
    for tool, n in per_tool("conflict"):
        conflicts.add_metric([tool], n)
    yield conflicts
    gauges = (
        ("effectq_unknown_effects", "UNKNOWN", "Effects UNKNOWN: blocked until an operator acts."),
        (
            "effectq_inflight_claims",
            "CLAIMED",
            "Effects CLAIMED by a worker (lease live, or expired and not yet taken over).",
        ),
        (
            "effectq_expired_claims",
            "RECONCILING",
            "Claims whose lease expired and that a reconciler holds (RECONCILING), unresolved.",
        ),
    )
    for name, state, doc in gauges:
        gauge = GaugeMetricFamily(name, doc, labels=["tool"])
        for tool, n in per_tool(state):
            gauge.add_metric([tool], n)
        yield gauge
    yield GaugeMetricFamily(
        "effectq_expired_leases",
        "Lease deadlines already passed (CLAIMED or RECONCILING) that no reconciler has taken "
        "over yet, all tools.",
        value=expired,
    )
    lag = max(0, now_ms - oldest_ms) / 1000 if oldest_ms is not None else 0.0
    yield GaugeMetricFamily(
        "effectq_reconciler_lag_seconds",
        "How long the oldest expired lease has waited for a reconciler (0: none waiting).",
        value=lag,
    )
