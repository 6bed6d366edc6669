"""A process's wiring: its settings, its Dramatiq broker and its ledger, in one object.

A ``Runtime`` is built explicitly (``Runtime.from_settings(Settings())``, or from a broker
and a ledger someone already has) and handed to what uses it. Declaring a tool builds
nothing: the tool is bound to a runtime, which declares its actor on that runtime's broker.
A process has at most one *installed* runtime (``install``): Dramatiq's worker CLI and the
producer functions (``submit``, ``submit_campaign``) need a broker the caller does not pass,
and ``current()`` is the one factory that answers — the installed runtime, else one built
once from the environment and installed.

Dramatiq forks worker processes and each runs several threads: the broker is shared, the
ledger is built lazily per process (a redis-py pool is thread-safe and resets itself after
fork).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import dramatiq
from dramatiq.middleware import CurrentMessage

from dedupe import EffectqError, Ledger, failpoints

from . import logs, metrics
from .broker import build_broker
from .broker.middleware import EffectMiddleware
from .settings import Settings, ledger_from_settings

__all__ = [
    "Runtime",
    "after_install",
    "broker",
    "configure_process",
    "current",
    "install",
    "installed",
    "ledger",
    "rebind",
    "set_ledger",
]

log = logging.getLogger("effectq.runtime")


class _RedactMessages(logging.Filter):
    """Dramatiq logs a whole message (arguments: recipients, keys) when an actor raises;
    keep only the actor and the message id in effectq's processes, and give the line the
    message's effect fields (workers.logs: tool, key prefix, message id)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            args: list[object] = []
            for a in record.args:
                if isinstance(a, dramatiq.Message | dramatiq.MessageProxy):
                    args.append(f"{a.actor_name}[{a.message_id}]")
                    envelope = a.args[0] if a.args else None
                    key = envelope.get("key") if isinstance(envelope, dict) else None
                    fields = {
                        "tool": a.actor_name,
                        "message_id": a.message_id,
                        "key": logs.key_prefix(key) if isinstance(key, str) else None,
                    }
                    for name, value in fields.items():
                        if value is not None and not hasattr(record, name):
                            setattr(record, name, value)
                else:
                    args.append(a)
            record.args = tuple(args)
        return True


def _redact_dramatiq_logs() -> None:
    for name in ("dramatiq.worker.WorkerThread", "dramatiq.worker.Worker"):
        target = logging.getLogger(name)
        if not any(isinstance(f, _RedactMessages) for f in target.filters):
            target.addFilter(_RedactMessages())


class Runtime:
    """The settings, broker and ledger one process works with."""

    def __init__(
        self,
        settings: Settings,
        broker: dramatiq.Broker | None = None,
        ledger: Ledger | Callable[[], Ledger] | None = None,
    ) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._ledger: tuple[int, Ledger] | None = None
        self._make_ledger: Callable[[], Ledger]
        if isinstance(ledger, Ledger):
            self._ledger = (os.getpid(), ledger)
            self._make_ledger = lambda: ledger
        else:
            self._make_ledger = ledger or (lambda: ledger_from_settings(settings))
        self._broker: dramatiq.Broker | None = None
        if broker is not None:
            self._adopt(broker)

    def _adopt(self, broker: dramatiq.Broker) -> dramatiq.Broker:
        """Use ``broker``, with effectq's middleware on it reporting to this runtime's ledger
        and dead-letter stream."""
        ours = [m for m in broker.middleware if isinstance(m, EffectMiddleware)]
        for middleware in ours:
            middleware.ledger, middleware.dead_letter = self.ledger, self.record_dead_letter
        if not ours:
            broker.add_middleware(
                EffectMiddleware(ledger=self.ledger, dead_letter=self.record_dead_letter)
            )
        if not any(isinstance(m, CurrentMessage) for m in broker.middleware):
            broker.add_middleware(CurrentMessage())
        self._broker = broker
        return broker

    @property
    def broker(self) -> dramatiq.Broker:
        """The broker, built from the settings on first use (a reconciler never needs one)."""
        found = self._broker
        if found is None:
            with self._lock:
                found = self._broker or self._adopt(
                    build_broker(self.settings, dead_letter=self.record_dead_letter)
                )
        return found

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Runtime:
        """A runtime on ``settings`` (default: the environment, ``EFFECTQ_*``)."""
        return cls(settings if settings is not None else Settings())

    def ledger(self) -> Ledger:
        """This process's ledger (rebuilt in a forked child)."""
        pid = os.getpid()
        current = self._ledger
        if current is None or current[0] != pid:
            with self._lock:
                current = self._ledger
                if current is None or current[0] != pid:
                    current = (pid, self._make_ledger())
                    self._ledger = current
        return current[1]

    def set_ledger(self, new: Ledger) -> None:
        """Use ``new`` in this process (tests, embedding)."""
        self._ledger = (os.getpid(), new)

    def record_dead_letter(
        self, *, message_id: str, tool: str, key: str | None, reason: str, kind: str
    ) -> None:
        """Write why a message died to the ledger's dead-letter stream; never raises (the
        broker's dead-letter queue holds the message either way). ``kind`` is the bounded
        reason label of ``effectq_dead_letters_total``."""
        metrics.dead_letter(tool, kind)
        try:
            self.ledger().dead_letter(message_id=message_id, tool=tool, key=key, reason=reason)
        except Exception as err:
            metrics.dead_letter_unrecorded()
            detail = err.message if isinstance(err, EffectqError) else type(err).__name__
            log.error("dead-letter of %s not recorded: %s", message_id, detail)


_lock = threading.Lock()
_installed: Runtime | None = None
#: What ``install`` does next with the runtime it installed: the tool module binds every
#: declared tool to it (this module knows no tool).
_then: list[Callable[[Runtime], None]] = []


def configure_process(settings: Settings) -> None:
    """What every effectq process takes from its settings besides a broker and a ledger:
    its failpoints (armed only here, from EFFECTQ_FAILPOINTS), whether it counts metrics,
    and Dramatiq's message logs redacted."""
    failpoints.arm(settings.failpoints)
    metrics.configure(enabled=settings.metrics_enabled)
    _redact_dramatiq_logs()


def install(runtime: Runtime) -> Runtime:
    """Make ``runtime`` this process's runtime: Dramatiq's global broker, the failpoints of
    its settings armed, every declared tool bound to it (a process re-pointed at another
    deployment: the demo, tests) through the steps given to ``after_install``."""
    global _installed
    with _lock:
        configure_process(runtime.settings)
        # Re-adopting re-points effectq's middleware at this runtime (a broker shared with
        # an earlier runtime of this process).
        dramatiq.set_broker(runtime._adopt(runtime.broker))
        _installed = runtime
    for step in list(_then):
        step(runtime)
    return runtime


def after_install(step: Callable[[Runtime], None]) -> None:
    """Have ``install`` call ``step`` with each runtime it installs from now on."""
    _then.append(step)


def installed() -> Runtime | None:
    """The runtime ``install()``ed in this process, if any (building none)."""
    return _installed


def current() -> Runtime:
    """The installed runtime; the first call in a process that installed none builds one
    from the environment and installs it."""
    found = _installed
    return found if found is not None else install(Runtime.from_settings())


# The module-level verbs below act on the current runtime: the producer side of tests and
# embedding code spells them this way.


def broker() -> dramatiq.Broker:
    return current().broker


def ledger() -> Ledger:
    return current().ledger()


def set_ledger(new: Ledger) -> None:
    current().set_ledger(new)


def rebind() -> dramatiq.Broker:
    """Install a runtime built afresh from the environment."""
    return install(Runtime.from_settings()).broker
