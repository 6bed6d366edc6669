"""Dramatiq middleware for what the actor itself cannot see: why a message was dead-lettered
(Dramatiq itself moves messages for unknown actors and failed messages to its DLQ)."""

from __future__ import annotations

import logging

import dramatiq
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import MiddlewareError

from dedupe import EffectqError, LedgerAuthError, VolatileLedgerError

__all__ = ["EffectMiddleware"]

log = logging.getLogger(__name__)


class LedgerRefused(MiddlewareError):
    """Raised at worker boot: Dramatiq re-raises MiddlewareErrors, so the process stops."""


class EffectMiddleware(dramatiq.Middleware):
    """Refuses to boot a worker on a ledger it cannot trust; records why each
    dead-lettered message died, and frees its pending marker."""

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        from . import runtime

        try:
            # Connecting checks persistence: a ledger without AOF would grant claims twice.
            runtime.ledger()
        except (VolatileLedgerError, LedgerAuthError) as exc:
            log.critical("refusing to start: %s", exc.message)
            raise LedgerRefused(exc.message) from None

    def after_nack(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        from . import runtime

        exc: BaseException | None = getattr(message, "_exception", None)
        if isinstance(exc, ActorNotFound):
            reason = f"unknown tool {message.actor_name!r}"
        elif exc is not None:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            reason = "rejected"
        key = getattr(exc, "key", None)
        try:
            runtime.ledger().dead_letter(
                message_id=message.message_id,
                tool=message.actor_name,
                key=key if isinstance(key, str) else None,
                reason=reason,
            )
        except EffectqError as err:
            log.error("dead-letter of %s not recorded: %s", message.message_id, err)
        log.warning("dead-lettered %s (%s): %s", message.message_id, message.actor_name, reason)
