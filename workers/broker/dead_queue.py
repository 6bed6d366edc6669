"""A queue's dead letters in Dramatiq's Redis broker (``<queue>.XQ``: a sorted set of message
ids by the time they died, and ``<queue>.XQ.msgs``: their bodies), moved back onto the queue
or dropped, each one in a single MULTI/EXEC so that a message is never in both places, nor in
neither. The move is Dramatiq's own ``enqueue`` (the body into ``<queue>.msgs``, the id
pushed onto ``<queue>``), with the retry count reset: a requeued message gets a fresh budget.
Its timestamp is kept: a message older than its tool's provider window is refused as stale
again (``replay`` submits an effect afresh)."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from dramatiq import Message

from .keys import NAMESPACE, queue_hash

__all__ = ["DeadLetter", "DeadLetterQueue"]


@dataclass(frozen=True)
class DeadLetter:
    """One dead message: its id, actor (the tool) and effect key (when its body has one)."""

    message_id: str
    queue: str
    tool: str
    key: str


class DeadLetterQueue:
    def __init__(self, client: redis.Redis, queue: str, namespace: str = NAMESPACE) -> None:
        self.client, self.queue, self.namespace = client, queue, namespace
        self._ids = f"{namespace}:{queue}.XQ"
        self._bodies = queue_hash(f"{queue}.XQ", namespace)

    def letters(self, *, tool: str | None = None, ids: set[str] | None = None) -> list[DeadLetter]:
        """The dead messages, oldest first (those of ``tool``, or of ``ids``, only)."""
        found: list[DeadLetter] = []
        for raw_id in self.client.zrange(self._ids, 0, -1):
            message_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            if ids is not None and message_id not in ids:
                continue
            body = self.client.hget(self._bodies, message_id)
            if body is None:
                continue
            letter = _letter(self.queue, message_id, _bytes(body))
            if tool is None or letter.tool == tool:
                found.append(letter)
        return found

    def requeue(self, message_id: str) -> bool:
        """Move one dead message back onto its queue; False when it is no longer dead."""
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    # Another requeue or purge of it in between: read again.
                    pipe.watch(self._bodies)  # type: ignore[no-untyped-call]
                    body = pipe.hget(self._bodies, message_id)
                    if body is None:
                        return False
                    message = Message.decode(_bytes(body))
                    fresh = message.copy(options={**message.options, "retries": 0})
                    pipe.multi()
                    pipe.hset(queue_hash(self.queue, self.namespace), message_id, fresh.encode())
                    pipe.rpush(f"{self.namespace}:{self.queue}", message_id)
                    pipe.zrem(self._ids, message_id)
                    pipe.hdel(self._bodies, message_id)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue

    def purge(self, message_id: str) -> bool:
        """Drop one dead message; False when it is no longer dead."""
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(self._ids, message_id)
        pipe.hdel(self._bodies, message_id)
        removed, _ = pipe.execute()
        return bool(removed)


def _bytes(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else body


def _letter(queue: str, message_id: str, body: bytes) -> DeadLetter:
    try:
        message = Message.decode(body)
    except Exception:  # undecodable bytes were dead-lettered as such: still listable
        return DeadLetter(message_id, queue, "", "")
    key = ""
    if message.args and isinstance(message.args[0], dict):
        key = str(message.args[0].get("key", ""))
    return DeadLetter(message_id, queue, message.actor_name, key)
