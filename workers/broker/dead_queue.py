"""A queue's dead letters and delayed messages in Dramatiq's Redis broker.

Dead letters (``<queue>.XQ``: a sorted set of message
ids by the time they died, and ``<queue>.XQ.msgs``: their bodies), moved back onto the queue
or dropped, each one in a single MULTI/EXEC so that a message is never in both places, nor in
neither. The move is Dramatiq's own ``enqueue`` (the body into ``<queue>.msgs``, the id
pushed onto ``<queue>``), with the retry count reset: a requeued message gets a fresh budget.
Its timestamp is kept: a message older than its tool's provider window is refused as stale
again (``replay`` submits an effect afresh).

A dead letter is named by the id its message carries (``effectq deadletters`` and the logs
print it), or by its Redis id: the two differ for a message that was retried (Dramatiq gives
each retry a fresh Redis id).

Delayed messages (``DelayQueue``): ``<queue>.DQ.msgs``, a hash of Redis id → body, holds
every message waiting for its ``eta`` — retries backing off and messages sent with a delay —
whether still on the ``<queue>.DQ`` list or already fetched by a worker that holds it in
memory until its time (Dramatiq's worker does; the hash keeps it until then). Reading the
hash is the one view of both."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import redis
from dramatiq import Message

from ..metrics import DEFERRAL_CAUSES
from .gate import HELD_BACK
from .keys import NAMESPACE, queue_hash

__all__ = ["DeadLetter", "DeadLetterQueue", "DelayQueue", "Delayed"]


@dataclass(frozen=True)
class DeadLetter:
    """One dead message: its id, actor (the tool) and effect key (when its body has one),
    and its Redis id (the same as its id unless it was retried)."""

    message_id: str
    queue: str
    tool: str
    key: str
    redis_id: str


class DeadLetterQueue:
    def __init__(self, client: redis.Redis, queue: str, namespace: str = NAMESPACE) -> None:
        self.client, self.queue, self.namespace = client, queue, namespace
        self._ids = f"{namespace}:{queue}.XQ"
        self._bodies = queue_hash(f"{queue}.XQ", namespace)

    def letters(
        self, *, tool: str | None = None, ids: set[str] | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        """The dead messages, oldest first (those of ``tool``, or of ``ids`` — message or
        Redis ids — only), at most ``limit`` of them."""
        found: list[DeadLetter] = []
        start = 0
        while limit is None or len(found) < limit:
            raw_ids = self.client.zrange(self._ids, start, start + _BATCH - 1)
            if not raw_ids:
                return found
            start += len(raw_ids)
            redis_ids = [_text(i) for i in raw_ids]  # type: ignore[arg-type]
            bodies = self.client.hmget(self._bodies, redis_ids)
            for redis_id, body in zip(redis_ids, bodies, strict=True):
                if body is None:
                    continue
                letter = _letter(self.queue, redis_id, _bytes(body))
                if ids is not None and not {letter.message_id, redis_id} & ids:
                    continue
                if tool is None or letter.tool == tool:
                    found.append(letter)
                    if limit is not None and len(found) == limit:
                        return found
        return found

    def requeue(self, redis_id: str) -> bool:
        """Move one dead message (by its Redis id) back onto its queue; False when it is no
        longer dead."""
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    # Another requeue or purge of it in between: read again.
                    pipe.watch(self._bodies)  # type: ignore[no-untyped-call]
                    body = pipe.hget(self._bodies, redis_id)
                    if body is None:
                        return False
                    message = Message.decode(_bytes(body))
                    fresh = message.copy(options={**message.options, "retries": 0})
                    pipe.multi()
                    pipe.hset(queue_hash(self.queue, self.namespace), redis_id, fresh.encode())
                    pipe.rpush(f"{self.namespace}:{self.queue}", redis_id)
                    pipe.zrem(self._ids, redis_id)
                    pipe.hdel(self._bodies, redis_id)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue

    def purge(self, redis_id: str) -> bool:
        """Drop one dead message (by its Redis id); False when it is no longer dead."""
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(self._ids, redis_id)
        pipe.hdel(self._bodies, redis_id)
        removed, _ = pipe.execute()
        return bool(removed)


# Ids and bodies read per round trip.
_BATCH = 500


def _bytes(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else body


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _key(message: Message[Any]) -> str:
    """The effect key an effect tool's message carries (its envelope's), else ""."""
    if message.args and isinstance(message.args[0], dict):
        return str(message.args[0].get("key", ""))
    return ""


def _letter(queue: str, redis_id: str, body: bytes) -> DeadLetter:
    try:
        message = Message.decode(body)
    except Exception:  # undecodable bytes were dead-lettered as such: still listable
        return DeadLetter(redis_id, queue, "", "", redis_id)
    return DeadLetter(message.message_id, queue, message.actor_name, _key(message), redis_id)


@dataclass(frozen=True)
class Delayed:
    """One message waiting in a delay queue, as an on-call may see it: no argument, no
    traceback text — the exception's type name at most."""

    message_id: str
    queue: str
    tool: str
    key: str
    #: When a worker moves it back onto its queue (its ``eta`` option, ms); None: unreadable.
    eta_ms: int | None
    #: Failed deliveries so far (Dramatiq's ``retries`` option).
    retries: int
    #: ``retry_after_failure`` (the call failed: not executed, or its outcome uncertain, or
    #: another actor's exception), ``retry_later`` (effectq's own back-off: the claim is
    #: held elsewhere, the ledger could not answer, a commit waits), ``held_back`` (by a
    #: pause or a limit: no attempt made), ``delay`` (sent with one) or ``undecodable``.
    why: str
    #: The cause in effectq's fixed words ("not executed", "effect is in_flight", "paused",
    #: "rate", …) or another exception's type name; never the exception's message.
    error: str | None


class DelayQueue:
    """A queue's delayed messages (``<queue>.DQ.msgs``), read without touching them."""

    def __init__(self, client: redis.Redis, queue: str, namespace: str = NAMESPACE) -> None:
        self.client, self.queue = client, queue
        self._bodies = queue_hash(f"{queue}.DQ", namespace)

    def size(self) -> int:
        return int(self.client.hlen(self._bodies))

    def messages(self, *, limit: int) -> list[Delayed]:
        """At most ``limit`` of them, in the hash's order (HSCAN: no blocking read)."""
        seen: dict[str, Delayed] = {}  # HSCAN may return an entry twice
        for raw_id, body in self.client.hscan_iter(self._bodies, count=_BATCH):
            if len(seen) >= limit:
                break
            redis_id = _text(raw_id)
            seen[redis_id] = _delayed(self.queue, redis_id, _bytes(body))
        return list(seen.values())


def _delayed(queue: str, redis_id: str, body: bytes) -> Delayed:
    try:
        message = Message.decode(body)
    except Exception:
        return Delayed(redis_id, queue, "", "", None, 0, "undecodable", None)
    options = message.options
    eta = options.get("eta")
    retries = options.get("retries")
    retries = retries if isinstance(retries, int) and retries >= 0 else 0
    name, text = _raised(options.get("traceback"))
    if name == "Deferred":  # held back by a control; its retry was given back
        held = _HELD.match(text)
        why, error = "held_back", held.group(1) if held else None
    elif not retries:
        why, error = "delay", None
    elif name == "RetryLater":
        cause = _CAUSE.match(text)
        error = cause.group(1) if cause else None
        why = "retry_after_failure" if error in _FAILURES else "retry_later"
    else:
        why, error = "retry_after_failure", name
    return Delayed(
        message.message_id, queue, message.actor_name, _key(message),
        int(eta) if isinstance(eta, int | float) else None, retries, why, error,
    )  # fmt: skip


_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]{0,200})(?:: (.*)|$)")
# The causes a worker's RetryLater names first (``workers.tool``), before any detail that
# could carry a value: only these are shown. The first two follow a failed call.
_FAILURES = ("not executed", "outcome uncertain")
# Why a control held a message back (``workers.broker.gate.Deferred``'s causes).
_HELD = re.compile(rf"{HELD_BACK}: ({'|'.join(DEFERRAL_CAUSES)})\b")
_CAUSE = re.compile(
    r"(not executed|outcome uncertain|effect is in_flight|effect is blocked|ledger "
    r"unavailable|executed, receipt not recordable|executed but not recorded|commit fenced)"
)


def _raised(traceback: object) -> tuple[str | None, str]:
    """The type name of the exception a retry's ``traceback`` option ends with (Dramatiq's
    ``format_exc``: the first unindented line after the last traceback header) and the
    rest of that line, which callers show only as a known cause (it may carry a value)."""
    if not isinstance(traceback, str):
        return None, ""
    lines = traceback.splitlines()
    header = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    for line in lines[header[-1] + 1 if header else 0 :]:
        if line and not line[0].isspace():
            match = _EXCEPTION_LINE.match(line)
            if match is None:
                return None, ""
            return match.group(1).rpartition(".")[2], match.group(2) or ""
    return None, ""
