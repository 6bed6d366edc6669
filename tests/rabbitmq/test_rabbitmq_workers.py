"""The worker path end to end with the broker on RabbitMQ: duplicate submissions and forced
redeliveries, dead-lettering (reason in effectq's stream, message in ``effectq.XQ``),
retries later through ``effectq.DQ``, and bytes that never decode. Every assertion about
execution is made on the sandbox provider's own count.

The end-to-end duplicate test (2,000 calls, 30 % repeats, forced redeliveries, 2 worker
processes) and the dead-letter tests of tests/integration and tests/fuzz run here
unchanged, on this package's stack.
"""

from __future__ import annotations

import pika  # type: ignore[import-untyped]

from tests.fuzz import test_hostile_messages as fuzz
from tests.integration import test_workers as redis_suite
from tests.support.stack import DRAINED, broker_messages, wait_for
from workers import Envelope, get_tool, runtime, submit
from workers.broker import UNDECODABLE as UNDECODABLE_TOOL
from workers.broker import undecodable_id
from workers.dev.local import LocalStack

test_duplicate_submissions_and_redeliveries_execute_each_effect_once = (
    redis_suite.test_duplicate_submissions_and_redeliveries_execute_each_effect_once
)
test_changed_bound_field_under_the_same_key_is_dead_lettered_unexecuted = (
    redis_suite.test_changed_bound_field_under_the_same_key_is_dead_lettered_unexecuted
)
test_malformed_messages_are_dead_lettered_with_a_reason_and_never_executed = (
    redis_suite.test_malformed_messages_are_dead_lettered_with_a_reason_and_never_executed
)
test_a_message_older_than_the_provider_window_never_executes = (
    redis_suite.test_a_message_older_than_the_provider_window_never_executes
)
test_hostile_messages_are_dead_lettered_with_a_reason_and_never_executed = (
    fuzz.test_hostile_messages_are_dead_lettered_with_a_reason_and_never_executed
)


def test_a_redelivery_of_an_in_flight_effect_waits_in_the_delay_queue(
    fenceless: LocalStack,
) -> None:
    fenceless.sandbox.configure(latency_ms=2500)
    fenceless.start_workers(processes=1, threads=2)
    handle = submit("set_value", scope="op-dq", target="acct-dq", value=7)
    ledger = runtime.ledger()
    wait_for(lambda: ledger.get(handle.key) is not None, what="claimed")
    effect = get_tool("set_value").derive("op-dq", {"target": "acct-dq", "value": 7})
    get_tool("set_value").actor.send(Envelope.of(effect).model_dump())
    # in_flight → RetryLater: Dramatiq moves it to effectq.DQ with its eta, the worker
    # holds it there unacked, then sends it back to effectq once due.
    wait_for(lambda: broker_messages(fenceless)["delayed"] == 1, what="retry in effectq.DQ")
    assert handle.wait(30)["key"] == handle.key
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="redelivery acked", timeout=30)
    assert fenceless.stats()["executions"] == {handle.key: 1}
    assert ledger.counts()[("dup_claim", "set_value")] == 1


# Bytes below the envelope: Dramatiq's consumer rejects them to effectq.XQ; effectq's
# encoder records each first. The last two are JSON, but not a message.
UNDECODABLE = {
    **fuzz.UNDECODABLE,
    "a JSON list": b"[1, 2]",
    "a JSON object without a message's fields": b'{"queue_name": "effectq"}',
}


def test_undecodable_deliveries_are_dead_lettered_with_a_record_and_the_worker_goes_on(
    live: LocalStack,
) -> None:
    pool = live.start_workers(processes=1, threads=2)
    live.wait_for_workers(1)
    ledger = runtime.ledger()
    with pika.BlockingConnection(pika.URLParameters(live.broker_url)) as connection:
        channel = connection.channel()
        for data in UNDECODABLE.values():
            channel.basic_publish("", "effectq", data, pika.BasicProperties(delivery_mode=2))
    ok = submit("send_email", scope="after-bytes", recipient="ok@example.com")
    assert ok.wait(60)["key"] == ok.key

    def undecodable() -> dict[str, str]:
        dead = ledger.dead_letters()
        return {d["message_id"]: d["reason"] for d in dead if d["tool"] == UNDECODABLE_TOOL}

    wait_for(lambda: len(undecodable()) == len(UNDECODABLE), timeout=30, what="5 records")
    records = undecodable()
    assert set(records) == {undecodable_id(data) for data in UNDECODABLE.values()}
    for reason in records.values():
        assert reason.startswith("undecodable message (") and "never executed" in reason
        assert "\\xff" not in reason and "not json" not in reason  # the bytes are not quoted
    wait_for(
        lambda: broker_messages(live) == {**DRAINED, "dead": len(UNDECODABLE)},
        what="every undecodable delivery in effectq.XQ",
    )
    assert live.stats()["total"] == 1
    assert pool.poll() is None
    assert "exited with" not in live.log("workers.log")
