"""Prometheus metrics (DESIGN §6). Each metric, and the question it answers: docs/metrics.md.

Three sources, one exposition:

* **Process-local counters and histograms**, recorded on the worker path (``workers.tool``)
  and by the reconciler. A worker pool runs them in prometheus-client's multiprocess mode:
  the supervisor points ``PROMETHEUS_MULTIPROC_DIR`` at a directory of its own in its
  children's environment (so it is set before any of them imports prometheus-client), each
  forked Dramatiq worker process writes its own mmap files there, and the supervisor serves
  their sum. A dead process's counters stay in the sum; ``reap`` drops what
  ``multiprocess.mark_process_dead`` says must go (live gauges). The hot path only bumps
  pre-bound counters: no Redis round trip, no label lookup.
* **Ledger-derived series**, read from Redis at scrape time by ``LedgerCollector``, from
  the per-bucket counters the ledger keeps (``Ledger.counts()``, no keyspace scan) and the
  lease indexes' heads: duplicates suppressed at submit *and* claim (submit-stage
  suppression happens in short-lived producers, which never serve metrics), conflicts,
  unknown / in-flight / expired backlogs, reconciler lag. They are global: every endpoint
  (each pool, each reconciler) shows the same values, so aggregate them with ``max``
  across targets, never ``sum``.
* **Broker queue depth** (Redis broker), also read at scrape time.

Labels are bounded (``LABELS``): a tool name, an outcome from a fixed set, a queue name;
never a recipient, an effect key or a campaign id.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

import reconciler.reconciler as _reconciler
from dedupe import EffectqError

from .settings import settings

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from dedupe import Ledger

__all__ = [
    "ENV_DIR",
    "LABELS",
    "LABEL_VALUES",
    "LedgerCollector",
    "MetricsServer",
    "ToolMetrics",
    "exposition",
    "for_tool",
    "ledger_seconds",
    "prepare_dir",
    "reap",
    "remove_dir",
    "serve",
]

log = logging.getLogger(__name__)

ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"

#: Every label an effectq metric may carry ("le": histogram buckets).
LABELS = frozenset({"tool", "outcome", "stage", "op", "resolution", "queue", "state", "le"})
#: The closed sets of values; "tool" and "queue" are the declared tools and queues.
LABEL_VALUES: dict[str, frozenset[str]] = {
    "outcome": frozenset(
        {"acquired", "duplicate", "conflict", "in_flight", "blocked", "unavailable"}
        | {"succeeded", "failed", "uncertain"}
    ),
    "stage": frozenset({"submit", "claim"}),
    "op": frozenset({"claim", "commit", "fail", "handover", "heartbeat", "unknown"}),
    "resolution": frozenset({"found", "not_executed", "deferred", "unknown"}),
    "state": frozenset({"queued", "delayed", "dead"}),
}

CLAIM_OUTCOMES = ("acquired", "duplicate", "conflict", "in_flight", "blocked", "unavailable")
EFFECT_OUTCOMES = ("succeeded", "failed", "uncertain")
WORKER_OPS = ("claim", "commit", "fail", "handover")
FENCED_OPS = ("commit", "fail", "handover", "heartbeat", "unknown")
# The reconciler's decision → the resolution it counts, and the ledger write it makes.
RESOLUTIONS = {"done": "found", "failed": "not_executed", "defer": "deferred", "unknown": "unknown"}
RECONCILER_OPS = {"done": "commit", "failed": "fail", "defer": "heartbeat", "unknown": "unknown"}

# Provider calls: milliseconds to a minute. Ledger calls: one Redis round trip.
EFFECT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LEDGER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)

CLAIMS = Counter(
    "effectq_claims_total",
    "Claims taken on the worker path, by the ledger's answer.",
    ["tool", "outcome"],
)
EFFECTS = Counter(
    "effectq_effects_total",
    "Tool bodies run under an acquired claim, by outcome (succeeded: returned a receipt; "
    "failed: known not executed; uncertain: handed to the reconciler).",
    ["tool", "outcome"],
)
EFFECT_SECONDS = Histogram(
    "effectq_effect_duration_seconds",
    "Time in the tool body (the provider call), every outcome.",
    ["tool"],
    buckets=EFFECT_BUCKETS,
)
LEDGER_SECONDS = Histogram(
    "effectq_claim_duration_seconds",
    "Ledger round trips of the worker path, by operation.",
    ["op"],
    buckets=LEDGER_BUCKETS,
)
FENCED = Counter(
    "effectq_fenced_writes_total",
    "Ledger writes refused because the writer's fencing token was stale (a holder paused "
    "past its lease, a reconciler that lost a race).",
    ["tool", "op"],
)
RESOLVED = Counter(
    "effectq_reconciler_resolutions_total",
    "Expired claims the reconciler took over, by what it decided.",
    ["tool", "resolution"],
)

DEAD_LETTERS_UNRECORDED = Counter(
    "effectq_dead_letters_unrecorded_total",
    "Messages dead-lettered whose reason could not be written to the ledger (it was down or "
    "refusing writes): the broker's dead-letter queue holds them, the ledger does not.",
)

UNOWNED = Gauge(
    "effectq_reconciler_unowned_claims",
    "Expired claims the reconciler left alone at its last pass because it does not declare "
    "their tool (a reconciler that does must run).",
    ["tool"],
    multiprocess_mode="max",
)


class _Noop:
    """Stands in for a metric child when EFFECTQ_METRICS_ENABLED=false."""

    def inc(self, amount: float = 1) -> None:
        return None

    def observe(self, amount: float) -> None:
        return None


_NOOP = _Noop()


@dataclass(frozen=True)
class ToolMetrics:
    """One tool's counters, bound once so that the hot path is a dict lookup and an add."""

    claims: dict[str, Any]
    effects: dict[str, Any]
    duration: Any
    fenced: dict[str, Any]


_tools: dict[str, ToolMetrics] = {}
_lock = threading.Lock()


def for_tool(name: str) -> ToolMetrics:
    """The bound counters of tool ``name`` (no-ops when metrics are disabled)."""
    with _lock:
        found = _tools.get(name)
        if found is None:
            if settings().metrics_enabled:
                found = ToolMetrics(
                    claims={o: CLAIMS.labels(name, o) for o in CLAIM_OUTCOMES},
                    effects={o: EFFECTS.labels(name, o) for o in EFFECT_OUTCOMES},
                    duration=EFFECT_SECONDS.labels(name),
                    fenced={op: FENCED.labels(name, op) for op in FENCED_OPS},
                )
            else:
                found = ToolMetrics(
                    claims=dict.fromkeys(CLAIM_OUTCOMES, _NOOP),
                    effects=dict.fromkeys(EFFECT_OUTCOMES, _NOOP),
                    duration=_NOOP,
                    fenced=dict.fromkeys(FENCED_OPS, _NOOP),
                )
            _tools[name] = found
    return found


_ledger_seconds: dict[str, Any] = {}


def ledger_seconds(op: str) -> Any:
    """The bound histogram of one worker-path ledger operation."""
    child = _ledger_seconds.get(op)
    if child is None:
        child = LEDGER_SECONDS.labels(op) if settings().metrics_enabled else _NOOP
        _ledger_seconds[op] = child
    return child


def dead_letter_unrecorded() -> None:
    """Count a dead letter whose reason the ledger did not take (logged by the caller)."""
    if settings().metrics_enabled:
        DEAD_LETTERS_UNRECORDED.inc()


def _on_resolution(tool: str, action: str, fenced: bool) -> None:
    if not settings().metrics_enabled:
        return
    if fenced:
        FENCED.labels(tool, RECONCILER_OPS[action]).inc()
    else:
        RESOLVED.labels(tool, RESOLUTIONS[action]).inc()


_reconciler.observers.append(_on_resolution)

_unowned_tools: set[str] = set()


def _on_unowned(counts: Mapping[str, int]) -> None:
    if not settings().metrics_enabled:
        return
    with _lock:
        for tool in _unowned_tools | set(counts):  # a tool no longer seen goes back to 0
            UNOWNED.labels(tool).set(counts.get(tool, 0))
        _unowned_tools.update(counts)


_reconciler.unowned_observers.append(_on_unowned)


# -- the scrape-time collector --------------------------------------------------------------


class LedgerCollector:
    """Series read from Redis at scrape time: the ledger's counters and lease indexes (one
    pipelined pass over the buckets' stats hashes and the heads of their lease indexes; no
    keyspace scan) and the broker's queue depths. A Redis error makes ``effectq_ledger_up``
    0 and drops the other series of that scrape; it never fails the scrape."""

    def __init__(
        self,
        ledger: Callable[[], Ledger] | None = None,
        *,
        broker_url: str | None = None,
        queues: Sequence[str] = (),
        broker_namespace: str = "dramatiq",
    ) -> None:
        self._ledger = ledger or _runtime_ledger
        self._broker_url = broker_url
        self._queues = list(queues)
        self._namespace = broker_namespace
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
        yield from self._queue_families()

    def _queue_families(self) -> Iterator[Metric]:
        url = self._broker_url if self._broker_url is not None else settings().broker_url
        if not url.startswith(("redis://", "rediss://", "unix://")) or not self._queues:
            return
        family = GaugeMetricFamily(
            "effectq_queue_messages",
            "Messages the broker holds per queue: queued (not yet acked, in progress included), "
            "delayed (retries waiting for their time), dead (dead-lettered).",
            labels=["queue", "state"],
        )
        try:
            if self._broker is None:
                self._broker = redis.Redis.from_url(
                    url, socket_timeout=2.0, socket_connect_timeout=2.0
                )
            pipe = self._broker.pipeline(transaction=False)
            for queue in self._queues:
                for suffix in ("", ".DQ", ".XQ"):
                    pipe.hlen(f"{self._namespace}:{queue}{suffix}.msgs")
            sizes = pipe.execute()
        except redis.RedisError as exc:
            log.warning("metrics: cannot read the broker's queues: %s", exc)
            return
        for i, queue in enumerate(self._queues):
            for j, state in enumerate(("queued", "delayed", "dead")):
                family.add_metric([queue, state], int(sizes[3 * i + j]))
        yield family


def _runtime_ledger() -> Ledger:
    from . import runtime

    return runtime.ledger()


def _lease_heads(ledger: Ledger) -> tuple[int, int | None, int]:
    """(server ms, the earliest lease deadline of any bucket, deadlines already passed).

    Two round trips: TIME, then per bucket the head of its lease index and a ZCOUNT up to
    now (O(log n) each). The key names are the ledger's (``Ledger._tag``).
    """
    now = ledger.server_time_ms()
    pipe = ledger.client.pipeline(transaction=False)
    for bucket in range(ledger.buckets):
        index = f"{ledger._tag(bucket)}:leases"
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
            if kind in {"CLAIMED", "RECONCILING", "UNKNOWN", "dup_submit", "dup_claim", "conflict"}
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


# -- exposition -------------------------------------------------------------------------------


class _Union:
    def __init__(self, *sources: Collector) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        for source in self._sources:
            yield from source.collect()


def exposition(
    *,
    multiprocess_dir: str | None = None,
    queues: Sequence[str] | None = None,
    ledger: Callable[[], Ledger] | None = None,
) -> Collector:
    """What an endpoint serves: the process-local metrics (the sum over a multiprocess
    directory, else this process's registry) and the scrape-time ledger and broker series."""
    path = multiprocess_dir if multiprocess_dir is not None else os.environ.get(ENV_DIR)
    local: Collector = (
        MultiProcessCollector(None, path=path)  # type: ignore[no-untyped-call]
        if path
        else REGISTRY
    )
    queues = [settings().queue] if queues is None else list(queues)
    return _Union(local, LedgerCollector(ledger, queues=queues))


@dataclass
class MetricsServer:
    """A running exposition endpoint (a daemon thread)."""

    host: str
    port: int
    _server: WSGIServer = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(
    port: int | None = None,
    host: str | None = None,
    *,
    multiprocess_dir: str | None = None,
    queues: Sequence[str] | None = None,
) -> MetricsServer | None:
    """Serve ``exposition(...)`` on ``host:port`` (default EFFECTQ_METRICS_HOST / _PORT) from
    a daemon thread; None when the port is 0 or cannot be bound (logged: a busy metrics port
    must not stop a worker pool or a reconciler)."""
    cfg = settings()
    port = cfg.metrics_port if port is None else port
    host = cfg.metrics_host if host is None else host
    if port <= 0:
        return None
    source = exposition(multiprocess_dir=multiprocess_dir, queues=queues)
    try:
        server, thread = start_http_server(port, addr=host, registry=source)
    except OSError as exc:
        log.error("metrics: cannot listen on %s:%d: %s", host, port, exc)
        return None
    log.info("metrics on http://%s:%d/metrics", host, port)
    return MetricsServer(host, port, server, thread)


# -- the multiprocess directory of a worker pool --------------------------------------------

_DB = re.compile(r"^(?:counter|histogram|summary|gauge_[a-z]+)_(\d+)\.db$")
_LIVE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")


def prepare_dir(configured: str | None = None) -> tuple[Path, bool]:
    """The pool's multiprocess directory, emptied of every earlier run's files: the
    configured one (EFFECTQ_METRICS_DIR, then an inherited PROMETHEUS_MULTIPROC_DIR), else a
    fresh temporary one. Returns (path, whether it was created here, to remove at exit)."""
    chosen = configured if configured is not None else settings().metrics_dir
    chosen = chosen or os.environ.get(ENV_DIR, "")
    if not chosen:
        return Path(tempfile.mkdtemp(prefix="effectq-metrics-")), True
    path = Path(chosen)
    path.mkdir(parents=True, exist_ok=True)
    for entry in path.iterdir():
        if _DB.match(entry.name):
            entry.unlink(missing_ok=True)
    return path, False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(path: Path) -> list[int]:
    """``mark_process_dead`` for every gone process that left live-gauge files in ``path``
    (the only files it concerns); the pids reaped. A pool's metrics are written by
    Dramatiq's forked worker processes, whose pids the supervisor never sees, hence the
    directory is the list. Counters and histograms of a dead process stay in the sum: its
    work is still done."""
    pids = {int(m.group(1)) for e in path.iterdir() if (m := _LIVE.match(e.name))}
    dead = sorted(pid for pid in pids if not _alive(pid))
    for pid in dead:
        mark_process_dead(pid, str(path))  # type: ignore[no-untyped-call]
    return dead


def remove_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(path)
