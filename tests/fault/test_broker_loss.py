"""A broker that forgets (issue 37, item 2): a Redis broker restarted without persistence, a
failover that missed the write, a tail lost in a crash. A confirmed pending marker stands
for a message only while the broker still holds it: the next submission finds the message
gone and sends it again at once, and it runs once."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.stack import DRAINED, broker_client, broker_messages, wait_for
from workers import get_tool, runtime
from workers.dev.local import LocalStack
from workers.producer import Status, submit

ARGS = {"customer": "cus_lost", "amount": "7.00", "currency": "usd"}


def test_a_pending_answer_stands_while_the_broker_holds_the_message(live: LocalStack) -> None:
    first = submit("charge", scope="order-held", **ARGS)
    assert first.status is Status.ENQUEUED
    again = submit("charge", scope="order-held", **ARGS)
    assert again.status is Status.PENDING  # the message is in the queue: nothing sent twice
    assert broker_messages(live)["live"] == 1
    live.start_workers(1, 2)
    again.wait(30)
    wait_for(lambda: broker_messages(live) == DRAINED, what="drained")
    assert live.stats()["executions"] == {first.key: 1}


def test_a_message_the_broker_forgot_is_sent_again_by_the_next_submission(
    live: LocalStack,
) -> None:
    first = submit("charge", scope="order-lost", **ARGS)
    assert first.status is Status.ENQUEUED
    broker_client(live).flushdb()  # the broker forgot it: no worker will ever run it
    # The operator sees the key that holds only a marker (nothing else lists it).
    listed = subprocess.run(
        [sys.executable, "-m", "workers", "list", "--pending", "--json"],
        env=live.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["key"] == first.key and row["state"] == "ABSENT"
    assert row["message_id"] == first.message_id and row["confirmed"] is True
    second = submit("charge", scope="order-lost", **ARGS)
    assert second.status is Status.ENQUEUED and second.message_id != first.message_id
    assert broker_messages(live)["live"] == 1
    live.start_workers(1, 2)
    assert second.wait(30)["key"] == first.key
    wait_for(lambda: broker_messages(live) == DRAINED, what="drained")
    assert live.stats()["executions"] == {first.key: 1}
    assert runtime.ledger().has_pending(first.key) is False


def test_a_lost_retry_of_a_failed_effect_is_sent_again(live: LocalStack) -> None:
    """The marker outlives a FAILED attempt whose retry the broker then lost."""
    live.sandbox.configure(fail_rate=1.0)
    live.start_workers(1, 2)
    first = submit("charge", scope="order-lost-retry", **ARGS)
    key = get_tool("charge").derive("order-lost-retry", ARGS).key
    ledger = runtime.ledger()

    def failed() -> bool:
        record = ledger.get(key)
        return record is not None and record.state.value == "FAILED"

    wait_for(failed, what="first attempt failed")
    live.stop_processes()
    broker_client(live).flushdb()  # the retry waiting in the delay queue is gone
    live.sandbox.configure(fail_rate=0.0)
    second = submit("charge", scope="order-lost-retry", **ARGS)
    assert first.status is Status.ENQUEUED and second.status is Status.ENQUEUED
    live.start_workers(1, 2)
    second.wait(30)
    assert live.stats()["executions"] == {key: 1}
