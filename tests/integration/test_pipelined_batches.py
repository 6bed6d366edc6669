"""Batches written in one go and their replies read in order (``dedupe.script.pipelined``):
the ledger's submit and pending batches and the fan-out's enqueue batches, on a real
redis-server (both binaries). A batch never leaves a reply unread on a connection someone
else will use, goes again where its calls did not run (a lost script or library), and a
fan-out batch whose replies were lost is queued again under fresh Redis ids, and a fan-out
backs off between its tries long enough for a restarting broker."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from dedupe import Ledger, SubmitStatus
from dedupe.script import pipelined
from tests.support.ledgers import charge
from tests.support.proxy import ReplyLosingProxy, reply_losing_proxy
from workers.broker.fanout import enqueue_many, send_many
from workers.dev.redis_server import RedisServer
from workers.producer import finish_confirm, start_confirm

TIMEOUT_S = 0.3
QUEUE = "fan"


def _message(i: int) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=QUEUE, actor_name="a", args=(i,), kwargs={}, options={})


def _queued(client: redis.Redis) -> dict[str, dict[str, Any]]:
    """The broker's queue: each queued Redis id and the body stored under it."""
    ids = [i.decode() for i in client.lrange(f"dramatiq:{QUEUE}", 0, -1)]  # type: ignore[union-attr]
    bodies = client.hmget(f"dramatiq:{QUEUE}.msgs", ids) if ids else []
    return {i: json.loads(body) for i, body in zip(ids, bodies, strict=True)}  # type: ignore[arg-type]


class _Recorder(dramatiq.Middleware):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def before_enqueue(
        self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int
    ) -> None:
        self.seen.append(("before", message.message_id))

    def after_enqueue(
        self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int
    ) -> None:
        self.seen.append(("after", message.message_id))


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[ReplyLosingProxy]:
    with reply_losing_proxy(redis_server.port) as proxy:
        yield proxy


def test_an_error_reply_in_a_batch_takes_its_place_and_the_connection_stays_in_step(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    conn = client.connection_pool.make_connection()
    replies = pipelined(conn, [["SET", "a", "text"], ["INCR", "a"], ["GET", "a"]])
    assert replies[0] == b"OK" and replies[2] == b"text"  # raw replies: no callbacks
    assert isinstance(replies[1], redis.ResponseError)
    assert pipelined(conn, [["ECHO", "next"]]) == [b"next"]  # its own reply, not a late one


def test_a_batch_cut_between_send_and_replies_closes_its_connection(
    proxy: ReplyLosingProxy,
) -> None:
    conn = redis.Redis(port=proxy.port, socket_timeout=TIMEOUT_S).connection_pool.make_connection()
    assert pipelined(conn, [["SET", "b", "1"]]) == [b"OK"]
    proxy.lose_replies(on_new_connections=False)
    with pytest.raises(redis.TimeoutError):
        pipelined(conn, [["INCR", "b"], ["INCR", "b"]])
    assert conn._sock is None  # the lost replies can never answer the next batch
    assert pipelined(conn, [["GET", "b"]]) == [b"3"]  # ran once each, then a new connection


def test_a_ledger_batch_after_the_server_lost_its_scripts_runs_each_call(
    redis_server: RedisServer,
) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace=f"pb{uuid.uuid4().hex[:8]}")
    assert ledger.submit_many([(charge(), "warm-up")], pending_s=60)
    admin = redis_server.client()
    admin.script_flush()  # a restart without persistence, or an operator
    if int(redis_server.version.split(".", 1)[0]) >= 7:
        admin.function_flush()
    effects = [charge() for _ in range(5)]
    first = ledger.submit_many([(e, f"m-{i}") for i, e in enumerate(effects)], pending_s=60)
    assert [a.status for a in first] == [SubmitStatus.ENQUEUE] * 5
    ledger.confirm_pending([(e, f"m-{i}") for i, e in enumerate(effects)], 120)
    again = ledger.submit_many([(e, f"n-{i}") for i, e in enumerate(effects)], pending_s=60)
    assert [a.status for a in again] == [SubmitStatus.PENDING] * 5  # each first one ran
    pending_ms = [admin.pttl(ledger._keys(e.key)[3]) for e in effects]
    assert all(60_000 < ms <= 120_000 for ms in pending_ms), pending_ms  # the confirms ran


def test_a_fan_out_after_the_broker_lost_its_script_queues_each_message_once(
    redis_server: RedisServer,
) -> None:
    broker = RedisBroker(url=redis_server.url)
    enqueue_many(broker, [_message(-1)])  # the script loaded
    broker.client.flushdb()
    broker.client.script_flush()
    enqueue_many(broker, [_message(i) for i in range(2500)])  # three batches
    queued = _queued(broker.client)
    assert sorted(body["args"][0] for body in queued.values()) == list(range(2500))
    assert all(body["options"]["redis_message_id"] == i for i, body in queued.items())


def test_a_fan_out_batch_whose_replies_were_lost_is_queued_again_under_the_same_ids(
    redis_server: RedisServer, proxy: ReplyLosingProxy
) -> None:
    broker = RedisBroker(url=f"{proxy.url}?socket_timeout={TIMEOUT_S}")
    enqueue_many(broker, [_message(-1)])  # the pool's connection open, the script loaded
    broker.client.delete(f"dramatiq:{QUEUE}", f"dramatiq:{QUEUE}.msgs")
    proxy.lose_replies(on_new_connections=False)  # the retry's new connection is heard
    messages = [_message(i) for i in range(3)]
    enqueue_many(broker, messages)
    client = redis_server.client()
    # Both tries landed under each message's own id (a producer can ask the broker whether
    # it still holds a message: EffectqRedisBroker.holds): one body each, its id listed
    # twice; the second fetch of an id finds no body left and Dramatiq skips it.
    ids = sorted(i.decode() for i in client.lrange(f"dramatiq:{QUEUE}", 0, -1))  # type: ignore[union-attr]
    assert ids == sorted(m.message_id for m in messages for _ in range(2))
    queued = _queued(client)
    assert sorted(body["args"][0] for body in queued.values()) == [0, 1, 2]
    assert all(body["options"]["redis_message_id"] == i for i, body in queued.items())


def test_a_fan_out_waits_out_a_broker_restart_between_its_tries(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = RedisBroker(url=redis_server.url)
    enqueue_many(broker, [_message(-1)])  # the script loaded, then the server goes away
    redis_server.kill()
    pool = broker.client.connection_pool
    tries: list[int] = []
    connect = pool.get_connection

    def counted() -> Any:
        tries.append(1)
        return connect()

    monkeypatch.setattr(pool, "get_connection", counted)
    done: list[BaseException | None] = []

    def fan_out() -> None:
        try:
            enqueue_many(broker, [_message(i) for i in range(50)])
            done.append(None)
        except BaseException as exc:
            done.append(exc)

    sender = threading.Thread(target=fan_out)
    sender.start()
    deadline = time.monotonic() + 10
    while len(tries) < 2 and time.monotonic() < deadline:  # two tries refused, four left
        time.sleep(0.001)
    redis_server.start()  # from its AOF, same port: within the backoff of the tries left
    sender.join(30)
    assert done == [None]
    args = sorted(body["args"][0] for body in _queued(broker.client).values())
    assert args == [-1, *range(50)]  # each message once


def test_enqueue_hooks_run_once_per_message_when_a_middleware_has_them(
    redis_server: RedisServer,
) -> None:
    recorder = _Recorder()
    broker = RedisBroker(url=redis_server.url, middleware=[recorder])
    messages = [_message(i) for i in range(3)]
    enqueue_many(broker, messages)
    ids = [m.message_id for m in messages]
    assert recorder.seen == [("before", i) for i in ids] + [("after", i) for i in ids]


def test_an_abandoned_fan_out_batch_leaves_no_reply_for_the_next_command(
    redis_server: RedisServer,
) -> None:
    broker = RedisBroker(url=redis_server.url)
    broker.client.set("marker", "mine")
    sending = send_many(broker, [_message(i) for i in range(200)])
    sending.abandon()  # the caller failed between the send and the replies
    pool = broker.client.connection_pool
    assert not pool._in_use_connections  # type: ignore[attr-defined]
    assert broker.client.get("marker") == b"mine"  # not the reply of an enqueue


def test_an_abandoned_submit_batch_leaves_no_reply_for_the_thread_s_next_ledger_call(
    redis_server: RedisServer,
) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace=f"pb{uuid.uuid4().hex[:8]}")
    started = ledger.start_submit([(charge(), f"m-{i}") for i in range(50)], pending_s=60)
    started.abandon()  # the producer failed while building the batch's messages
    assert ledger._script.commands([["ECHO", "next"]]) == ["next"]  # its own reply
    fresh = charge()
    [answer] = ledger.start_submit([(fresh, "m-fresh")], pending_s=60).answers()
    assert answer.status is SubmitStatus.ENQUEUE and answer.key == fresh.key


def test_a_started_submit_batch_answers_each_call_in_order(redis_server: RedisServer) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace=f"pb{uuid.uuid4().hex[:8]}")
    effects = [charge() for _ in range(6)]
    ledger.submit_many([(e, "earlier") for e in effects[::2]], pending_s=60)
    ledger.confirm_pending([(e, "earlier") for e in effects[::2]], 60)  # the broker took them
    started = ledger.start_submit([(e, f"m-{i}") for i, e in enumerate(effects)], pending_s=60)
    answers = started.answers()
    assert [a.key for a in answers] == [e.key for e in effects]
    assert [a.status for a in answers] == [SubmitStatus.PENDING, SubmitStatus.ENQUEUE] * 3


def test_a_started_confirm_batch_leaves_the_thread_s_connection_to_its_next_calls(
    redis_server: RedisServer,
) -> None:
    # A campaign confirms batch i while it submits batch i+2: on a connection of its own.
    ledger = Ledger.from_url(redis_server.url, namespace=f"pb{uuid.uuid4().hex[:8]}")
    sent, later = [charge() for _ in range(40)], [charge() for _ in range(40)]
    ledger.submit_many([(e, f"m-{i}") for i, e in enumerate(sent)], pending_s=60)
    confirming = ledger.start_confirm([(e, f"m-{i}") for i, e in enumerate(sent)], 600)
    answers = ledger.submit_many([(e, f"n-{i}") for i, e in enumerate(later)], pending_s=60)
    assert [a.status for a in answers] == [SubmitStatus.ENQUEUE] * 40
    assert [a.key for a in answers] == [e.key for e in later]  # their own replies, in order
    confirming.wait()
    pool = ledger.client.connection_pool
    assert not pool._in_use_connections  # type: ignore[attr-defined]
    again = ledger.submit_many([(e, f"o-{i}") for i, e in enumerate(sent)], pending_s=60)
    assert [a.status for a in again] == [SubmitStatus.PENDING] * 40  # every one confirmed


def test_a_confirm_batch_whose_replies_were_lost_is_logged_and_its_connection_closed(
    proxy: ReplyLosingProxy, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"{proxy.url}?socket_timeout={TIMEOUT_S}"
    ledger = Ledger.from_url(url, namespace=f"pb{uuid.uuid4().hex[:8]}")
    effects = [charge() for _ in range(20)]
    pairs = [(e, f"m-{i}") for i, e in enumerate(effects)]
    ledger.submit_many(pairs, pending_s=60)
    proxy.lose_replies(on_new_connections=False)  # the pool's connection is one of them
    confirming = start_confirm(ledger, pairs, 600)  # the producer's: never raises
    with caplog.at_level(logging.WARNING, logger="workers.producer"):
        finish_confirm(confirming, len(pairs))
    assert "pending markers of 20 enqueued messages not confirmed" in caplog.text
    pool = ledger.client.connection_pool
    assert not pool._in_use_connections  # type: ignore[attr-defined]
    proxy.hear_replies()
    assert ledger._script.commands([["ECHO", "next"]]) == ["next"]  # no late reply read
    # The confirms ran (only their replies were lost): the markers answer "pending".
    again = ledger.submit_many([(e, f"n-{i}") for i, e in enumerate(effects)], pending_s=60)
    assert {a.status for a in again} == {SubmitStatus.PENDING}


def test_an_abandoned_confirm_batch_closes_its_connection(redis_server: RedisServer) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace=f"pb{uuid.uuid4().hex[:8]}")
    effects = [charge() for _ in range(30)]
    ledger.submit_many([(e, f"m-{i}") for i, e in enumerate(effects)], pending_s=60)
    confirming = ledger.start_confirm([(e, f"m-{i}") for i, e in enumerate(effects)], 600)
    confirming.abandon()  # the fan-out failed before it read them
    pool = ledger.client.connection_pool
    assert not pool._in_use_connections  # type: ignore[attr-defined]
    assert all(c._sock is None for c in pool._available_connections)  # type: ignore[attr-defined]
