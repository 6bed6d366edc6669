"""``@effect_tool``: a side-effecting function as a Dramatiq actor behind the claim ledger.

The worker path (DESIGN §3), all inside the actor so that any error — a Redis timeout in
the claim included — means the tool body does not run (Dramatiq swallows exceptions raised
in middleware ``before_process_message`` and runs the actor anyway; this path never relies
on middleware to stop an execution):

    validate the envelope → recompute the key → claim
      acquired    → run (heartbeat) → commit | fail (not executed) | hand over (uncertain)
      duplicate   → return: the message is acked, the stored receipt is the result
      conflict    → ConflictError: dead-lettered, never executed
      stale       → StaleMessageError: older than the provider's window by the ledger's
                    clock at submit (where a claim would be granted): dead-lettered
      in_flight / blocked → RetryLater: the message stays alive, backing off towards the
                    lease deadline the ledger reports, until the ledger says DONE or FAILED
                    (bounded by the provider's window)

Only bad input is dead-lettered. A ledger that cannot answer — down, refusing writes (OOM,
MISCONF…), not even constructible in this process — leaves the message alive (RetryLater)
and executes nothing.

Beside it: ``envelope`` (what a message carries), ``call`` (what a body is given and may
answer), ``retry`` (how a message is left alive, and for how long).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import dramatiq
from dramatiq.middleware import CurrentMessage
from pydantic import ValidationError

from dedupe import (
    ClaimOutcome,
    ConflictError,
    Effect,
    EffectqError,
    IdentityError,
    Ledger,
    LedgerError,
    MessageError,
    NotExecutedError,
    RecordTooLargeError,
    RejectedError,
    StaleMessageError,
    ToolSpec,
    derive,
)
from dedupe.failpoints import failpoint
from dedupe.spec import DAY, DEFAULT_RETENTION_S, Lookup

from .. import logs, metrics, registry, tracing
from ..broker.gate import LIMITS_OPTION, Limits
from ..broker.redis import EffectqRedisBroker
from ..leases import Held, LeaseKeeper
from ..runtime import Runtime, after_install, current, installed
from .call import EffectCall, ToolResult
from .envelope import Envelope, submitted_ms
from .retry import RetryLater, retry_delay_ms, retry_when

__all__ = [
    "EffectCall",
    "EffectTool",
    "Envelope",
    "RetryLater",
    "ToolResult",
    "effect_tool",
    "get_tool",
]

log = logging.getLogger(__name__)
_HOST = socket.gethostname()


ToolFn = Callable[..., Mapping[str, Any] | ToolResult]
_DEAD_LETTER = (MessageError, ConflictError, RejectedError)


class EffectTool:
    """A declared tool: its spec (plain data, read by the reconciler too) and, once bound
    to a runtime, its actor on that runtime's broker."""

    def __init__(
        self,
        fn: ToolFn,
        spec: ToolSpec,
        *,
        not_executed: tuple[type[BaseException], ...],
        queue_name: str | None,
        actor_options: Mapping[str, Any],
    ) -> None:
        self.fn = fn
        self.spec = spec
        self.not_executed: tuple[type[BaseException], ...] = (NotExecutedError, *not_executed)
        self._queue_name = queue_name
        self._actor_options = dict(actor_options)
        self._actor: dramatiq.Actor[..., None] | None = None
        self._runtime: Runtime | None = None
        self._keepers: dict[int, LeaseKeeper] = {}
        self._metrics = metrics.for_tool(spec.name)

    def bind(self, rt: Runtime) -> dramatiq.Actor[..., None]:
        """Declare this tool's actor on ``rt``'s broker (moving it there if it was bound
        elsewhere): its messages are then sent and consumed through that runtime."""
        cfg = rt.settings
        options = {
            "retry_when": retry_when(cfg.max_retries),
            "min_backoff": cfg.retry_min_backoff_ms,
            "max_backoff": cfg.retry_max_backoff_ms,
            # Its redelivered message is a duplicate to the claim: its ack may join a batch.
            "redelivery_is_duplicate": True,
        }
        actor = self._actor
        if actor is None:
            actor = dramatiq.actor(  # type: ignore[call-overload]
                self._perform,
                actor_name=self.spec.name,
                queue_name=self._queue_name or cfg.queue,
                broker=rt.broker,
                throws=_DEAD_LETTER,
                **options,
                **self._actor_options,
            )
        else:
            actor.options.update(options)
            actor.broker = rt.broker
            rt.broker.declare_actor(actor)
        self._actor, self._runtime = actor, rt
        self._keepers.clear()
        self._metrics = metrics.for_tool(self.spec.name)
        return actor

    @property
    def actor(self) -> dramatiq.Actor[..., None]:
        """The actor, bound to the current runtime if this tool was not bound yet."""
        return self._actor if self._actor is not None else self.bind(current())

    @property
    def runtime(self) -> Runtime:
        """The runtime this tool is bound to (the current one if it was not bound yet)."""
        if self._runtime is None:
            self.bind(current())
        assert self._runtime is not None
        return self._runtime

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def marker_ttl_s(self) -> float:
        """How long a confirmed pending marker of this tool's messages answers "pending":
        ``pending_ttl_s`` where the broker can be asked whether it still holds the message
        (Redis: the producer asks), else the short ``unverifiable_pending_ttl_s``, which a
        worker retrying the message renews (``_renew_marker``)."""
        cfg = self.runtime.settings
        if isinstance(self.runtime.broker, EffectqRedisBroker):
            return cfg.pending_ttl_s
        return min(cfg.pending_ttl_s, cfg.unverifiable_pending_ttl_s)

    @property
    def queue_name(self) -> str | None:
        """Its actor's queue once bound, else None (reading it binds nothing)."""
        return self._actor.queue_name if self._actor is not None else None

    def derive(self, scope: str, args: Mapping[str, Any], action: str | None = None) -> Effect:
        return derive(self.spec, scope, args, action=action)

    def __call__(self, call: EffectCall, **args: Any) -> Mapping[str, Any] | ToolResult:
        """Run the body directly (tests, a guarded caller that already holds the claim)."""
        return self.fn(call, **args)

    # -- the worker path --------------------------------------------------------------

    def _keeper(self) -> LeaseKeeper:
        pid = os.getpid()
        keeper = self._keepers.get(pid)
        if keeper is None:
            keeper = self._keepers[pid] = LeaseKeeper(self.runtime.ledger())
        return keeper

    def _effect_of(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Effect, str | None, int]:
        if kwargs or len(args) != 1 or not isinstance(args[0], dict):
            raise MessageError(f"{self.name}: a message carries exactly one envelope object")
        try:
            envelope = Envelope.model_validate(args[0])
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '$'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)[:5]
            )
            raise MessageError(f"{self.name}: invalid envelope: {problems}") from None
        try:
            effect = derive(self.spec, envelope.scope, envelope.args, action=envelope.action)
        except IdentityError as exc:
            raise MessageError(f"invalid arguments: {exc.message}", key=envelope.key) from None
        if effect.key != envelope.key:
            raise MessageError(
                f"{self.name}: message key {envelope.key[:12]}… does not match its arguments "
                f"({effect.key[:12]}…)",
                key=envelope.key,
            )
        return effect, envelope.campaign, envelope.g

    def _perform(self, *args: Any, **kwargs: Any) -> None:
        message = CurrentMessage.get_current_message()
        message_id = message.message_id if message is not None else "direct"
        options = message.options if message is not None else {}
        # Every line logged while this message runs names it (workers.logs); its span
        # continues the producer's trace (workers.tracing: a no-op when tracing is off).
        with (
            logs.effect(tool=self.name, message_id=message_id),
            tracing.process(options, tool=self.name, message_id=message_id),
        ):
            self._run(message, message_id, args, kwargs)

    def _run(
        self,
        message: dramatiq.Message[Any] | None,
        message_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        retries = int(message.options.get("retries", 0)) if message else 0
        effect, campaign, generation = self._effect_of(args, kwargs)
        logs.annotate(key=effect.key)
        submitted = submitted_ms(message, effect.key)
        rt = self.runtime
        ledger = _ledger(rt, effect.key)
        holder = f"{_HOST}:{os.getpid()}/{message_id}"
        started = time.perf_counter()
        try:
            with tracing.span("claim", tool=self.name, key=effect.key) as span:
                claim = ledger.claim(
                    effect, lease_s=self.spec.lease_s, holder=holder, campaign=campaign,
                    generation=generation, submitted_ms=submitted,
                    window_s=self.spec.provider_window_s,
                )  # fmt: skip
                tracing.note(span, "effectq.claim.outcome", claim.outcome.value)
        except RecordTooLargeError as exc:
            raise MessageError(f"{self.name}: {exc.message}", key=effect.key) from None
        except LedgerError as exc:
            metrics.ledger_seconds("claim").observe(time.perf_counter() - started)
            self._metrics.claims["unavailable"].inc()
            raise RetryLater(f"ledger unavailable: {exc.message}", key=effect.key) from None
        metrics.ledger_seconds("claim").observe(time.perf_counter() - started)
        self._metrics.claims[claim.outcome.value].inc()
        if claim.outcome is ClaimOutcome.DUPLICATE:
            return
        if claim.outcome is ClaimOutcome.STALE:
            raise StaleMessageError(
                f"{self.name}: message is {(claim.age_ms or 0) / 1000:.0f}s old by the ledger "
                f"time of its submission, past the provider's "
                f"{self.spec.provider_window_s:.0f}s idempotency window; not executed "
                f"({claim.state.value if claim.state else 'no record'})",
                key=effect.key,
            )
        if claim.outcome is ClaimOutcome.CONFLICT:
            raise ConflictError(
                f"{self.name}: bound fields differ from the recorded effect ({claim.state})",
                key=effect.key,
                state=str(claim.state),
            )
        if not claim.acquired:
            self._renew_marker(effect, message_id)
            raise RetryLater(
                f"effect is {claim.outcome.value} ({claim.state})",
                key=effect.key,
                delay_ms=retry_delay_ms(claim, rt.settings),
            )
        failpoint("after_claim")
        logs.annotate(token=claim.token)
        call = EffectCall(
            tool=self.name,
            key=effect.key,
            idempotency_key=claim.idempotency_key,
            token=claim.token,
            scope=effect.scope,
            action=effect.action,
            generation=claim.generation,
            message_id=message_id,
        )
        with self._hold(effect.key, claim.token) as held:
            failpoint("before_effect")
            started = time.perf_counter()
            try:
                with tracing.span("effect", tool=self.name, key=effect.key, token=claim.token):
                    result = self.fn(call, **effect.args)
            except self.not_executed as exc:
                self._effect_done("failed", started)
                # No heartbeat after the claim is settled: it would be fenced (counted as a
                # stale write) or, after a handover, extend the lease the reconciler awaits.
                held.stop()
                self._record_failure(call, exc)
                if isinstance(exc, RejectedError):
                    raise
                self._renew_marker(effect, message_id)
                raise RetryLater(
                    f"not executed: {exc}",
                    give_up=retries >= rt.settings.max_retries,
                    key=effect.key,
                ) from None
            except BaseException as exc:
                # Timeouts after send, 5xx, TimeLimitExceeded, Shutdown: nobody knows.
                self._effect_done("uncertain", started)
                held.stop()
                self._hand_over(call, exc)
                raise RetryLater(
                    f"outcome uncertain: {type(exc).__name__}", key=effect.key
                ) from None
            self._effect_done("succeeded", started)
            failpoint("after_effect")
            held.stop()  # a heartbeat racing the commit would count as a stale write
            with tracing.span("commit", tool=self.name, key=effect.key, token=claim.token):
                self._commit(call, result)
            log.debug("committed")  # the line names the effect (workers.logs)
        failpoint("after_commit")

    def _renew_marker(self, effect: Effect, message_id: str) -> None:
        """A message that will be delivered again still stands for its effect: on a broker
        that cannot be asked whether it holds a message (RabbitMQ), renew its pending
        marker (only this message's own: a confirm never writes another's). Best effort:
        a marker that lapses lets the next submission send a second message, which the
        claim makes a duplicate."""
        rt = self.runtime
        if isinstance(rt.broker, EffectqRedisBroker):
            return  # the producer asks the broker itself
        try:
            rt.ledger().confirm_pending([(effect, message_id)], self.marker_ttl_s)
        except EffectqError as exc:
            log.debug("pending marker of %s not renewed: %s", effect.key[:12], exc)

    @contextmanager
    def _hold(self, key: str, token: int) -> Iterator[Held]:
        """Heartbeat the lease while the body runs; count it if the heartbeat was fenced."""
        with self._keeper().hold(key, token, self.spec.lease_s) as held:
            try:
                yield held
            finally:
                if held.fenced:
                    self._metrics.fenced["heartbeat"].inc()

    def _effect_done(self, outcome: str, started: float) -> None:
        self._metrics.duration.observe(time.perf_counter() - started)
        self._metrics.effects[outcome].inc()

    def _timed(self, op: str, started: float, fenced: bool) -> None:
        metrics.ledger_seconds(op).observe(time.perf_counter() - started)
        if fenced:
            self._metrics.fenced[op].inc()

    def _record_failure(self, call: EffectCall, exc: BaseException) -> None:
        reason = f"not executed: {type(exc).__name__}: {exc}"
        started = time.perf_counter()
        try:
            write = self.runtime.ledger().fail(
                call.key, call.token, reason=reason, retention_s=self.spec.retention_s
            )
            self._timed("fail", started, write.fenced)
        except EffectqError as err:
            # The claim stays; its lease expires and the reconciler asks the provider.
            log.warning("could not record failure of %s: %s", call.key[:12], err)

    def _hand_over(self, call: EffectCall, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {exc}"[:300]
        started = time.perf_counter()
        try:
            write = self.runtime.ledger().handover(call.key, call.token, reason=reason)
            self._timed("handover", started, write.fenced)
        except EffectqError as err:
            log.warning("could not hand %s over: %s (lease will expire)", call.key[:12], err)

    def _commit(self, call: EffectCall, result: Mapping[str, Any] | ToolResult) -> None:
        receipt, raw = (
            (result.receipt, result.raw) if isinstance(result, ToolResult) else (result, None)
        )
        failpoint("before_commit")
        ledger = self.runtime.ledger()
        deadline = time.monotonic() + self.spec.lease_s / 2
        delay = 0.05
        while True:
            started = time.perf_counter()
            try:
                write = ledger.commit(
                    call.key, call.token, receipt, raw=raw, retention_s=self.spec.retention_s
                )
                self._timed("commit", started, write.fenced)
                break
            except RecordTooLargeError as exc:
                # The effect happened but its receipt cannot be stored (no truncation): the
                # reconciler takes it over and leaves it UNKNOWN for an operator.
                self._hand_over(call, exc)
                raise RetryLater(f"executed, receipt not recordable: {exc}", key=call.key) from None
            except LedgerError as exc:
                # The effect happened; keep trying within the lease, then leave it to the
                # reconciler (the claim stays CLAIMED, its lease expires).
                if time.monotonic() + delay > deadline:
                    raise RetryLater(f"executed but not recorded: {exc}", key=call.key) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        if write.fenced:
            raise RetryLater(
                f"commit fenced: claim taken over (now {write.state})",
                key=call.key,
            )


def _ledger(rt: Runtime, key: str) -> Ledger:
    """This process's ledger; any failure to build it (unreachable, refused as volatile, a
    bad URL) leaves the message alive: it is not the message's fault."""
    try:
        return rt.ledger()
    except EffectqError as exc:
        raise RetryLater(f"ledger unavailable: {exc.message}", key=key) from None
    except Exception as exc:
        raise RetryLater(f"ledger unavailable: {type(exc).__name__}", key=key) from None


def effect_tool(
    *,
    identity: tuple[str, ...],
    bound: tuple[str, ...] = (),
    free: tuple[str, ...] = (),
    name: str | None = None,
    action: str = "default",
    actions: tuple[str, ...] = (),
    normalizers: Mapping[str, Any] | None = None,
    lease_s: float = 30.0,
    provider_window_s: float = DAY,
    retention_s: float = DEFAULT_RETENTION_S,
    settle_s: float = 5.0,
    provider_idempotency: bool = False,
    lookup: Lookup | None = None,
    not_executed: tuple[type[BaseException], ...] = (),
    queue_name: str | None = None,
    rate: str | None = None,
    concurrency: int | None = None,
    **actor_options: Any,
) -> Callable[[ToolFn], EffectTool]:
    """Declare a side-effecting tool. The body is called as ``fn(call, **args)`` with the
    arguments as submitted (NFC, trimmed; normalizers shape only the key, see
    ``dedupe.normalize``) and returns the receipt (a dict) or a ``ToolResult``.

    ``rate`` ("100/s", "600/m") and ``concurrency`` (1 to 32): the provider's documented
    limits, held across every process on the ledger (``workers.broker.gate``)."""
    limits = Limits.declare(rate, concurrency)
    if limits is not None:
        actor_options = {**actor_options, LIMITS_OPTION: limits}

    def wrap(f: ToolFn) -> EffectTool:
        spec = ToolSpec(
            name=name or f.__name__,
            identity=identity,
            bound=bound,
            free=free,
            action=action,
            actions=actions,
            normalizers=dict(normalizers or {}),
            lease_s=lease_s,
            provider_window_s=provider_window_s,
            retention_s=max(retention_s, provider_window_s),
            settle_s=settle_s,
            lookup=lookup,
            provider_idempotency=provider_idempotency,
        )
        tool = EffectTool(
            f,
            spec,
            not_executed=not_executed,
            queue_name=queue_name,
            actor_options=actor_options,
        )
        registry.register(tool)
        # Declared after a runtime was installed (a worker process loads EFFECTQ_TOOLS
        # after installing its runtime): its actor must exist before Dramatiq consumes.
        present = installed()
        if present is not None:
            tool.bind(present)
        return tool

    return wrap


def get_tool(name: str) -> EffectTool:
    """The declared tool ``name`` (a ``MessageError`` naming the declared ones if none)."""
    # Only effect_tool registers, so every registered tool is an EffectTool.
    return cast(EffectTool, registry.get_tool(name))


def _bind_declared(rt: Runtime) -> None:
    for tool in registry.tools():
        cast(EffectTool, tool).bind(rt)


# A runtime installed later (the demo, tests) takes every tool declared before it.
after_install(_bind_declared)
