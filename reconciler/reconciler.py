"""The reconciler: resolves expired claims by asking the provider what really happened.

It scans the bucketed lease indexes (never the keyspace), takes each expired claim over
under a new fencing token, looks the effect up, and decides (DESIGN §4):

    found                                        → DONE with the provider's receipt
    not found, inside the settle window          → look again later (lookups lag)
    not found after it, authoritative, within
      the provider's idempotency window, and no
      late receipt says otherwise                → FAILED: not executed, the key is free
    lookup unavailable                           → back off, up to a budget, then UNKNOWN
    no lookup / not authoritative / too old      → UNKNOWN, for an operator

It never enqueues work: a FAILED key is executed by the message's own next delivery.
Several reconcilers may run at once; the token makes every write theirs alone.

A pass looks its claims up concurrently on a bounded thread pool: at most
``lookup_concurrency`` lookups at a time through one lookup object (an attribute of the
lookup, ``DEFAULT_LOOKUP_CONCURRENCY`` when it has none), so tools sharing one provider's
lookup share its limit. A claim is taken over only once its lookup has a slot, so a queued
one holds no lease. Claims under the limit are decided within one lookup time of the pass
that finds them, not one lookup time apart.

A reconciler only touches the claims of tools it declares: another tool's expired claim is
left for a reconciler that knows how to look it up (never taken over, never made UNKNOWN
for want of a spec here), and reported to the observer (``Observer.unowned``).
Reconcilers with the same tools divide the buckets among themselves; each distinct set of
tools is a group of its own that covers every bucket, so every tool's claims are scanned by
someone who knows it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from dedupe import (
    EffectqError,
    Found,
    Ledger,
    LookupResult,
    NotFound,
    RecordTooLargeError,
    SpecError,
    Takeover,
    ToolSpec,
    Unavailable,
)
from dedupe.failpoints import failpoint
from dedupe.spec import DEFAULT_RETENTION_S, EffectLookup, Lookup, LookupContext

__all__ = [
    "DEFAULT_LOOKUP_CONCURRENCY", "Decision", "Observer", "Reconciler", "Tracer", "decide",
    "lookup_concurrency",
]  # fmt: skip

log = logging.getLogger(__name__)

Action = Literal["done", "failed", "defer", "unknown"]
GROUP = "reconcilers"
#: Lookups run at once through one lookup object that does not set ``lookup_concurrency``.
DEFAULT_LOOKUP_CONCURRENCY = 8
# The pass's threads, whatever the limits add up to: lookups wait on I/O, not on the CPU.
_MAX_THREADS = 64


def lookup_concurrency(lookup: Lookup) -> int:
    """How many lookups ``lookup`` may run at once (its ``lookup_concurrency``)."""
    n = getattr(lookup, "lookup_concurrency", DEFAULT_LOOKUP_CONCURRENCY)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise SpecError("a lookup's lookup_concurrency must be a positive integer")
    return n


class Observer(Protocol):
    """What a reconciler reports as it goes (``workers.metrics.ReconcilerMetrics`` counts
    it); every call must be cheap and must not raise."""

    def resolved(self, tool: str, action: Action, fenced: bool) -> None:
        """A decision written (or fenced) for an effect of ``tool``."""

    def unowned(self, counts: Mapping[str, int]) -> None:
        """After a pass: the expired claims it left alone, per tool it does not declare."""

    def pass_finished(self) -> None:
        """A pass over its buckets finished (the stalled alert's signal)."""

    def pass_attempted(self) -> None:
        """The loop turned: a pass finished or failed (the liveness signal)."""


class _Silent:
    def resolved(self, tool: str, action: Action, fenced: bool) -> None:
        return None

    def unowned(self, counts: Mapping[str, int]) -> None:
        return None

    def pass_finished(self) -> None:
        return None

    def pass_attempted(self) -> None:
        return None


class Tracer(Protocol):
    """Spans around the provider lookups (``workers.tracing.Spans``: OpenTelemetry when it
    is on); attributes are the tool, the key's prefix and the token, never the key."""

    def span(self, name: str, *, tool: str, key: str, token: int) -> AbstractContextManager[object]:
        """A span named ``name`` around what the ``with`` block does."""


class _Untraced:
    def span(self, name: str, *, tool: str, key: str, token: int) -> AbstractContextManager[object]:
        return nullcontext()


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    delay_s: float = 0.0
    receipt: dict[str, Any] | None = None
    raw: str | None = None


def decide(
    takeover: Takeover,
    spec: ToolSpec | None,
    result: LookupResult | None,
    *,
    budget: int,
    backoff_s: float = 1.0,
) -> Decision:
    """The reconciler's decision for one taken-over effect; pure, so it can be read alone."""
    if spec is None:
        return Decision("unknown", f"tool {takeover.tool!r} is not declared here")
    if spec.lookup is None or result is None:
        return Decision("unknown", "the provider has no lookup")
    if isinstance(result, Found):
        return Decision("done", "reconciled: found at the provider", receipt=result.receipt,
                        raw=result.raw)  # fmt: skip
    if isinstance(result, Unavailable):
        settles_at = result.settles_at_ms
        inside = takeover.now_ms - takeover.claimed_ms <= spec.provider_window_s * 1000
        if settles_at is not None and takeover.now_ms < settles_at and inside:
            return Decision("defer", f"lookup not settled: {result.reason}",
                            delay_s=(settles_at - takeover.now_ms) / 1000)  # fmt: skip
        if takeover.rounds >= budget:
            return Decision(
                "unknown", f"lookup unavailable {takeover.rounds} times: {result.reason}"
            )
        return Decision("defer", f"lookup unavailable: {result.reason}",
                        delay_s=min(backoff_s * 2.0**takeover.rounds, 60.0))  # fmt: skip
    assert isinstance(result, NotFound)
    if not result.authoritative:
        return Decision("unknown", "not found, from a lookup that is not authoritative")
    if takeover.late_receipts:
        return Decision("unknown", "not found, yet a holder reported a receipt (late receipt)")
    now = takeover.now_ms
    if now - takeover.claimed_ms > spec.provider_window_s * 1000:
        return Decision("unknown", "not found, but the claim is older than the provider's window")
    settled_at = takeover.reconciling_since_ms + spec.settle_s * 1000
    if now < settled_at:
        return Decision("defer", "not found yet: inside the settle window",
                        delay_s=(settled_at - now) / 1000)  # fmt: skip
    return Decision("failed", "reconciled: not found after the settle window")


def _ask(lookup: Lookup, takeover: Takeover) -> LookupResult:
    """A lookup that reads the whole effect gets it (a provider adapter scans by recipient
    and time, or by an object id recorded so far); a key-only lookup gets the key."""
    if not isinstance(lookup, EffectLookup):
        return lookup.lookup(takeover.idempotency_key, takeover.token)
    request = takeover.request or {}
    args = request.get("args")
    return lookup.lookup_effect(
        LookupContext(
            key=takeover.key,
            idempotency_key=takeover.idempotency_key,
            token=takeover.token,
            tool=takeover.tool,
            generation=takeover.generation,
            claimed_ms=takeover.claimed_ms,
            now_ms=takeover.now_ms,
            scope=request.get("scope"),
            action=request.get("action"),
            args=args if isinstance(args, dict) else {},
            late_receipts=tuple(takeover.late_receipts),
        )
    )


class Reconciler:
    """Resolves expired claims of the tools in ``specs`` (name → ToolSpec)."""

    def __init__(
        self,
        ledger: Ledger,
        specs: Mapping[str, ToolSpec],
        *,
        lease_s: float = 30.0,
        budget: int = 5,
        backoff_s: float = 1.0,
        batch: int = 100,
        holder: str | None = None,
        observer: Observer | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.ledger = ledger
        self.observer: Observer = observer or _Silent()
        self.tracer: Tracer = tracer or _Untraced()
        self.specs = dict(specs)
        self.lease_s = lease_s
        self.budget = budget
        self.backoff_s = backoff_s
        self.batch = batch
        self.holder = (
            holder or f"reconciler@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )
        tools = hashlib.sha256("\n".join(sorted(self.specs)).encode()).hexdigest()[:12]
        self.group = f"{GROUP}:{tools}"
        # One limit per lookup object (by identity: tools sharing it share the provider).
        self._slots: dict[int, threading.BoundedSemaphore] = {}
        for spec in self.specs.values():
            if spec.lookup is not None and id(spec.lookup) not in self._slots:
                self._slots[id(spec.lookup)] = threading.BoundedSemaphore(
                    lookup_concurrency(spec.lookup)
                )
        self._threads = min(
            sum(lookup_concurrency(s.lookup) for s in self.specs.values() if s.lookup) or 1,
            _MAX_THREADS,
        )
        # Kept across passes: a lookup's per-thread HTTP client is reused, not rebuilt.
        self._pool: ThreadPoolExecutor | None = None

    def reconcile(self, key: str, *, tool: str | None = None) -> str | None:
        """Take ``key`` over if its lease has expired and resolve it; the outcome or None.
        A claim of a tool not declared here is left alone: "unowned". ``tool``: the
        record's tool when the caller already read it."""
        if tool is None:
            record = self.ledger.get(key)
            if record is None:
                return None
            tool = record.tool
        if tool not in self.specs:
            return "unowned"
        owner = self.specs[tool].lookup
        # Taken over only once the provider has a slot: a claim queued behind the limit
        # holds no lease meanwhile.
        with self._slots[id(owner)] if owner is not None else nullcontext():
            takeover = self.ledger.takeover(key, lease_s=self.lease_s, holder=self.holder)
            if takeover is None:
                return None
            spec = self.specs.get(takeover.tool)
            result = self._look_up(spec, takeover) if spec is not None else None
        decision = decide(takeover, spec, result, budget=self.budget, backoff_s=self.backoff_s)
        retention = spec.retention_s if spec is not None else DEFAULT_RETENTION_S
        if decision.action == "done":
            assert decision.receipt is not None
            try:
                write = self.ledger.commit(
                    key, takeover.token, decision.receipt, raw=decision.raw,
                    retention_s=retention, note=decision.reason,
                )  # fmt: skip
            except RecordTooLargeError as exc:
                # Found, but the receipt cannot be stored whole: an operator resolves it.
                decision = Decision("unknown", f"found, but {exc.message}")
                write = self.ledger.mark_unknown(key, takeover.token, reason=decision.reason)
        elif decision.action == "failed":
            write = self.ledger.fail(
                key, takeover.token, reason=decision.reason, retention_s=retention
            )
        elif decision.action == "defer":
            write = self.ledger.heartbeat(key, takeover.token, lease_s=max(decision.delay_s, 0.05))
        else:
            write = self.ledger.mark_unknown(key, takeover.token, reason=decision.reason)
        self.observer.resolved(takeover.tool, decision.action, write.fenced)
        if write.fenced:
            return "fenced"
        log.info(
            "%s %s: %s", decision.action, key[:12], decision.reason,
            extra={"tool": takeover.tool, "key": key[:12], "token": takeover.token},
        )  # fmt: skip
        return decision.action

    def _look_up(self, spec: ToolSpec, takeover: Takeover) -> LookupResult | None:
        if spec.lookup is None:
            return None
        key = takeover.key
        failpoint("before_lookup")
        try:
            with self.tracer.span("lookup", tool=takeover.tool, key=key, token=takeover.token):
                result = _ask(spec.lookup, takeover)
        except Exception as exc:
            # A tool's own lookup code is outside effectq: a bug there is an unanswered
            # question (retried within the budget, then UNKNOWN), never a dead reconciler.
            # Its text and traceback may carry arguments: at DEBUG only.
            log.error("lookup for %s raised %s", key[:12], type(exc).__name__)
            log.debug("lookup for %s raised", key[:12], exc_info=True)
            result = Unavailable(f"lookup raised {type(exc).__name__}")
        failpoint("after_lookup")
        return result

    def _reconcile_one(self, key: str, tool: str) -> str | None:
        try:
            return self.reconcile(key, tool=tool)
        except EffectqError as exc:
            log.warning("reconcile %s failed: %s", key[:12], exc)
            return "error"

    def close(self) -> None:
        """Stop the lookup threads (``run`` does it when it stops)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def owned_buckets(self, members: list[str]) -> list[int]:
        """The buckets this reconciler scans: rendezvous hashing over the live members, so
        several reconcilers divide the buckets without a leader, and a silent member's
        buckets pass to the others at their next pass."""
        if self.holder not in members:
            members = [*members, self.holder]

        def weight(member: str, bucket: int) -> bytes:
            return hashlib.sha256(f"{member}/{bucket}".encode()).digest()

        return [
            bucket
            for bucket in range(self.ledger.buckets)
            if max(members, key=lambda m: weight(m, bucket)) == self.holder
        ]

    def run_once(self, buckets: list[int] | None = None) -> Counter[str]:
        """One pass over ``buckets`` (default: all); returns the outcomes counted."""
        outcomes: Counter[str] = Counter()
        unowned: Counter[str] = Counter()
        keys = self.ledger.expired(buckets, limit=self.batch)
        records = self.ledger.get_many(keys) if keys else {}
        mine: list[tuple[str, str]] = []
        for key, record in records.items():
            if record is None:
                continue
            if record.tool not in self.specs:
                unowned[record.tool] += 1
                continue
            mine.append((key, record.tool))
        if len(mine) > 1 and self._threads > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="lookup")
            pool = self._pool
            futures: list[Future[str | None]] = [
                pool.submit(self._reconcile_one, key, tool) for key, tool in mine
            ]
            wait(futures)  # every claim of the pass decided before any error leaves
            results = [f.result() for f in futures]
        else:
            results = [self._reconcile_one(key, tool) for key, tool in mine]
        for outcome in results:
            if outcome:
                outcomes[outcome] += 1
        if unowned:
            outcomes["unowned"] = unowned.total()
            log.info("left %s expired claims of tools not declared here", dict(unowned))
        self.observer.unowned(unowned)
        self.observer.pass_finished()
        return outcomes

    def run(self, *, interval_s: float = 1.0, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        ttl_s = max(5.0, 5 * interval_s)
        while not stop.is_set():
            try:
                members = self.ledger.members(self.group, self.holder, ttl_s=ttl_s)
                self.run_once(self.owned_buckets(members))
            except EffectqError as exc:
                log.warning("reconciler pass failed: %s", exc)
            self.observer.pass_attempted()
            stop.wait(interval_s)
        self.close()
        with contextlib.suppress(EffectqError):
            self.ledger.leave(self.group, self.holder)
