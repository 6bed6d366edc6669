"""The on-call's controls on the worker path: a paused tool or queue, and a tool's declared
rate and concurrency limits (``@effect_tool(rate="100/s", concurrency=4)``).

Each is decided before the actor runs (``EffectMiddleware.before_process_message``), so a
message held back takes no claim and runs no tool body. It *waits*: ``Deferred`` goes
through Dramatiq's Retries middleware like any retry — the message is written to the delay
queue before the delivery is acked, so a worker that dies in between leaves a duplicate
(the claim makes it one), never a loss — but it is no attempt: ``EffectMiddleware`` gives
back the retry Retries counts, and the tool's ``retry_when`` never gives up on it. Nothing
is dead-lettered for waiting.

Pause state lives in the ledger's Redis, one hash per namespace (``<ns>:paused``: field
``tool:<name>`` or ``queue:<name>`` → who paused it, why, when). A worker process reads it
at most once per ``PAUSE_CACHE_S``: a pause holds back every message a worker takes up from
then on, within that second; a message already past the gate runs to its end.

Limits are Dramatiq's rate limiters on the ledger's Redis (every process and pod that uses
the ledger shares them). ``rate`` "N/s" or "N/m": a ``WindowRateLimiter`` caps each
wall-clock second (or any 60 consecutive ones) at N, and a ``BucketRateLimiter`` spaces the
admissions k per bucket of ceil(window * k / N) ms (5/s: one every 200 ms), so the N of a
second are not all sent at its start; the hosts' clocks decide the seconds. ``concurrency``
N: N mutex slots (``ConcurrentRateLimiter`` of limit 1 each), so a slot whose holder was
SIGKILLed comes back after its own TTL (the actor's time limit plus a minute) — a single
shared counter would keep a dead holder's count as long as others keep touching it. A
slot is held from before the claim until the message is finished. A limited message first
waits in its worker thread up to ``_WAIT_S`` (a slot or a bucket usually frees within it),
then is held back, a second longer with each deferral. The limits count admissions, just
before the claim: a message admitted that turns out a duplicate runs nothing (under the
limit, never over), and one admitted at a second's end may reach the provider in the next.

Whatever fails here (the ledger's Redis down) holds the message back too: the gate fails
closed (``unavailable``), as the claim would.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dramatiq
import redis
from dramatiq.common import q_name
from dramatiq.middleware import MiddlewareError, TimeLimit
from dramatiq.rate_limits import BucketRateLimiter, ConcurrentRateLimiter, WindowRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

from dedupe import Ledger, OperatorError, SpecError
from dedupe.spec import TOOL_NAME

from ..metrics import PAUSE_KINDS

__all__ = [
    "DEFERRALS",
    "HELD_BACK",
    "LIMITS_OPTION",
    "PAUSE_CACHE_S",
    "QUEUE_NAME",
    "Deferred",
    "Gate",
    "Limits",
    "paused",
    "set_paused",
]

#: How a held-back message's retry names its cause (``Deferred``; the scheduled view reads
#: it back, ``dead_queue``).
HELD_BACK = "held back"
#: The actor option carrying a tool's declared ``Limits``.
LIMITS_OPTION = "effectq_limits"
#: The message option counting how often it was held back (its next wait grows with it).
DEFERRALS = "effectq_deferrals"
#: How long a worker process trusts its last read of the pause state.
PAUSE_CACHE_S = 1.0
#: A Dramatiq queue name (its own rule), bounded.
QUEUE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,63}")
#: "100/s", "600/m": the two windows Dramatiq's WindowRateLimiter keeps cheaply (1 and 60
#: one-second counters).
_RATE = re.compile(r"([1-9][0-9]{0,5})/(s|m)")
_WINDOW_S = {"s": 1, "m": 60}
MAX_CONCURRENCY = 32
# A paused message looks again after 5 s, 10 s, ... up to 30 s (± 20 %): a short pause is
# over for everything within about 5 s of the resume, while a long one over a large backlog
# costs each held message one delivery per 30 s, not per 5 s.
_PAUSED_DELAY_MS = 5_000
_PAUSED_CAP_MS = 30_000
# A limited message first waits in its worker thread up to this long for a slot or a token
# (as Sidekiq Enterprise's limiters do), then is held back: a second more with each
# deferral, up to the cap.
_WAIT_S = 1.0
_LIMITED_DELAY_MS = 1_000
_LIMITED_CAP_MS = 30_000
# A concurrency slot's TTL is its tool's time limit plus this: Dramatiq interrupts a call at
# its time limit only when it runs Python again (not inside a blocking read), so the margin
# keeps a slow holder's slot; a SIGKILLed holder's slot frees itself after it.
_SLOT_MARGIN_MS = 60_000
# A rate's admissions are spread over buckets at least this long (k per bucket).
_MIN_BUCKET_MS = 100


@dataclass(frozen=True)
class Limits:
    """A tool's declared limits: ``rate`` per ``window_s`` seconds, ``concurrency`` at once
    (None: no such limit)."""

    rate: int | None = None
    window_s: int = 1
    concurrency: int | None = None

    @classmethod
    def declare(cls, rate: str | None, concurrency: int | None) -> Limits | None:
        """The limits ``@effect_tool(rate=..., concurrency=...)`` declares; SpecError (one
        line) for a declaration this cannot honour."""
        if rate is None and concurrency is None:
            return None
        count, window = None, 1
        if rate is not None:
            found = _RATE.fullmatch(rate) if isinstance(rate, str) else None
            if found is None:
                raise SpecError(
                    "rate must be '<N>/s' or '<N>/m' with N from 1 to 999999 (e.g. '100/s')"
                )
            count, window = int(found.group(1)), _WINDOW_S[found.group(2)]
        if concurrency is not None and (
            type(concurrency) is not int or not 1 <= concurrency <= MAX_CONCURRENCY
        ):
            raise SpecError(f"concurrency must be an integer from 1 to {MAX_CONCURRENCY}")
        return cls(rate=count, window_s=window, concurrency=concurrency)

    def spacing(self) -> tuple[int, int]:
        """(k, b): admit at most k per b-ms bucket, b = ceil(window * k / rate) and k the
        fewest that makes b at least ``_MIN_BUCKET_MS`` — so the N of a window are spread
        over it, not sent at its start."""
        assert self.rate is not None
        window_ms = self.window_s * 1000
        per = max(1, math.ceil(self.rate * _MIN_BUCKET_MS / window_ms))
        return per, math.ceil(window_ms * per / self.rate)

    def as_dict(self) -> dict[str, Any]:
        unit = "s" if self.window_s == 1 else "m"
        return {
            "rate": None if self.rate is None else f"{self.rate}/{unit}",
            "concurrency": self.concurrency,
        }


class Deferred(dramatiq.Retry, MiddlewareError):
    """A message held back by a control: raised before the actor runs (a MiddlewareError,
    which Dramatiq does not swallow), delivered again after ``delay_ms`` through Retries
    (the tools' ``retry_when`` never gives up on it) and not counted as an attempt
    (``EffectMiddleware``)."""

    def __init__(self, cause: str, delay_ms: int, detail: str = "") -> None:
        shown = f"{cause} ({detail})" if detail else cause
        dramatiq.Retry.__init__(self, f"{HELD_BACK}: {shown}", delay=delay_ms)
        self.cause = cause


# -- the pause state ------------------------------------------------------------------------


def paused(ledger: Ledger) -> dict[tuple[str, str], dict[str, Any]]:
    """Every paused tool and queue: (kind, name) → who paused it, why, when (ledger ms)."""
    with ledger.guard():
        raw: dict[str, str] = ledger.client.hgetall(ledger.keyspace.paused)  # type: ignore[assignment]
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for field, value in raw.items():
        kind, _, name = _text(field).partition(":")
        try:
            note = json.loads(value)
        except ValueError:
            note = {}
        found[(kind, name)] = note if isinstance(note, dict) else {}
    return found


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def check_target(kind: str, name: str) -> None:
    """A pause target's form (the faces check it before anything is contacted)."""
    if kind not in PAUSE_KINDS:
        raise OperatorError("pause: name a tool or a queue")
    rule = TOOL_NAME if kind == "tool" else QUEUE_NAME
    if not isinstance(name, str) or not rule.fullmatch(name):
        raise OperatorError(f"pause: not a {kind} name (pattern ^{rule.pattern}$)")


def set_paused(
    ledger: Ledger, kind: str, name: str, *, pause: bool, actor: str, reason: str
) -> dict[str, Any]:
    """Pause (or resume) ``kind`` ``name`` and audit it with actor and reason; the
    document ``effectq pause|resume --json`` prints."""
    check_target(kind, name)
    action = "pause" if pause else "resume"
    field = f"{kind}:{name}"
    now_ms = ledger.server_time_ms()
    with ledger.guard():
        if pause:
            note = json.dumps({"actor": actor, "reason": reason, "at_ms": now_ms})
            changed = bool(ledger.client.hset(ledger.keyspace.paused, field, note))
        else:
            changed = bool(ledger.client.hdel(ledger.keyspace.paused, field))
    state = "paused" if pause else "resumed"
    outcome = f"ok: {kind} {name} {state}" if changed else f"ok: {kind} {name} was {state} already"
    ledger.audit(action=action, key="", actor=actor, reason=reason, outcome=outcome)
    return {"kind": kind, "name": name, "paused": pause, "changed": changed, "at_ms": now_ms}


class _PauseCache:
    """This process's view of the pause state, read at most once per ``PAUSE_CACHE_S``."""

    def __init__(self, ledger: Callable[[], Ledger]) -> None:
        self._ledger = ledger
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._paused: frozenset[tuple[str, str]] = frozenset()

    def get(self) -> frozenset[tuple[str, str]]:
        """The paused targets; raises what the ledger raised when it could not be read."""
        with self._lock:
            if time.monotonic() - self._read_at >= PAUSE_CACHE_S:
                self._paused = frozenset(paused(self._ledger()))
                self._read_at = time.monotonic()
            return self._paused


# -- the gate -------------------------------------------------------------------------------


def _jitter(delay_ms: float) -> int:
    return int(delay_ms * random.uniform(0.8, 1.2))


def _backend(ledger: Ledger, key: str) -> RedisBackend:
    """Dramatiq's Redis backend on the ledger's server holding ``key`` (one master of a
    cluster: each limiter's keys share one hash tag)."""
    client = ledger.client
    if isinstance(client, redis.RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return RedisBackend(client=client.get_redis_connection(node))
    return RedisBackend(client=client)


def _tag(ledger: Ledger, tool: str) -> str:
    # One hash tag per tool: a window limiter's counters are read in one WATCH/MGET.
    return f"{{{ledger.keyspace.namespace}:limit:{tool}}}"


class Gate:
    """Admits a message, or raises ``Deferred``; gives a concurrency slot back when the
    message is finished. Holds nothing but the slots of the messages its threads run."""

    def __init__(self, ledger: Callable[[], Ledger]) -> None:
        self._ledger = ledger
        self._pauses = _PauseCache(ledger)
        self._held = threading.local()

    def admit(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        actor = broker.actors.get(message.actor_name)
        if actor is None or not actor.options.get("redelivery_is_duplicate"):
            return  # not an effect tool's message: none of these controls apply
        deferrals = int(message.options.get(DEFERRALS, 0))
        try:
            targets = self._pauses.get()
            if ("tool", message.actor_name) in targets or (
                "queue",
                q_name(message.queue_name),
            ) in targets:
                delay = min(_PAUSED_DELAY_MS * (deferrals + 1), _PAUSED_CAP_MS)
                raise Deferred("paused", _jitter(delay))
            limits = actor.options.get(LIMITS_OPTION)
            if isinstance(limits, Limits):
                self._limit(broker, actor, message, limits, deferrals)
        except Deferred:
            raise
        except Exception as exc:
            # Dramatiq would swallow it and run the actor: hold the message back instead.
            self.release(message)
            raise Deferred("unavailable", _backoff(deferrals), type(exc).__name__) from None

    def _limit(
        self,
        broker: dramatiq.Broker,
        actor: dramatiq.Actor[..., Any],
        message: dramatiq.MessageProxy,
        limits: Limits,
        deferrals: int,
    ) -> None:
        """Take a concurrency slot and a rate token, waiting in this thread up to
        ``_WAIT_S`` for them (a limit is usually free again within a bucket or a call), then
        hold the message back."""
        ledger = self._ledger()
        tag = _tag(ledger, message.actor_name)
        backend = _backend(ledger, tag)
        deadline = time.monotonic() + _WAIT_S
        while True:
            cause, pause_s = self._try(broker, actor, message, limits, backend, tag)
            if cause is None:
                return
            if time.monotonic() + pause_s > deadline:
                raise Deferred(cause, _backoff(deferrals))
            time.sleep(pause_s)

    def _try(
        self,
        broker: dramatiq.Broker,
        actor: dramatiq.Actor[..., Any],
        message: dramatiq.MessageProxy,
        limits: Limits,
        backend: RedisBackend,
        tag: str,
    ) -> tuple[str | None, float]:
        """(None, 0) once admitted; else the limit that refused and how long to wait before
        asking again."""
        if limits.concurrency is not None and not self._slot(
            broker, actor, message, limits.concurrency, backend, tag
        ):
            return "concurrency", random.uniform(0.02, 0.08)
        if limits.rate is None:
            return None, 0.0
        per, bucket_ms = limits.spacing()
        spread = BucketRateLimiter(  # type: ignore[no-untyped-call]
            backend, f"{tag}:spread", limit=per, bucket=bucket_ms
        )
        window = WindowRateLimiter(  # type: ignore[no-untyped-call]
            backend, f"{tag}:rate", limit=limits.rate, window=limits.window_s
        )
        # Both or none: the bucket spaces admissions, the window caps each second (or
        # minute); a bucket slot taken by a message the window refuses is lost (under the
        # limit, never over).
        admitted = False
        with spread.acquire(raise_on_failure=False) as spaced:
            if spaced:
                with window.acquire(raise_on_failure=False) as counted:
                    admitted = counted
        if admitted:
            return None, 0.0
        self.release(message)
        # The next bucket, give or take a few ms so that waiters do not ask all at once.
        until_next_ms = bucket_ms - time.time() * 1000 % bucket_ms
        return "rate", (until_next_ms + random.uniform(0, 10)) / 1000

    def _slot(
        self,
        broker: dramatiq.Broker,
        actor: dramatiq.Actor[..., Any],
        message: dramatiq.MessageProxy,
        concurrency: int,
        backend: RedisBackend,
        tag: str,
    ) -> bool:
        """Take one of the tool's ``concurrency`` slots for ``message`` (kept until
        ``release``), trying them from a random one."""
        held = getattr(self._held, "slot", None)
        if held is not None and held[0] == message.message_id:
            return True  # taken on an earlier try of this wait
        ttl = _time_limit_ms(broker, actor, message) + _SLOT_MARGIN_MS
        first = random.randrange(concurrency)
        for i in [*range(first, concurrency), *range(first)]:
            slot = ConcurrentRateLimiter(  # type: ignore[no-untyped-call]
                backend, f"{tag}:slot:{i}", limit=1, ttl=ttl
            )
            # Held across Dramatiq's hooks: entered here, exited by ``release``.
            holding = slot.acquire(raise_on_failure=False)
            if holding.__enter__():
                self._held.slot = (message.message_id, holding)
                return True
            holding.__exit__(None, None, None)
        return False

    def release(self, message: dramatiq.MessageProxy) -> None:
        """Give back the concurrency slot ``message`` holds, if any (best effort: a slot
        not given back returns after its TTL)."""
        held = getattr(self._held, "slot", None)
        if held is None or held[0] != message.message_id:
            return
        self._held.slot = None
        with contextlib.suppress(redis.RedisError):
            held[1].__exit__(None, None, None)


def _backoff(deferrals: int) -> int:
    """A held-back message's wait: a second more with each deferral (a backlog spreads over
    the time it needs), up to ``_LIMITED_CAP_MS``, ± 20 %."""
    return _jitter(min(_LIMITED_DELAY_MS * (deferrals + 1), _LIMITED_CAP_MS))


def _time_limit_ms(
    broker: dramatiq.Broker, actor: dramatiq.Actor[..., Any], message: dramatiq.MessageProxy
) -> int:
    """The longest the message may run (Dramatiq's TimeLimit): a slot outlives it."""
    configured: Mapping[str, Any] = message.options
    found = configured.get("time_limit") or actor.options.get("time_limit")
    if found is None:
        limits = [m.time_limit for m in broker.middleware if isinstance(m, TimeLimit)]
        found = limits[0] if limits else 600_000
    return int(found)
