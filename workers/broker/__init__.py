"""The Dramatiq broker effectq runs on: Redis (default) or RabbitMQ, from the broker URL.

The one change to Dramatiq's Redis broker: bytes on the queue that do not decode to a
message. Dramatiq raises ``DecodeError`` out of the consumer's ``__next__``; the consumer
restarts, and the message — with the rest of the batch prefetched alongside it — stays in
this worker's ack set until the worker dies, with no record of why. Here it is moved to
Dramatiq's dead-letter queue (``<queue>.XQ``) and recorded in effectq's dead-letter stream
with its reason, and the consumer carries on.

A dead worker's messages come back within a stated bound, whatever the traffic. Dramatiq
moves the unacked messages of a worker whose heartbeat is older than the heartbeat timeout
back to their queue only during a maintenance pass, which it runs on a random 0.1 % of
commands: on a quiet queue that can take many minutes. Each effectq worker process also
runs a maintenance pass of every queue it consumes every
``EFFECTQ_BROKER_MAINTENANCE_INTERVAL_MS``, so a SIGKILLed worker's messages are back on
their queue at most heartbeat timeout + interval after its last heartbeat (60 s + 5 s on
the defaults), and taken by a live worker within its next poll (about a second).

RabbitMQ (``amqp://``, ``amqps://``; docs/rabbitmq.md): Dramatiq's consumer already rejects
an undecodable delivery to ``<queue>.XQ``; effectq records it first, through the encoder
below. Every enqueue waits for the publisher confirm (a message RabbitMQ accepted is on
disk, and an unroutable one is redeclared and sent again instead of dropped), and the AMQP
heartbeat is ``EFFECTQ_BROKER_HEARTBEAT_TIMEOUT_MS``: how long a dead or frozen worker keeps
its unacked messages, the Redis broker's heartbeat timeout by another name.
"""

from __future__ import annotations

import dramatiq

from ..settings import Settings
from .dead_letters import UNDECODABLE, DeadLetterSink, undecodable_id

__all__ = ["UNDECODABLE", "DeadLetterSink", "build_broker", "undecodable_id"]


def build_broker(cfg: Settings, *, dead_letter: DeadLetterSink) -> dramatiq.Broker:
    """The broker of ``cfg.broker_url``; ``dead_letter`` records what never became a
    message."""
    if cfg.broker_url.startswith(("amqp://", "amqps://")):
        from .rabbitmq import build_rabbitmq_broker

        return build_rabbitmq_broker(cfg, dead_letter)
    from .redis import EffectqRedisBroker

    return EffectqRedisBroker(
        url=cfg.broker_url,
        heartbeat_timeout=cfg.broker_heartbeat_timeout_ms,
        maintenance_chance=cfg.broker_maintenance_chance,
        maintenance_interval_ms=cfg.broker_maintenance_interval_ms,
        dead_letter=dead_letter,
    )
