"""Helpers for tests that run the whole pipeline as real processes (``workers.dev.local``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import redis

from dedupe import EffectRecord, Ledger, State
from workers.dev.local import LocalStack, RabbitVhost

SANDBOX_DEFAULTS = {
    "fail_rate": 0.0,
    "drop_ack_rate": 0.0,
    "latency_ms": 0.0,
    "lookup_latency_ms": 0.0,
    "lookup_lag_s": 0.0,
    "lookup_enabled": True,
    "provider_idempotency": True,
}


# What the broker holds once every message was acked: nothing live, delayed or dead.
DRAINED = {"live": 0, "delayed": 0, "dead": 0}


def broker_client(stack: LocalStack) -> redis.Redis:
    return redis.Redis.from_url(stack.broker_url, decode_responses=True)


def broker_messages(stack: LocalStack, queue: str = "effectq") -> dict[str, int]:
    """Messages the broker still holds: queued or unacked, delayed (retries), dead-lettered."""
    if stack.broker_url.startswith(("amqp://", "amqps://")):
        # Through rabbitmqctl: AMQP counts only a queue's ready messages, and Dramatiq holds
        # a delayed message as an unacknowledged delivery until its eta.
        held = RabbitVhost(stack.broker_url).queue_messages()
        return {
            "live": held.get(queue, 0),
            "delayed": held.get(f"{queue}.DQ", 0),
            "dead": held.get(f"{queue}.XQ", 0),
        }
    client = broker_client(stack)
    ns = f"dramatiq:{queue}"
    return {
        "live": client.hlen(f"{ns}.msgs"),
        "delayed": client.hlen(f"{ns}.DQ.msgs"),
        "dead": client.hlen(f"{ns}.XQ.msgs"),
    }


def wait_states(
    ledger: Ledger,
    keys: Iterable[str],
    states: set[State] = frozenset({State.DONE}),  # type: ignore[assignment]
    *,
    timeout: float = 60.0,
) -> dict[str, EffectRecord | None]:
    """Poll until every key's record is in one of ``states``; fail listing the stragglers."""
    keys = list(keys)
    deadline = time.monotonic() + timeout
    while True:
        records = {key: ledger.get(key) for key in keys}
        waiting = {k: r for k, r in records.items() if r is None or r.state not in states}
        if not waiting:
            return records
        if time.monotonic() > deadline:
            sample = {k[:12]: (r.state.value, r.reason) if r else None for k, r in waiting.items()}
            raise AssertionError(
                f"{len(waiting)} effects not in {states}: {dict(list(sample.items())[:5])}"
            )
        time.sleep(0.1)


def wait_for(
    predicate: Callable[[], object], *, timeout: float = 30.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.05)
