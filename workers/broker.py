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

import hashlib
import logging
import math
import threading
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.encoder import JSONEncoder, MessageData
from dramatiq.errors import DecodeError

from dedupe.errors import EffectqError

from .settings import Settings

__all__ = ["UNDECODABLE", "build_broker", "undecodable_id"]

log = logging.getLogger("effectq.broker")

# The ``tool`` field of a dead-letter record for bytes that never became a message.
UNDECODABLE = "(undecodable)"


def _reason(error: BaseException, size: int) -> str:
    # The exception's class only: its text can quote the bytes (a recipient, a secret).
    return f"undecodable message ({type(error).__name__}, {size} bytes): never executed"


def _record(message_id: str, error: BaseException, size: int) -> None:
    from . import metrics, runtime

    reason = _reason(error, size)
    try:
        runtime.ledger().dead_letter(
            message_id=message_id, tool=UNDECODABLE, key=None, reason=reason
        )
    except Exception as err:
        metrics.dead_letter_unrecorded()
        detail = err.message if isinstance(err, EffectqError) else type(err).__name__
        log.error("dead-letter of %s not recorded: %s", message_id, detail)
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
    def __init__(self, *, maintenance_interval_ms: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        self._forced = threading.local()
        self.add_middleware(_Maintenance(maintenance_interval_ms / 1000))

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> _Consumer:
        return _Consumer(self, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]

    def _should_do_maintenance(self, command: str) -> int:
        if getattr(self._forced, "on", False):
            return 1
        return super()._should_do_maintenance(command)

    def maintain(self, queue_name: str) -> None:
        """One maintenance pass of ``queue_name`` now: requeue the unacked messages of
        workers whose heartbeat timed out (and drop expired dead letters)."""
        self._forced.on = True
        try:
            self.do_qsize(queue_name)  # the cheapest command of Dramatiq's dispatch script
        finally:
            self._forced.on = False


class _Maintenance(dramatiq.Middleware):
    """A thread per worker process that runs the broker's maintenance on a timer."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if self.interval_s <= 0 or not isinstance(broker, _RedisBroker):
            return
        self._stop.clear()
        thread = threading.Thread(
            target=self._run, args=(broker, worker), name="effectq-maintenance", daemon=True
        )
        thread.start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._stop.set()

    def _run(self, broker: _RedisBroker, worker: dramatiq.Worker) -> None:
        while not self._stop.wait(self.interval_s):
            for queue_name in list(worker.consumers):  # each queue and its delay queue
                try:
                    broker.maintain(queue_name)
                except redis.RedisError as exc:
                    log.warning("maintenance of %s failed: %s", queue_name, exc)


def undecodable_id(data: bytes) -> str:
    """The record's message id for bytes that never became a message on RabbitMQ (the id
    is not in the bytes, so the record names their digest)."""
    return f"sha256:{hashlib.sha256(data).hexdigest()[:32]}"


class _RecordingEncoder(JSONEncoder):
    """For RabbitMQ, which rejects an undecodable delivery itself: record it first."""

    def decode(self, data: bytes) -> MessageData:
        try:
            fields = super().decode(data)
            # What ``Message.decode`` does with the fields next: JSON that is not a message
            # (a list, missing or unknown fields) is just as undecodable.
            dramatiq.Message(**{**fields, "args": tuple(fields["args"])})
        except Exception as exc:
            _record(undecodable_id(data), exc, len(data))
            raise
        return fields


def _amqp_url(cfg: Settings) -> str:
    """The broker URL (or ``;``-separated URLs) with the AMQP heartbeat set from the
    heartbeat timeout where a URL sets none: RabbitMQ requeues a connection's unacked
    messages once it misses heartbeats for that long (a SIGKILLed worker's at once: its
    socket closes)."""
    seconds = max(1, math.ceil(cfg.broker_heartbeat_timeout_ms / 1000))
    urls = []
    for url in cfg.broker_url.split(";"):
        query = urlsplit(url).query
        if not any(name == "heartbeat" for name, _ in parse_qsl(query)):
            url = f"{url}{'&' if query else '?'}heartbeat={seconds}"
        urls.append(url)
    return ";".join(urls)


def build_broker(cfg: Settings) -> dramatiq.Broker:
    if cfg.broker_url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        dramatiq.set_encoder(_RecordingEncoder())
        return RabbitmqBroker(url=_amqp_url(cfg), confirm_delivery=True)
    return _RedisBroker(
        url=cfg.broker_url,
        heartbeat_timeout=cfg.broker_heartbeat_timeout_ms,
        maintenance_chance=cfg.broker_maintenance_chance,
        maintenance_interval_ms=cfg.broker_maintenance_interval_ms,
    )
