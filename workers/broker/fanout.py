"""Enqueue many messages in few round trips.

For Dramatiq's Redis broker this runs the broker's own ``dispatch`` enqueue script over a
pipeline — exactly what ``RedisBroker.enqueue`` does per message, middleware hooks
included, minus one round trip each. It leans on two Dramatiq internals
(``broker.scripts["dispatch"]`` and ``_max_unpack_size``), pinned by the ``dramatiq<3``
range.

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

import sys
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis, q_name
from dramatiq.errors import ConnectionClosed

if TYPE_CHECKING:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

__all__ = ["enqueue_many"]

BATCH = 1000
# As many tries per batch as Dramatiq gives one enqueue (MAX_ENQUEUE_ATTEMPTS).
ATTEMPTS = 6


def enqueue_many(broker: dramatiq.Broker, messages: Sequence[dramatiq.Message[object]]) -> None:
    if isinstance(broker, RedisBroker):
        _enqueue_redis(broker, messages)
        return
    # RabbitmqBroker's module needs pika: a broker of that class exists only once imported.
    rabbitmq = sys.modules.get("dramatiq.brokers.rabbitmq")
    if rabbitmq is not None and isinstance(broker, rabbitmq.RabbitmqBroker):
        for lo in range(0, len(messages), BATCH):
            _enqueue_rabbitmq(broker, messages[lo : lo + BATCH])
        return
    for message in messages:
        broker.enqueue(message)


def _enqueue_redis(broker: RedisBroker, messages: Sequence[dramatiq.Message[object]]) -> None:
    dispatch = broker.scripts["dispatch"]
    unpack = broker._max_unpack_size()  # type: ignore[no-untyped-call]
    for lo in range(0, len(messages), BATCH):
        pipe = broker.client.pipeline(transaction=False)
        batch = []
        for message in messages[lo : lo + BATCH]:
            message = message.copy(options={"redis_message_id": str(uuid.uuid4())})
            broker.emit_before("enqueue", message, None)
            args = [
                "enqueue", current_millis(), message.queue_name, broker.broker_id,
                broker.heartbeat_timeout, broker.dead_message_ttl, 0, unpack,
                message.options["redis_message_id"], message.encode(),
            ]  # fmt: skip
            dispatch(keys=[broker.namespace], args=args, client=pipe)
            batch.append(message)
        pipe.execute()
        for message in batch:
            broker.emit_after("enqueue", message, None)


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
