"""Dramatiq's Redis broker with effectq's two changes: undecodable bytes are dead-lettered
with their reason instead of stranding a batch, and each worker process runs the broker's
maintenance on a timer (see the package's docstring)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.errors import DecodeError

from .dead_letters import DeadLetterSink, undecodable
from .keys import ack_set, queue_hash

__all__ = ["EffectqRedisBroker"]

log = logging.getLogger("effectq.broker")


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
        broker: EffectqRedisBroker = self.broker
        acks = ack_set(self.queue_name, broker.broker_id, broker.namespace)
        bodies = queue_hash(self.queue_name, broker.namespace)
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
        undecodable(broker.dead_letter, message_id, error, len(data))


class EffectqRedisBroker(RedisBroker):
    def __init__(
        self, *, maintenance_interval_ms: int, dead_letter: DeadLetterSink, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        self.dead_letter = dead_letter
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
        if self.interval_s <= 0 or not isinstance(broker, EffectqRedisBroker):
            return
        self._stop.clear()
        thread = threading.Thread(
            target=self._run, args=(broker, worker), name="effectq-maintenance", daemon=True
        )
        thread.start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._stop.set()

    def _run(self, broker: EffectqRedisBroker, worker: dramatiq.Worker) -> None:
        while not self._stop.wait(self.interval_s):
            for queue_name in list(worker.consumers):  # each queue and its delay queue
                try:
                    broker.maintain(queue_name)
                except redis.RedisError as exc:
                    log.warning("maintenance of %s failed: %s", queue_name, exc)
