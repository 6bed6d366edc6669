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

Here: the instruments and the hooks that bump them. ``collector`` reads the scrape-time
series, ``server`` serves an endpoint and keeps a pool's multiprocess directory.

Labels are bounded (``LABELS``): a tool name, an outcome from a fixed set, a queue name;
never a recipient, an effect key or a campaign id.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

__all__ = [
    "DEAD_LETTER_REASONS",
    "DEFERRAL_CAUSES",
    "LABELS",
    "LABEL_VALUES",
    "PAUSE_KINDS",
    "REGISTRY",
    "ReconcilerMetrics",
    "ToolMetrics",
    "WorkerRestarts",
    "configure",
    "dead_letter",
    "dead_letter_unrecorded",
    "deferred",
    "for_tool",
    "ledger_seconds",
]

#: Every label an effectq metric may carry ("le": histogram buckets).
LABELS = frozenset(
    {"tool", "outcome", "stage", "op", "resolution", "queue", "state", "reason", "le"}
    | {"version"}  # effectq_build_info (metrics.build): one value per installation
    | {"cause"}  # effectq_deferred_total: why a message was held back (DEFERRAL_CAUSES)
    | {"kind", "name"}  # effectq_paused: a declared tool or a pool's queue
)
#: Why a message was dead-lettered: the closed set of ``effectq_dead_letters_total``'s
#: ``reason`` label (the full reason is in the ledger's dead-letter stream).
DEAD_LETTER_REASONS = (
    "conflict",
    "invalid_message",
    "unknown_tool",
    "stale",
    "rejected",
    "retries_exhausted",
    "undecodable",
    "other",
)
#: Why a message was held back before its claim (``workers.broker.gate``): paused (its tool
#: or queue), over its tool's declared rate or concurrency, or the gate could not read the
#: ledger (unavailable). ``effectq_deferred_total``'s ``cause``.
DEFERRAL_CAUSES = ("paused", "rate", "concurrency", "unavailable")
#: What an operator can pause: ``effectq_paused``'s ``kind`` (its ``name`` is a declared
#: tool or queue).
PAUSE_KINDS = ("tool", "queue")
#: The closed sets of values; "tool" and "queue" are the declared tools and queues.
LABEL_VALUES: dict[str, frozenset[str]] = {
    "outcome": frozenset(
        {"acquired", "duplicate", "conflict", "in_flight", "blocked", "stale", "unavailable"}
        | {"succeeded", "failed", "uncertain"}
    ),
    "stage": frozenset({"submit", "claim"}),
    "op": frozenset({"claim", "commit", "fail", "handover", "heartbeat", "unknown"}),
    "resolution": frozenset({"found", "not_executed", "deferred", "unknown"}),
    "state": frozenset({"queued", "delayed", "dead"}),
    "reason": frozenset(DEAD_LETTER_REASONS),
    "cause": frozenset(DEFERRAL_CAUSES),
    "kind": frozenset(PAUSE_KINDS),
}

CLAIM_OUTCOMES = (
    "acquired", "duplicate", "conflict", "in_flight", "blocked", "stale", "unavailable",
)  # fmt: skip
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
    "Claims taken on the worker path, by the ledger's answer and the queue the message came "
    "from (the tool's actor's queue).",
    ["tool", "outcome", "queue"],
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

DEAD_LETTERS = Counter(
    "effectq_dead_letters_total",
    "Messages dead-lettered (never executed), by tool and why: conflict, invalid_message, "
    "unknown_tool, stale (past the provider's window), rejected (by the provider), "
    "retries_exhausted, undecodable, other.",
    ["tool", "reason"],
)
DEAD_LETTERS_UNRECORDED = Counter(
    "effectq_dead_letters_unrecorded_total",
    "Messages dead-lettered whose reason could not be written to the ledger (it was down or "
    "refusing writes): the broker's dead-letter queue holds them, the ledger does not.",
)

DEFERRED = Counter(
    "effectq_deferred_total",
    "Messages held back before their claim, by why: paused (the tool or its queue), rate or "
    "concurrency (over the tool's declared limit), unavailable (the pause state or a limit "
    "could not be read). Each waits in the delay queue; none is an attempt or a dead letter.",
    ["tool", "cause"],
)

LAST_PASS = Gauge(
    "effectq_reconciler_last_pass_timestamp_seconds",
    "When this reconciler last finished a pass over its buckets (Unix time).",
    multiprocess_mode="max",
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


_tools: dict[tuple[str, str | None], ToolMetrics] = {}
_lock = threading.Lock()
_enabled = True


def configure(*, enabled: bool) -> None:
    """Count, or not (EFFECTQ_METRICS_ENABLED): set by the process's runtime before any
    tool binds its counters."""
    global _enabled
    with _lock:
        if enabled != _enabled:
            _enabled = enabled
            _tools.clear()
            _ledger_seconds.clear()


def for_tool(name: str, queue: str | None = None) -> ToolMetrics:
    """The bound counters of tool ``name`` (no-ops when metrics are disabled), every bounded
    label set of its counters exported at 0 from then on.

    ``queue`` labels its claims (EffectqWorkersIdle is keyed by queue); default: the queue
    of the declared tool's actor. A tool not bound yet has no actor, so no queue and no
    claim to count: its claims are no-ops until binding asks again."""
    if queue is None:
        queue = _actor_queue(name)
    with _lock:
        found = _tools.get((name, queue))
        if found is None:
            if _enabled:
                found = ToolMetrics(
                    claims={
                        o: _NOOP if queue is None else CLAIMS.labels(name, o, queue)
                        for o in CLAIM_OUTCOMES
                    },
                    effects={o: EFFECTS.labels(name, o) for o in EFFECT_OUTCOMES},
                    duration=EFFECT_SECONDS.labels(name),
                    fenced={op: FENCED.labels(name, op) for op in FENCED_OPS},
                )
                # Born at 0, not at 1: increase() over a series that appears with the first
                # event sees none, and the first dead letter of a pod would never alert.
                for reason in DEAD_LETTER_REASONS:
                    DEAD_LETTERS.labels(name, reason)
                for resolution in RESOLUTIONS.values():
                    RESOLVED.labels(name, resolution)
                for cause in DEFERRAL_CAUSES:
                    DEFERRED.labels(name, cause)
            else:
                found = ToolMetrics(
                    claims=dict.fromkeys(CLAIM_OUTCOMES, _NOOP),
                    effects=dict.fromkeys(EFFECT_OUTCOMES, _NOOP),
                    duration=_NOOP,
                    fenced=dict.fromkeys(FENCED_OPS, _NOOP),
                )
            _tools[(name, queue)] = found
    return found


def _actor_queue(name: str) -> str | None:
    """The queue of the declared tool ``name``'s actor, once it is bound."""
    from .. import registry

    for tool in registry.tools():
        if tool.name == name:
            return tool.queue_name  # read without binding it: binding asks for_tool
    return None


_ledger_seconds: dict[str, Any] = {}


def ledger_seconds(op: str) -> Any:
    """The bound histogram of one worker-path ledger operation."""
    child = _ledger_seconds.get(op)
    if child is None:
        child = LEDGER_SECONDS.labels(op) if _enabled else _NOOP
        _ledger_seconds[op] = child
    return child


def dead_letter(tool: str, reason: str) -> None:
    """Count one dead-lettered message (``reason``: one of DEAD_LETTER_REASONS)."""
    if _enabled:
        DEAD_LETTERS.labels(tool, reason if reason in DEAD_LETTER_REASONS else "other").inc()


def deferred(tool: str, cause: str) -> None:
    """Count one message held back before its claim (``cause``: one of DEFERRAL_CAUSES)."""
    if _enabled and cause in DEFERRAL_CAUSES:
        DEFERRED.labels(tool, cause).inc()


def dead_letter_unrecorded() -> None:
    """Count a dead letter whose reason the ledger did not take (logged by the caller)."""
    if _enabled:
        DEAD_LETTERS_UNRECORDED.inc()


class ReconcilerMetrics:
    """A reconciler's observer (``reconciler.Observer``): resolutions and fenced writes by
    tool, the claims of tools it does not declare, and when its last pass finished."""

    def __init__(self) -> None:
        self._unowned_tools: set[str] = set()
        #: When the last pass finished (time.monotonic()): kept whether or not metrics are
        #: enabled (its gauge is EffectqReconcilerStalled's).
        self.last_pass: float | None = None
        #: When the loop last turned, the pass finished or failed (time.monotonic()): the
        #: liveness probe's. A ledger outage fails every pass; a restart would not help.
        self.last_turn: float | None = None

    def resolved(self, tool: str, action: str, fenced: bool) -> None:
        if not _enabled:
            return
        if fenced:
            FENCED.labels(tool, RECONCILER_OPS[action]).inc()
        else:
            RESOLVED.labels(tool, RESOLUTIONS[action]).inc()

    def unowned(self, counts: Mapping[str, int]) -> None:
        if not _enabled:
            return
        with _lock:
            for tool in self._unowned_tools | set(counts):  # a tool no longer seen: 0
                UNOWNED.labels(tool).set(counts.get(tool, 0))
            self._unowned_tools.update(counts)

    def pass_finished(self) -> None:
        self.last_pass = time.monotonic()
        if _enabled:
            LAST_PASS.set_to_current_time()

    def pass_attempted(self) -> None:
        self.last_turn = time.monotonic()


class WorkerRestarts:
    """``effectq_worker_restarts_total``: the children a pool's supervisor respawned. A
    collector the supervisor serves itself (it is not one of the pool's multiprocess
    writers, and its count must not depend on a file of theirs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def inc(self) -> None:
        with self._lock:
            self._count += 1

    @property
    def count(self) -> int:
        return self._count

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "effectq_worker_restarts",
            "Worker processes this pool's supervisor restarted after they exited.",
            value=self._count,
        )
