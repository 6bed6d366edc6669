"""Enqueue many messages in few round trips.

For Dramatiq's Redis broker this runs the broker's own ``dispatch`` enqueue script for a
batch in one round trip (``dispatch.calls``) — exactly what ``RedisBroker.enqueue`` does
per message, middleware hooks included, minus one round trip each. A batch that met a
connection error is sent again on a new connection, as many times as Dramatiq tries one
enqueue, backing off between tries (a broker that restarts within a few seconds is waited
for): at worst a message twice, which the claim turns into a duplicate.

For RabbitMQ it publishes each batch in one AMQP transaction on a channel of its own.
``RabbitmqBroker.enqueue`` waits for a publisher confirm per message (pika's blocking
channel cannot stream them), one disk sync each; RabbitMQ gives a committed transaction
the same guarantee for the whole batch — durable and handed over on commit, unroutable
messages returned on commit (https://www.rabbitmq.com/docs/semantics) — in one round trip.
Messages returned unroutable (their queue was deleted behind the producer's back) are sent
again once the queue is declared again, as Dramatiq does for a confirmed enqueue. A batch
whose commit was not acknowledged is sent again on a new connection: at worst a message
twice, which the claim turns into a duplicate.

Other brokers get a plain loop.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import compute_backoff, q_name
from dramatiq.errors import ConnectionClosed

from dedupe.script import first_error, replies_of, send

from . import dispatch

if TYPE_CHECKING:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

__all__ = ["Sending", "enqueue_many", "send_many"]

BATCH = 1000
# As many tries per batch as Dramatiq gives one enqueue (MAX_ENQUEUE_ATTEMPTS), with a
# backoff between them that Dramatiq's enqueue does not have.
ATTEMPTS = 6
BACKOFF_MS = 100


def enqueue_many(broker: dramatiq.Broker, messages: Sequence[dramatiq.Message[object]]) -> None:
    send_many(broker, messages).wait()


class Sending(Protocol):
    def wait(self) -> None:
        """Done: every message is queued (raises what the enqueue met)."""

    def abandon(self) -> None:
        """Not waited for (the caller failed meanwhile): its connection is closed."""


def send_many(broker: dramatiq.Broker, messages: Sequence[dramatiq.Message[object]]) -> Sending:
    """Start ``enqueue_many``: for a Redis broker the first batch is on the wire when this
    returns and ``wait`` reads its replies and sends the rest, so the caller works while
    the server does (no thread); another broker's enqueue is done by then."""
    if isinstance(broker, RedisBroker):
        return _RedisSending(broker, messages)
    # RabbitmqBroker's module needs pika: a broker of that class exists only once imported.
    rabbitmq = sys.modules.get("dramatiq.brokers.rabbitmq")
    if rabbitmq is not None and isinstance(broker, rabbitmq.RabbitmqBroker):
        for lo in range(0, len(messages), BATCH):
            _enqueue_rabbitmq(broker, messages[lo : lo + BATCH])
    else:
        for message in messages:
            broker.enqueue(message)
    return _Done()


class _Done:
    def wait(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class _RedisSending:
    """The broker's enqueue script for each message, ``BATCH`` to a write on one
    connection (``dedupe.script.send``: a third of redis-py's pipeline CPU). A batch that
    met a connection error goes again on a new connection, up to ``ATTEMPTS`` tries, each
    under fresh Redis ids (the id is in the body): a batch whose replies were lost may have
    been queued, and one id queued twice is one message run twice."""

    def __init__(self, broker: RedisBroker, messages: Sequence[dramatiq.Message[object]]):
        self.broker, self.messages = broker, messages
        self.hooks = {when: _hooked(broker, f"{when}_enqueue") for when in ("before", "after")}
        self.conn: Any = None
        self.batch: list[dramatiq.Message[object]] = []
        self.commands: list[list[Any]] = []
        self.chunk, self.attempt = messages[:BATCH], 0
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
            self._send()  # else tried again by wait()

    def wait(self) -> None:
        self._finish()
        for lo in range(BATCH, len(self.messages), BATCH):
            self.chunk, self.attempt = self.messages[lo : lo + BATCH], 0
            self._finish()

    def abandon(self) -> None:
        if self.conn is not None:
            self.conn.disconnect()  # its replies unread: never handed to anyone
            self._release()

    def _finish(self) -> None:
        while True:
            try:
                if self.conn is None:
                    self._send()
                self._read()
                break
            except (redis.ConnectionError, redis.TimeoutError):
                if self.attempt >= ATTEMPTS:
                    raise
                _pause(self.attempt)
        if self.hooks["after"]:
            for message in self.batch:
                self.broker.emit_after("enqueue", message, None)

    def _send(self) -> None:
        broker = self.broker
        self.attempt += 1
        # Stored under their message ids (as EffectqRedisBroker.enqueue stores a first
        # enqueue), so a producer can ask whether the broker still holds one. An attempt
        # whose earlier try landed writes the same body again: one message, its id listed
        # twice; Dramatiq skips the second fetch (no body left). Constructed directly:
        # copy's dataclasses.replace costs twice the CPU.
        self.batch = [
            dramatiq.Message(m.queue_name, m.actor_name, m.args, m.kwargs,
                             {**m.options, "redis_message_id": m.message_id},
                             m.message_id, m.message_timestamp)
            for m in self.chunk
        ]  # fmt: skip
        if self.hooks["before"]:
            for message in self.batch:
                broker.emit_before("enqueue", message, None)
        self.commands = dispatch.calls(
            broker,
            "enqueue",
            ((m.queue_name, (m.options["redis_message_id"], m.encode())) for m in self.batch),
        )
        self.conn = broker.client.connection_pool.get_connection()
        try:
            send(self.conn, self.commands)
        except BaseException:
            self._release()
            raise

    def _read(self) -> None:
        try:
            replies = replies_of(self.conn, len(self.commands))
            dispatch.run_missing(self.broker, self.conn, self.commands, replies)
        finally:
            self._release()
        first_error(replies)

    def _release(self) -> None:
        self.broker.client.connection_pool.release(self.conn)
        self.conn = None


def _pause(attempt: int) -> None:
    """Time for a restarting broker to come back after try ``attempt`` failed: Dramatiq's
    own backoff with jitter, 0.1-0.2 s doubling (~3-5 s over the tries)."""
    _, delay_ms = compute_backoff(attempt - 1, factor=BACKOFF_MS)
    time.sleep(delay_ms / 1000)


def _hooked(broker: dramatiq.Broker, hook: str) -> bool:
    """Some middleware of ``broker`` does something at ``hook`` (the base class's is a
    no-op): calling every middleware's no-op costs as much as encoding the message."""
    base = getattr(dramatiq.Middleware, hook)
    return any(getattr(type(m), hook, base) is not base for m in broker.middleware)


def _enqueue_rabbitmq(broker: RabbitmqBroker, batch: Sequence[dramatiq.Message[object]]) -> None:
    import pika.exceptions  # type: ignore[import-untyped]

    for message in batch:
        broker.emit_before("enqueue", message, None)
    # A body carries its message id: it names the message RabbitMQ returns.
    pending = {message.encode(): message for message in batch}
    for attempt in range(1, ATTEMPTS + 1):
        try:
            returned = _publish_committed(broker, pending)
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
            del broker.connection  # the next attempt opens a new one
            if attempt == ATTEMPTS:
                raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
            _pause(attempt)
            continue
        pending = {body: pending[body] for body in returned}
        if not pending:
            break
        for message in pending.values():
            broker.queues_pending.add(q_name(message.queue_name))
    else:
        unroutable = RuntimeError(f"{len(pending)} messages returned unroutable")
        raise ConnectionClosed(unroutable)  # type: ignore[no-untyped-call]
    for message in batch:
        broker.emit_after("enqueue", message, None)


def _publish_committed(
    broker: RabbitmqBroker, bodies: dict[bytes, dramatiq.Message[object]]
) -> set[bytes]:
    """Publish ``bodies`` in one transaction; the bodies RabbitMQ returned unroutable."""
    import pika

    for queue in {message.queue_name for message in bodies.values()}:
        broker.declare_queue(queue, ensure=True)
    connection = broker.connection
    channel = connection.channel()
    returned: set[bytes] = set()
    channel.add_on_return_callback(lambda _channel, _method, _props, body: returned.add(body))
    try:
        channel.tx_select()
        for body, message in bodies.items():
            channel.basic_publish(
                exchange="",
                routing_key=message.queue_name,
                body=body,
                properties=pika.BasicProperties(
                    delivery_mode=2, priority=message.options.get("broker_priority")
                ),
                mandatory=True,
            )
        channel.tx_commit()
        # The returns arrived before commit-ok; hand them to the callback.
        connection.process_data_events(time_limit=0)
    finally:
        if channel.is_open:
            channel.close()
    return returned
