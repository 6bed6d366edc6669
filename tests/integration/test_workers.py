"""The worker path end to end: real `dramatiq` worker processes (through `effectq worker`),
the real ledger and broker on redis-server, the real sandbox provider over HTTP. Every
assertion about execution is made on the provider's own count."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import dramatiq
import pytest

from dedupe import State
from tests.support.stack import broker_messages, wait_for, wait_states
from workers import Envelope, Status, get_tool, runtime, submit
from workers.local import LocalStack


def _calls(n: int) -> list[tuple[str, str, dict[str, Any]]]:
    out: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(n):
        if i % 2:
            out.append(("send_email", f"evt-{i}", {"recipient": f"u{i}@example.com"}))
        else:
            out.append(("charge", f"order-{i}", {"customer": f"c{i}", "amount": "5.00",
                                                 "currency": "eur"}))  # fmt: skip
    return out


def test_duplicate_submissions_and_redeliveries_execute_each_effect_once(
    live: LocalStack,
) -> None:
    # The provider's own idempotency is off: only effectq stands between a retry and a
    # second execution.
    live.sandbox.configure(provider_idempotency=False)
    rng = random.Random(2000)
    unique = _calls(1400)
    submissions = unique + [rng.choice(unique) for _ in range(600)]  # 2,000, 30 % repeats
    rng.shuffle(submissions)
    live.start_workers(processes=2, threads=8)
    statuses: Counter[str] = Counter()
    keys: set[str] = set()
    forced = 0
    for n, (tool, scope, args) in enumerate(submissions):
        handle = submit(tool, scope=scope, **args)
        statuses[handle.status.value] += 1
        keys.add(handle.key)
        if n % 10 == 0:
            # A forced redelivery: the same message body enqueued again behind the ledger's
            # back, as a broker does after a worker's heartbeat is lost.
            effect = get_tool(tool).derive(scope, args)
            get_tool(tool).actor.send(Envelope.of(effect).model_dump())
            forced += 1
    assert statuses["enqueued"] == len(keys) == 1400
    assert statuses["enqueued"] + statuses["pending"] + statuses["done"] == 2000
    ledger = runtime.ledger()
    wait_states(ledger, keys, timeout=120)
    drained = {"live": 0, "delayed": 0, "dead": 0}
    wait_for(lambda: broker_messages(live) == drained, what="queue drained", timeout=60)
    stats = live.stats()
    assert stats["total"] == 1400
    assert set(stats["executions"]) == keys
    assert set(stats["executions"].values()) == {1}
    counts = ledger.counts()
    suppressed_submit = sum(v for (k, _), v in counts.items() if k == "dup_submit")
    suppressed_claim = sum(v for (k, _), v in counts.items() if k == "dup_claim")
    assert suppressed_submit == 600
    # Each forced redelivery (or its original, whichever came second) reached a worker and
    # was suppressed there, at once or after retrying while the first was in flight.
    assert suppressed_claim == forced


def test_changed_bound_field_under_the_same_key_is_dead_lettered_unexecuted(
    live: LocalStack,
) -> None:
    live.start_workers(processes=1, threads=2)
    handle = submit("charge", scope="order-77", customer="c1", amount="10.00", currency="usd")
    handle.wait(30)
    refused = submit("charge", scope="order-77", customer="c1", amount="99.00", currency="usd")
    assert refused.status is Status.CONFLICT  # refused at submit, not enqueued
    # The same change arriving straight on the queue is dead-lettered by the worker.
    tool = get_tool("charge")
    changed = tool.derive("order-77", {"customer": "c1", "amount": "99.00", "currency": "usd"})
    assert changed.key == handle.key
    tool.actor.send(Envelope.of(changed).model_dump())
    ledger = runtime.ledger()
    wait_for(lambda: ledger.dead_letters(), what="dead-letter record")
    [dead] = ledger.dead_letters()
    assert dead["key"] == handle.key and "bound fields differ" in dead["reason"]
    assert dead["reason"].startswith("ConflictError")
    assert live.stats()["executions"] == {handle.key: 1}
    assert broker_messages(live)["dead"] == 1


MALFORMED: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("charge", ("not an envelope",), {}, "exactly one envelope"),
    ("charge", ({"v": 1, "key": "x"},), {}, "invalid envelope"),
    ("charge", ({"v": 1, "key": "0" * 64, "scope": 7, "action": "default", "args": {}},), {},
     "scope: Input should be a valid string"),
    ("charge", ({"v": 1, "key": "0" * 64, "scope": "s", "action": "default",
                 "args": {"customer": "c", "amount": 1.5, "currency": "usd"}},), {}, "float"),
    ("charge", ({"v": 1, "key": "0" * 64, "scope": "s", "action": "default",
                 "args": {"customer": "c", "amount": "1", "currency": "usd"}},), {},
     "does not match its arguments"),
    ("charge", ({"v": 1, "key": "0" * 64, "scope": "s", "action": "default",
                 "args": {"customer": "c"}},), {}, "missing identity/bound arguments"),
    ("send_email", ({"v": 1, "key": "0" * 64, "scope": "s", "action": "receipt",
                     "args": {"recipient": "a@b.co", "body": "x" * 200_000}},), {},
     "over the 65536-byte bound"),
    ("send_email", (), {"recipient": "a@b.co"}, "exactly one envelope"),
    ("no_such_tool", ({},), {}, "unknown tool 'no_such_tool'"),
]  # fmt: skip


def test_malformed_messages_are_dead_lettered_with_a_reason_and_never_executed(
    live: LocalStack,
) -> None:
    live.start_workers(processes=1, threads=4)
    broker = runtime.broker()
    for actor_name, args, kwargs, _ in MALFORMED:
        broker.enqueue(
            dramatiq.Message(
                queue_name="effectq", actor_name=actor_name, args=args, kwargs=kwargs, options={}
            )
        )
    ledger = runtime.ledger()
    wait_for(lambda: len(ledger.dead_letters()) == len(MALFORMED), what="all dead-lettered")
    reasons = [d["reason"] for d in ledger.dead_letters()]
    for _, _, _, expected in MALFORMED:
        assert any(expected in reason for reason in reasons), (expected, reasons)
    assert live.stats()["total"] == 0
    assert broker_messages(live)["dead"] == len(MALFORMED)
    # The worker keeps serving.
    ok = submit("send_email", scope="after-garbage", recipient="z@example.com")
    assert ok.wait(30)["key"] == ok.key


def test_unknown_action_is_refused_at_submit() -> None:
    from dedupe import SpecError

    with pytest.raises(SpecError, match="action 'shout' is not declared"):
        submit("send_email", scope="s", action="shout", recipient="a@b.co")


def test_wait_returns_the_original_receipt_for_a_duplicate_of_an_in_flight_call(
    live: LocalStack,
) -> None:
    live.sandbox.configure(latency_ms=500)
    live.start_workers(processes=1, threads=2)
    first = submit("set_value", scope="op-1", target="acct-1", value=41)
    second = submit("set_value", scope="op-1", target="acct-1", value=41)
    assert (first.status, second.status) == (Status.ENQUEUED, Status.PENDING)
    assert second.wait(30) == first.wait(30)
    third = submit("set_value", scope="op-1", target="acct-1", value=41)
    assert third.status is Status.DONE and third.receipt == first.receipt
    record = runtime.ledger().get(first.key)
    assert record is not None and record.state is State.DONE and record.token == 1


def test_a_message_older_than_the_provider_window_never_executes(live: LocalStack) -> None:
    live.start_workers(processes=1, threads=2)
    done = submit("charge", scope="order-old-1", customer="c1", amount="3.00", currency="usd")
    done.wait(30)
    tool = get_tool("charge")
    two_days_ago = int((time.time() - 2 * 86400) * 1000)
    for scope in ("order-old-1", "order-old-2"):  # DONE already / never executed
        effect = tool.derive(scope, {"customer": "c1", "amount": "3.00", "currency": "usd"})
        runtime.broker().enqueue(
            dramatiq.Message(
                queue_name="effectq", actor_name="charge", args=(Envelope.of(effect).model_dump(),),
                kwargs={}, options={}, message_timestamp=two_days_ago,
            )
        )  # fmt: skip
    ledger = runtime.ledger()
    wait_for(lambda: broker_messages(live)["live"] == 0, what="both handled")
    [dead] = ledger.dead_letters()
    assert "past the provider's 86400s idempotency window; not executed" in dead["reason"]
    assert dead["key"] == tool.derive("order-old-2", {"customer": "c1", "amount": "3.00",
                                                      "currency": "usd"}).key  # fmt: skip
    assert live.stats()["executions"] == {done.key: 1}
