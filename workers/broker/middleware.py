"""Dramatiq middleware for what the actor itself cannot see: a worker process's boot and
shutdown signals, and why a message was dead-lettered (Dramatiq itself moves messages for
unknown actors and failed messages to its DLQ)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, ClassVar, cast

import dramatiq
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import MiddlewareError

from dedupe import (
    ConflictError,
    EffectqError,
    Ledger,
    LedgerError,
    MessageError,
    RejectedError,
    StaleMessageError,
)

from .. import metrics
from .dead_letters import DeadLetterSink
from .gate import DEFERRALS, LIMITS_OPTION, Deferred, Gate

__all__ = ["EffectMiddleware", "LedgerRefused", "dead_letter_kind"]

log = logging.getLogger(__name__)

# Dramatiq's worker process treats a second SIGTERM (or SIGHUP) as "exit now", abandoning
# the effects it is running. A signal to a whole process group or cgroup (systemd's
# KillMode=control-group, a terminal's Ctrl-C, `kill -TERM -PGID`) reaches that process
# directly *and* through its parents (`effectq worker`, the `dramatiq` main process), so
# one shutdown arrives two or three times: only the first counts.
_SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class LedgerRefused(MiddlewareError, LedgerError):
    """Raised at worker boot: Dramatiq re-raises MiddlewareErrors, so the process stops."""

    def __init__(self, reason: str) -> None:
        MiddlewareError.__init__(self, reason)
        self.message = reason
        self.details = {}


def _drain_once() -> None:
    """Make this process's shutdown signal handlers act on the first signal only."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers belong to the main thread (a Worker run in-process)
    first = threading.Event()
    for signum in _SHUTDOWN_SIGNALS:
        handler = signal.getsignal(signum)
        if not callable(handler):
            continue

        def once(number: int, frame: FrameType | None, handler: Any = handler) -> None:
            if first.is_set():
                log.info("shutdown already draining: %s ignored", signal.Signals(number).name)
                return
            first.set()
            handler(number, frame)

        signal.signal(signum, once)


class EffectMiddleware(dramatiq.Middleware):
    """Refuses to consume on a ledger it cannot reach or trust; drains on the first shutdown
    signal, however often it arrives; records why each dead-lettered message died, and
    frees its pending marker.

    It is handed what it calls — a way to reach the ledger and a dead-letter sink — not the
    runtime that owns them, so it sits below the runtime."""

    #: Set on an actor whose redelivered message is a duplicate to its claim (every effect
    #: tool's): a broker may then ack its messages in batches (``broker.redis``).
    #: ``effectq_limits``: a tool's declared rate and concurrency limits (``gate.Limits``).
    actor_options: ClassVar[set[str]] = {"redelivery_is_duplicate", LIMITS_OPTION}

    def __init__(self, *, ledger: Callable[[], object], dead_letter: DeadLetterSink) -> None:
        self.ledger = ledger
        self.dead_letter = dead_letter
        # Through self.ledger: the runtime re-points it when it adopts this middleware.
        self.gate = Gate(lambda: cast(Ledger, self.ledger()))

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        # Dramatiq's CLI installed its handlers before importing the broker module.
        _drain_once()

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        try:
            # Connecting checks persistence: a ledger without AOF would grant claims twice.
            self.ledger()
        except Exception as exc:
            # Unreachable, refusing, untrustworthy: a worker that consumed now would only
            # fail its messages. The process exits before it consumes anything, and its
            # supervisor (`effectq worker`, or the platform) restarts it with backoff.
            reason = exc.message if isinstance(exc, EffectqError) else type(exc).__name__
            log.critical("refusing to start: %s", reason)
            raise LedgerRefused(reason) from None

    def before_process_message(
        self, broker: dramatiq.Broker, message: dramatiq.MessageProxy
    ) -> None:
        # A paused or limited message raises Deferred here: no claim, no tool body.
        self.gate.admit(broker, message)

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.MessageProxy,
        *,
        result: object = None,
        exception: BaseException | None = None,
    ) -> None:
        self.gate.release(message)
        if isinstance(exception, Deferred):
            # Dramatiq's Retries, which runs after this (after_* hooks run in reverse order
            # of the middleware list), counts every exception as an attempt; a message held
            # back made none: give back the retry it is about to count.
            message.options["retries"] = int(message.options.get("retries", 0)) - 1
            message.options[DEFERRALS] = int(message.options.get(DEFERRALS, 0)) + 1
            metrics.deferred(message.actor_name, exception.cause)

    def after_skip_message(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        self.gate.release(message)

    def after_nack(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        exc: BaseException | None = getattr(message, "_exception", None)
        if isinstance(exc, ActorNotFound):
            reason = f"unknown tool {message.actor_name!r}"
        elif exc is not None:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            reason = "rejected"
        key = getattr(exc, "key", None)
        self.dead_letter(
            message_id=message.message_id,
            tool=message.actor_name,
            key=key if isinstance(key, str) else None,
            reason=reason,
            kind=dead_letter_kind(exc),
        )
        log.warning("dead-lettered %s (%s): %s", message.message_id, message.actor_name, reason)


def dead_letter_kind(exc: BaseException | None) -> str:
    """The bounded reason label of a dead letter (``metrics.DEAD_LETTER_REASONS``)."""
    if isinstance(exc, ActorNotFound):
        return "unknown_tool"
    if isinstance(exc, ConflictError):
        return "conflict"
    if isinstance(exc, StaleMessageError):
        return "stale"
    if isinstance(exc, MessageError):
        return "invalid_message"
    if isinstance(exc, RejectedError):
        return "rejected"
    if exc is not None:
        # Dramatiq dead-letters anything else only once its retries are spent.
        return "retries_exhausted"
    return "other"
