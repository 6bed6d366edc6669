"""Campaign fan-out on RabbitMQ (workers/fanout.py: one AMQP transaction per batch) and the
publisher confirms of single enqueues: what RabbitMQ accepted is delivered, and what it
could not route is sent again rather than dropped."""

from __future__ import annotations

import pika  # type: ignore[import-untyped]
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from dedupe import State
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import runtime, submit
from workers.campaigns import campaign_status, submit_campaign
from workers.dev.local import LocalStack

TEMPLATE = {"subject": "Spring sale", "body": "Hello"}


def test_campaign_fans_out_and_every_recipient_executes_once(fenceless: LocalStack) -> None:
    people = [f"fan{i}@example.com" for i in range(1100)]  # two batches
    report = submit_campaign("spring-rabbit", "send_email", people, TEMPLATE)
    assert report.sent == 1100
    assert broker_messages(fenceless) == {**DRAINED, "live": 1100}
    fenceless.start_workers(processes=2, threads=8)
    wait_for(
        lambda: campaign_status("spring-rabbit")["counts"]["done"] == 1100,
        what="every recipient done",
        timeout=120,
    )
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="queue drained", timeout=60)
    stats = fenceless.stats()
    assert stats["total"] == 1100 and set(stats["executions"].values()) == {1}
    again = submit_campaign("spring-rabbit", "send_email", people, TEMPLATE)
    assert again.sent == 0 and again.skipped == {"done": 1100}


def _delete_queue(stack: LocalStack) -> None:
    """Delete effectq behind the producer's back: its broker still takes it as declared."""
    broker = runtime.broker()
    assert isinstance(broker, RabbitmqBroker)
    broker.declare_queue("effectq", ensure=True)
    with pika.BlockingConnection(pika.URLParameters(stack.broker_url)) as connection:
        connection.channel().queue_delete("effectq")


def test_an_enqueue_into_a_deleted_queue_is_confirmed_unroutable_and_resent(
    fenceless: LocalStack,
) -> None:
    _delete_queue(fenceless)
    # The publisher confirm reports it unroutable; Dramatiq declares the queue again and
    # resends (unconfirmed, it would vanish without a trace).
    handle = submit("charge", scope="order-gone", customer="c1", amount="1.00", currency="usd")
    assert broker_messages(fenceless) == {**DRAINED, "live": 1}
    fenceless.start_workers(processes=1, threads=2)
    [record] = wait_states(runtime.ledger(), [handle.key], timeout=30).values()
    assert record is not None and record.state is State.DONE
    assert fenceless.stats()["executions"] == {handle.key: 1}


def test_a_fan_out_into_a_deleted_queue_is_returned_unroutable_and_resent(
    fenceless: LocalStack,
) -> None:
    _delete_queue(fenceless)
    # The first batch's transaction commits; its messages come back unroutable and go out
    # again once the queue is declared again. The second batch finds the queue.
    people = [f"gone{i}@example.com" for i in range(1200)]
    assert submit_campaign("gone", "send_email", people, TEMPLATE).sent == 1200
    assert broker_messages(fenceless) == {**DRAINED, "live": 1200}
