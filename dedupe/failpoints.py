"""Named crash points in the worker and producer paths, armed only through ``EFFECTQ_FAILPOINTS``
(read by the process's settings, which ``arm`` this module; nothing here reads the
environment).

``after_claim=kill;after_effect=kill@0.2;before_commit=sleep:3``. Actions: ``kill`` (SIGKILL
self), ``stop`` (SIGSTOP self), ``raise`` (FailpointError), ``sleep:SECONDS``; ``@P`` arms
with probability P. Unarmed, a failpoint is one lookup in an empty dict.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass

__all__ = ["POINTS", "FailpointError", "arm", "failpoint", "parse"]

POINTS = frozenset(
    {
        "after_claim",
        "before_effect",
        "after_effect",
        "before_commit",
        "after_commit",
        # A batch of effect tools' acks about to be written (workers.broker.redis).
        "before_ack",
        "before_lookup",
        "after_lookup",
        # The producer path: a pending marker written, its message not yet enqueued.
        "after_submit_mark",
    }
)


class FailpointError(RuntimeError):
    """Raised by a ``raise`` failpoint: an uncertain outcome at that exact point (no
    EffectqError, so that no handler of effectq's takes it for an expected failure)."""


@dataclass(frozen=True)
class _Armed:
    action: str
    argument: float
    probability: float


def parse(spec: str) -> dict[str, _Armed]:
    armed: dict[str, _Armed] = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        name, eq, rest = item.partition("=")
        if not eq or name not in POINTS:
            raise ValueError(f"bad failpoint {item!r}: known points are {sorted(POINTS)}")
        action, _, prob = rest.partition("@")
        verb, _, arg = action.partition(":")
        if verb not in {"kill", "stop", "raise", "sleep"} or (verb == "sleep") != bool(arg):
            raise ValueError(f"bad failpoint action {action!r} (kill|stop|raise|sleep:SECONDS)")
        armed[name] = _Armed(verb, float(arg or 0), float(prob or 1))
    return armed


_ARMED: dict[str, _Armed] = {}


def arm(spec: str) -> None:
    """Arm exactly the failpoints of ``spec`` (``EFFECTQ_FAILPOINTS``; "" disarms all)."""
    _ARMED.clear()
    _ARMED.update(parse(spec))


def failpoint(name: str) -> None:
    armed = _ARMED.get(name)
    if armed is None or (armed.probability < 1 and random.random() >= armed.probability):
        return
    # Thread-directed: a process-directed signal may be taken by another thread while this
    # one runs on past the failpoint (a "stopped" holder would commit first).
    if armed.action == "kill":
        signal.pthread_kill(threading.get_ident(), signal.SIGKILL)
    elif armed.action == "stop":
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    elif armed.action == "sleep":
        time.sleep(armed.argument)
    else:
        raise FailpointError(f"failpoint {name}")
