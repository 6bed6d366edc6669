"""Per-process singletons: the Dramatiq broker and the ledger, built from settings.

Dramatiq forks worker processes and each runs several threads: the broker is built once at
import (actors bind to it when declared), the ledger lazily per process (a redis-py pool is
thread-safe and resets itself after fork).
"""

from __future__ import annotations

import logging
import os
import threading

import dramatiq
from dramatiq.middleware import CurrentMessage

from dedupe import Ledger

from .broker import build_broker
from .middleware import EffectMiddleware
from .settings import ledger_from_settings, settings

__all__ = ["broker", "configure_broker", "ledger", "rebind", "set_ledger"]

_lock = threading.Lock()
_ledger: tuple[int, Ledger] | None = None
_broker: dramatiq.Broker | None = None


class _RedactMessages(logging.Filter):
    """Dramatiq logs a whole message (arguments: recipients, keys) when an actor raises;
    keep only the actor and the message id in effectq's processes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                f"{a.actor_name}[{a.message_id}]"
                if isinstance(a, dramatiq.Message | dramatiq.MessageProxy)
                else a
                for a in record.args
            )
        return True


def configure_broker(new: dramatiq.Broker) -> dramatiq.Broker:
    """Install effectq's middleware on ``new`` and make it the global broker."""
    global _broker
    for name in ("dramatiq.worker.WorkerThread", "dramatiq.worker.Worker"):
        target = logging.getLogger(name)
        if not any(isinstance(f, _RedactMessages) for f in target.filters):
            target.addFilter(_RedactMessages())
    present = {type(m) for m in new.middleware}
    for middleware in (CurrentMessage(), EffectMiddleware()):
        if type(middleware) not in present:
            new.add_middleware(middleware)
    dramatiq.set_broker(new)
    _broker = new
    return new


def broker() -> dramatiq.Broker:
    """The global broker, built from settings on first use unless one was configured."""
    with _lock:
        return _broker if _broker is not None else configure_broker(build_broker(settings()))


def rebind() -> dramatiq.Broker:
    """Rebuild the broker and the ledger from the current settings and move every declared
    actor onto the new broker (a process re-pointed at another deployment: tests, demo)."""
    global _broker, _ledger
    from .tool import TOOLS

    with _lock:
        _broker, _ledger = None, None
    new = broker()
    for tool in TOOLS.values():
        tool.actor.broker = new
        new.declare_actor(tool.actor)
    return new


def ledger() -> Ledger:
    """This process's ledger (rebuilt in a forked child)."""
    global _ledger
    pid = os.getpid()
    current = _ledger
    if current is None or current[0] != pid:
        with _lock:
            current = _ledger
            if current is None or current[0] != pid:
                current = (pid, ledger_from_settings())
                _ledger = current
    return current[1]


def set_ledger(new: Ledger) -> None:
    """Use ``new`` in this process (tests, embedding)."""
    global _ledger
    _ledger = (os.getpid(), new)
