"""Dramatiq's Redis broker with effectq's three changes: undecodable bytes are dead-lettered
with their reason instead of stranding a batch, each worker process runs the broker's
maintenance on a timer (see the package's docstring), and effect tools' acks are written
in batches.

Dramatiq acks each message in a round trip of its own, from the worker thread that ran it:
for a guarded message that is the third round trip after the claim and the commit. An
effect tool's message is settled by its commit, not by its ack — a message whose ack is
lost is redelivered, and its claim answers "duplicate" — so its ack need not be written
alone: a worker thread that acks while another thread is writing acks leaves its id to that
writer, which writes every id queued meanwhile in one write before it goes back to work
(no timer, no thread: an ack waits at most for the write in progress). While acks keep
coming, one writer may write several batches in a row (~8 at `-t 8` with a no-op body,
~3 ids each): its thread takes no message meanwhile. Other actors keep Dramatiq's ack, one
round trip each: their redelivery would run them again.

A batch whose write failed is kept and written with the next ack (its writer's own ack is
retried by Dramatiq every second until the broker is back); a SIGKILL loses the ids not
yet written, and their messages come back after the heartbeat timeout as duplicates."""

from __future__ import annotations

import logging
import threading
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.errors import ConnectionClosed, DecodeError

from dedupe.failpoints import failpoint
from dedupe.script import first_error, pipelined

from . import dispatch
from .dead_letters import DeadLetterSink, undecodable
from .keys import ack_set, queue_hash

__all__ = ["EffectqRedisBroker"]

log = logging.getLogger("effectq.broker")


class _Consumer(_RedisConsumer):
    broker: EffectqRedisBroker

    def __init__(
        self, broker: EffectqRedisBroker, queue_name: str, prefetch: int, timeout: int
    ) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]
        # Redis ids of effect tools' messages waiting for the write in progress, in order.
        self._acks: dict[str, None] = {}
        self._lock = threading.Lock()
        self._writing = False

    def ack(self, message: dramatiq.MessageProxy) -> None:
        if message.actor_name not in self.broker.batched_acks:
            super().ack(message)  # type: ignore[no-untyped-call]
            return
        with self._lock:
            self._acks[message.options["redis_message_id"]] = None
            self.queued_message_ids.discard(message.message_id)
            if self._writing:
                return  # the thread writing now writes this one next
            self._writing = True
        self._write_acks()

    def _write_acks(self) -> None:
        """Write the queued acks, batch after batch, until none is left."""
        while True:
            with self._lock:
                ids = list(self._acks)
                self._acks.clear()
                if not ids:
                    self._writing = False
                    return
            try:
                failpoint("before_ack")
                self._ack_many(ids)
            except BaseException as exc:
                with self._lock:
                    self._acks = dict.fromkeys(ids) | self._acks
                    self._writing = False
                if isinstance(exc, redis.ConnectionError):
                    raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
                raise

    def _ack_many(self, ids: list[str]) -> None:
        broker = self.broker
        commands = dispatch.calls(
            broker,
            "ack",
            ((self.queue_name, (i,)) for i in ids),
            maintenance=broker._should_do_maintenance("ack"),
        )
        pool = broker.client.connection_pool
        conn = pool.get_connection()
        try:
            replies = pipelined(conn, commands)
            dispatch.run_missing(broker, conn, commands, replies)
        finally:
            pool.release(conn)
        first_error(replies)

    def close(self) -> None:
        # Acks a failed write left behind, before the consumer goes (a restart, shutdown).
        with self._lock:
            left = bool(self._acks) and not self._writing
            if left:
                self._writing = True
        if left:
            try:
                self._write_acks()
            except (ConnectionClosed, redis.RedisError) as exc:
                log.warning("%d acks not written (redelivered as duplicates): %s",
                            len(self._acks), exc)  # fmt: skip
        super().close()

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
        self.batched_acks: set[str] = set()
        self.add_middleware(_Maintenance(maintenance_interval_ms / 1000))
        self.add_middleware(_BatchAcks())

    def batch_acks(self, actor_name: str) -> None:
        """Ack ``actor_name``'s messages in batches (the module's docstring): only for an
        actor whose redelivered message is a duplicate to its claim."""
        self.batched_acks.add(actor_name)

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> _Consumer:
        return _Consumer(self, queue_name, prefetch, timeout)

    def enqueue(
        self, message: dramatiq.Message[Any], *, delay: int | None = None
    ) -> dramatiq.Message[Any]:
        """Dramatiq's enqueue, but a message's first enqueue (a producer's: no Redis id
        yet, no retry, no delay) is stored under its own message id, so ``holds`` finds it
        with one HEXISTS. Retries and delayed messages keep Dramatiq's fresh ids: one id in
        two live places of one hash could be deleted by the other's ack."""
        if delay is not None or "redis_message_id" in message.options:
            return super().enqueue(message, delay=delay)
        if message.options.get("retries"):
            return super().enqueue(message, delay=delay)
        message = message.copy(options={"redis_message_id": message.message_id})
        self.emit_before("enqueue", message, delay)
        self.do_enqueue(message.queue_name, message.message_id, message.encode())
        self.emit_after("enqueue", message, delay)
        return message

    def holds(self, queue_name: str, message_id: str) -> bool:
        """Whether the broker still has the first delivery of ``message_id``, queued or
        fetched and not acked (``enqueue`` keys it by its message id). One round trip. A
        broker that forgot it (a restart without persistence, a failover that missed the
        write) answers False — and so does one that moved it to a retry, which lives
        under another id: the caller then sends a second message, which the claim makes a
        duplicate (never a second execution)."""
        return bool(self.client.hexists(queue_hash(queue_name, self.namespace), message_id))

    def durability_problem(self) -> str | None:
        """Why this broker may forget an accepted message (no AOF), or None. A server that
        will not say (INFO refused by an ACL) is reported as unknown."""
        try:
            info = self.client.info("persistence")
        except redis.RedisError:
            return "cannot read its persistence settings (INFO refused)"
        if int(info.get("aof_enabled", 0)) != 1:
            return "runs without AOF (appendonly no)"
        return None

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


class _BatchAcks(dramatiq.Middleware):
    """Batches the acks of each actor declared with ``redelivery_is_duplicate`` (an effect
    tool: ``EffectMiddleware`` names the option), whoever declares it."""

    def after_declare_actor(self, broker: dramatiq.Broker, actor: dramatiq.Actor[..., Any]) -> None:
        duplicate = actor.options.get("redelivery_is_duplicate")
        if duplicate and isinstance(broker, EffectqRedisBroker):
            broker.batch_acks(actor.actor_name)


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
