"""The Dramatiq broker effectq runs on: Redis (default) or RabbitMQ, from the broker URL.

The one change to Dramatiq's Redis broker: bytes on the queue that do not decode to a
message. Dramatiq raises ``DecodeError`` out of the consumer's ``__next__``; the consumer
restarts, and the message — with the rest of the batch prefetched alongside it — stays in
this worker's ack set until the worker dies, with no record of why. Here it is moved to
Dramatiq's dead-letter queue (``<queue>.XQ``) and recorded in effectq's dead-letter stream
with its reason, and the consumer carries on. (RabbitMQ's consumer already rejects such a
delivery to its dead-letter queue; effectq records it there through the encoder below.)
"""

from __future__ import annotations

import hashlib
import logging

import dramatiq
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.encoder import JSONEncoder, MessageData
from dramatiq.errors import DecodeError

from dedupe.errors import EffectqError

from .settings import Settings

__all__ = ["UNDECODABLE", "build_broker"]

log = logging.getLogger("effectq.broker")

# The ``tool`` field of a dead-letter record for bytes that never became a message.
UNDECODABLE = "(undecodable)"


def _reason(error: BaseException, size: int) -> str:
    # The exception's class only: its text can quote the bytes (a recipient, a secret).
    return f"undecodable message ({type(error).__name__}, {size} bytes): never executed"


def _record(message_id: str, error: BaseException, size: int) -> None:
    from . import runtime

    reason = _reason(error, size)
    try:
        runtime.ledger().dead_letter(
            message_id=message_id, tool=UNDECODABLE, key=None, reason=reason
        )
    except EffectqError as err:
        log.error("dead-letter of %s not recorded: %s", message_id, err)
    log.warning("dead-lettered %s: %s", message_id, reason)


class _Consumer(_RedisConsumer):
    def __next__(self) -> dramatiq.MessageProxy | None:
        try:
            return super().__next__()  # type: ignore[no-untyped-call,no-any-return]
        except DecodeError as exc:
            self._dead_letter(exc.data, exc.error)
            return None

    def _dead_letter(self, data: bytes, error: BaseException) -> None:
        # The message's Redis id lives only in the ack set this fetch put it in; the
        # batch is at most `prefetch` ids, so compare their bodies.
        broker: RedisBroker = self.broker
        acks = f"{broker.namespace}:__acks__.{broker.broker_id}.{self.queue_name}"
        bodies = f"{broker.namespace}:{self.queue_name}.msgs"
        ids = sorted(broker.client.smembers(acks))
        found = [
            i
            for i, body in zip(ids, broker.client.hmget(bodies, ids) if ids else [], strict=True)
            if body == data
        ]
        if not found:
            log.error("undecodable message on %s not found in the ack set", self.queue_name)
            return
        message_id = found[0].decode()
        broker.do_nack(self.queue_name, message_id)
        _record(message_id, error, len(data))


class _RedisBroker(RedisBroker):
    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> _Consumer:
        return _Consumer(self, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]


class _RecordingEncoder(JSONEncoder):
    """For RabbitMQ, which rejects an undecodable delivery itself: record it first (its id
    is not in the bytes, so the record names their digest)."""

    def decode(self, data: bytes) -> MessageData:
        try:
            return super().decode(data)
        except Exception as exc:
            _record(f"sha256:{hashlib.sha256(data).hexdigest()[:32]}", exc, len(data))
            raise


def build_broker(cfg: Settings) -> dramatiq.Broker:
    if cfg.broker_url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        dramatiq.set_encoder(_RecordingEncoder())
        return RabbitmqBroker(url=cfg.broker_url)
    return _RedisBroker(  # type: ignore[no-untyped-call]
        url=cfg.broker_url,
        heartbeat_timeout=cfg.broker_heartbeat_timeout_ms,
        maintenance_chance=cfg.broker_maintenance_chance,
    )
