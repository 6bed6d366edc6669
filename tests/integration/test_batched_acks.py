"""Effect tools' acks written in batches (``workers.broker.redis``), on a real redis-server
(both binaries): a worker thread that acks while another writes leaves its id to that
writer, which writes everything queued meanwhile in one write; other actors' acks go out
one by one as Dramatiq's do; a write that failed keeps its ids for the next one; a lost
script cache does not lose an ack. The end-to-end crash (a worker SIGKILLed with acks
queued) is ``tests/fault/test_worker_crashes.py``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.errors import ConnectionClosed

from workers.broker.keys import ack_set, queue_hash
from workers.broker.redis import EffectqRedisBroker, _Consumer
from workers.dev.redis_server import RedisServer

QUEUE = "acks"
TOOL, PLAIN = "a_tool", "a_plain_actor"
JOIN_S = 10.0


def _no_dead_letters(**_: Any) -> None:
    raise AssertionError("nothing here is dead-lettered")


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[EffectqRedisBroker]:
    broker = EffectqRedisBroker(
        url=f"{redis_server.url}?socket_timeout=2",
        maintenance_interval_ms=0,
        dead_letter=_no_dead_letters,
    )
    broker.batch_acks(TOOL)
    yield broker
    broker.close()


def _fetched(broker: EffectqRedisBroker, actors: list[str]) -> tuple[_Consumer, list[Any]]:
    """Messages of ``actors`` enqueued, then fetched: each in this worker's ack set."""
    for i, actor in enumerate(actors):
        broker.enqueue(dramatiq.Message(QUEUE, actor, (i,), {}, {}))
    consumer = broker.consume(QUEUE, prefetch=len(actors), timeout=100)
    messages = [next(consumer) for _ in actors]
    assert all(m is not None for m in messages)
    assert _unacked(broker) == len(actors)
    return consumer, messages


def _unacked(broker: EffectqRedisBroker) -> int:
    return int(broker.client.scard(ack_set(QUEUE, broker.broker_id, broker.namespace)))


def _bodies(broker: EffectqRedisBroker) -> int:
    return int(broker.client.hlen(queue_hash(QUEUE, broker.namespace)))


class _HeldWrites:
    """Records each batch written; the first write waits until ``release``."""

    def __init__(self, consumer: _Consumer) -> None:
        self.batches: list[list[str]] = []
        self.entered, self._go = threading.Event(), threading.Event()
        self._write = consumer._ack_many
        consumer._ack_many = self  # type: ignore[method-assign]

    def __call__(self, ids: list[str]) -> None:
        if not self.batches:
            self.entered.set()
            assert self._go.wait(JOIN_S)
        self.batches.append(list(ids))
        self._write(ids)

    def release(self) -> None:
        self._go.set()


def _in_threads(fn: Any, items: list[Any]) -> list[threading.Thread]:
    threads = [threading.Thread(target=fn, args=(item,)) for item in items]
    for t in threads:
        t.start()
    return threads


def _joined(threads: list[threading.Thread]) -> bool:
    for t in threads:
        t.join(JOIN_S)
    return not any(t.is_alive() for t in threads)


def test_acks_queued_during_a_write_go_out_together_in_the_next_write(
    broker: EffectqRedisBroker,
) -> None:
    consumer, messages = _fetched(broker, [TOOL] * 10)
    writes = _HeldWrites(consumer)
    [writer] = _in_threads(consumer.ack, messages[:1])
    assert writes.entered.wait(JOIN_S)
    # Nine threads ack while the first write is held: each returns without writing.
    assert _joined(_in_threads(consumer.ack, messages[1:]))
    assert _unacked(broker) == 10
    writes.release()
    assert _joined([writer])
    ids = [m.options["redis_message_id"] for m in messages]
    assert writes.batches == [ids[:1], ids[1:]]  # the writer wrote the nine in one write
    assert _unacked(broker) == 0 and _bodies(broker) == 0
    assert consumer.outstanding_message_count == 0


def test_other_actors_are_acked_alone_at_once_even_while_a_batch_is_written(
    broker: EffectqRedisBroker,
) -> None:
    consumer, [tool_message, plain_message] = _fetched(broker, [TOOL, PLAIN])
    writes = _HeldWrites(consumer)
    [writer] = _in_threads(consumer.ack, [tool_message])
    assert writes.entered.wait(JOIN_S)
    consumer.ack(plain_message)  # Dramatiq's own ack: its redelivery would run it again
    assert _unacked(broker) == 1 and _bodies(broker) == 1  # only the held tool message left
    writes.release()
    assert _joined([writer])
    assert _unacked(broker) == 0 and _bodies(broker) == 0
    assert writes.batches == [[tool_message.options["redis_message_id"]]]


def test_a_write_that_failed_keeps_its_acks_for_the_next_write(
    broker: EffectqRedisBroker, redis_server: RedisServer
) -> None:
    consumer, messages = _fetched(broker, [TOOL] * 3)
    redis_server.kill()
    with pytest.raises(ConnectionClosed):
        consumer.ack(messages[0])
    with pytest.raises(ConnectionClosed):
        consumer.ack(messages[1])
    redis_server.start()  # from its AOF: the ack set and the bodies are back
    assert _unacked(broker) == 3
    consumer.ack(messages[2])  # writes the two kept acks with its own
    assert _unacked(broker) == 0 and _bodies(broker) == 0


def test_acks_a_failed_write_left_are_written_when_the_consumer_closes(
    broker: EffectqRedisBroker, redis_server: RedisServer
) -> None:
    consumer, [message] = _fetched(broker, [TOOL])
    redis_server.kill()
    with pytest.raises(ConnectionClosed):
        consumer.ack(message)
    redis_server.start()
    consumer.close()  # a consumer restart, or the worker's shutdown
    assert _unacked(broker) == 0 and _bodies(broker) == 0


def test_a_batch_after_the_server_lost_its_scripts_acks_every_message(
    broker: EffectqRedisBroker,
) -> None:
    consumer, messages = _fetched(broker, [TOOL] * 4)
    writes = _HeldWrites(consumer)
    [writer] = _in_threads(consumer.ack, messages[:1])
    assert writes.entered.wait(JOIN_S)
    assert _joined(_in_threads(consumer.ack, messages[1:]))
    broker.client.script_flush()  # a restart without persistence, or an operator
    writes.release()
    assert _joined([writer])
    assert len(writes.batches) == 2
    assert _unacked(broker) == 0 and _bodies(broker) == 0
