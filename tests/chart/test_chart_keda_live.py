"""A pool scaled to zero wakes for a retry: one due delayed Dramatiq message in a real
Redis broker (enqueued through effectq's own broker, no worker running) activates the
rendered ScaledObject, evaluated the way KEDA's redis scaler reads it (LLEN of each
trigger's list against its activation threshold, ceil(length / target) replicas)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis

from tests.chart._chart import Render, worker_name
from workers.dev.redis_server import RedisServer, default_redis_binary
from workers.runtime import Runtime
from workers.settings import Settings


@pytest.fixture
def broker_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(default_redis_binary(), tmp_path, aof=False).start()
    try:
        yield server
    finally:
        server.stop()


def _activity(trigger: dict[str, Any], client: redis.Redis) -> tuple[bool, int]:
    """(active, replicas wanted) for one rendered redis trigger, as KEDA computes them."""
    meta = trigger["metadata"]
    length = int(client.llen(meta["listName"]))
    return length > int(meta["activationListLength"]), math.ceil(length / int(meta["listLength"]))


def test_a_pool_at_zero_with_one_due_delayed_message_is_activated(
    render: Render, broker_redis: RedisServer
) -> None:
    broker = Runtime(Settings(broker_url=broker_redis.url)).broker

    @dramatiq.actor(broker=broker, queue_name="effectq", actor_name="charge")
    def charge() -> None:
        raise AssertionError("no worker runs in this test")

    # What a RetryLater does: Dramatiq re-enqueues the message with a delay.
    message = charge.send_with_options(delay=50)
    broker.close()
    deadline = time.monotonic() + 5
    while time.time() * 1000 < message.options["eta"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert time.time() * 1000 >= message.options["eta"], "the message is due"

    values = {
        "pools": [
            {
                "name": "default",
                "queues": ["effectq"],
                "autoscaling": {"kind": "keda", "minReplicas": 0},
            }
        ],
        "keda": {"redis": {"address": f"127.0.0.1:{broker_redis.port}", "databaseIndex": 0}},
    }
    scaled = render(values).one("ScaledObject", worker_name("default"))
    assert scaled["spec"]["minReplicaCount"] == 0
    client = redis.Redis(host="127.0.0.1", port=broker_redis.port, db=0)
    try:
        activity = {t["name"]: _activity(t, client) for t in scaled["spec"]["triggers"]}
        stored = json.loads(
            client.hget("dramatiq:effectq.DQ.msgs", message.options["redis_message_id"])
        )
    finally:
        client.close()
    assert stored["options"]["eta"] == message.options["eta"]
    # The ready list is empty: a ready-only ScaledObject would have left the pool at zero.
    assert activity["effectq"] == (False, 0)
    # The delay queue's trigger activates it, with one replica: enough to move the retry back.
    assert activity["effectq-delayed"] == (True, 1)
