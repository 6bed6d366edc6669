"""The queue depths the idle-pool alert reads, on RabbitMQ too: messages waiting on a real
vhost with no worker running show in ``effectq_queue_messages`` (ready and delayed)."""

from __future__ import annotations

from tests.support.stack import wait_for
from workers import runtime, submit
from workers.dev.local import LocalStack
from workers.metrics.collector import LedgerCollector


def _depths(stack: LocalStack, queue: str) -> dict[str, float]:
    collector = LedgerCollector(runtime.ledger, broker_url=stack.broker_url, queues=[queue])
    [family] = [f for f in collector.collect() if f.name == "effectq_queue_messages"]
    return {s.labels["state"]: s.value for s in family.samples}


def test_waiting_and_delayed_messages_show_as_queue_depth(live: LocalStack) -> None:
    queue = runtime.current().settings.queue
    for i in range(3):
        submit("send_email", scope=f"depth-{i}", recipient=f"d{i}@example.com")
    tool = runtime.current().broker.get_actor("send_email")
    tool.send_with_options(args=({"v": 1},), delay=600_000)  # a retry waiting its time
    wait_for(
        lambda: _depths(live, queue) == {"queued": 3.0, "delayed": 1.0, "dead": 0.0},
        what="3 waiting and 1 delayed message counted",
        timeout=15,
    )


def test_an_unreachable_broker_drops_only_the_queue_series() -> None:
    collector = LedgerCollector(
        runtime.ledger, broker_url="amqp://guest:guest@127.0.0.1:1/%2F", queues=["effectq"]
    )
    names = {family.name for family in collector.collect()}
    assert "effectq_queue_messages" not in names and "effectq_ledger_up" in names
