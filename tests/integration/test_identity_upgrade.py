"""A message the previous release enqueued with an invisible character in its identity (a
producer that still took ``cus_1`` + U+200B as a customer of its own) meets a worker of this
release: dead-lettered with the reason, never executed — the customer is charged once, by
the visible spelling. Real Redis, real worker processes, the real sandbox."""

from __future__ import annotations

import hashlib

import dramatiq

from dedupe import canonical_bytes
from tests.support.stack import broker_messages, wait_for
from workers import Envelope, get_tool, runtime, submit
from workers.dev.local import LocalStack


def _old_envelope(scope: str, customer: str) -> dict[str, object]:
    """The envelope the previous release built: its key over the identity as it was (NFC,
    trimmed, nothing refused)."""
    args = {"customer": "cus_1", "amount": "10.00", "currency": "usd"}
    effect = get_tool("charge").derive("order-1", args)
    identity = {"v": 1, "tool": "charge", "action": "default", "scope": scope,
                "target": {"customer": customer}}  # fmt: skip
    key = hashlib.sha256(canonical_bytes(identity)).hexdigest()
    envelope = Envelope.of(effect).model_dump()
    return {**envelope, "key": key, "scope": scope, "args": {**args, "customer": customer}}


def test_an_old_message_with_a_zero_width_customer_is_dead_lettered_never_executed(
    live: LocalStack,
) -> None:
    live.start_workers(processes=1, threads=2)
    broker = runtime.broker()
    for scope, customer in (("order-1", "cus_1\u200b"), ("order\u2060-1", "cus_1")):
        message = dramatiq.Message(
            queue_name="effectq", actor_name="charge", args=(_old_envelope(scope, customer),),
            kwargs={}, options={},
        )  # fmt: skip
        broker.enqueue(message)
    ledger = runtime.ledger()
    wait_for(lambda: len(ledger.dead_letters()) >= 2, what="2 dead-letters", timeout=60)
    reasons = [d["reason"] for d in ledger.dead_letters()]
    assert len(reasons) == 2 and all("holds a control, format, invisible" in r for r in reasons)
    assert all("cus_1" not in r for r in reasons), reasons
    assert live.stats()["total"] == 0
    handle = submit("charge", scope="order-1", customer="cus_1", amount="10.00", currency="usd")
    assert handle.wait(30)["key"] == handle.key
    assert live.stats()["total"] == 1
    wait_for(lambda: broker_messages(live)["live"] == 0, what="queue empty")
