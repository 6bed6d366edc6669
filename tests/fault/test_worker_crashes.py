"""Worker processes SIGKILLed at named crash points, the ledger's Redis killed mid-run, and a
SIGTERM during a slow effect — each checked against the provider's own execution count.

The sandbox's own idempotency is switched off in these tests: only effectq stands between
a redelivery and a second execution.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from dedupe import State
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import runtime, submit
from workers.dev.local import FAST_ENV, LocalStack
from workers.dev.redis_server import RedisServer
from workers.examples import ExampleSettings
from workers.settings import Settings


def _charge(scope: str) -> str:
    return submit("charge", scope=scope, customer="c-9", amount="12.50", currency="usd").key


def _killed(stack: LocalStack) -> bool:
    return "restarting in" in stack.log("workers.log")  # the supervisor saw it die


def test_after_commit_kill_redelivery_is_a_duplicate(fenceless: LocalStack) -> None:
    fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS="after_commit=kill")
    key = _charge("order-after-commit")
    ledger = runtime.ledger()
    wait_states(ledger, [key], timeout=30)
    wait_for(lambda: _killed(fenceless), what="worker SIGKILLed after its commit")
    # The broker redelivers the unacked message to the restarted worker: a duplicate.
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="redelivery acked", timeout=60)
    assert fenceless.stats()["executions"] == {key: 1}
    assert ledger.counts()[("dup_claim", "charge")] == 1


def test_a_worker_killed_with_acks_queued_redelivers_them_as_duplicates(
    fenceless: LocalStack,
) -> None:
    # Four effects finish together; the first ack write SIGKILLs the process: every effect
    # committed by then is DONE and unacked (the others are claimed, some executed).
    fenceless.sandbox.configure(latency_ms=300)
    armed = fenceless.start_workers(1, 4, EFFECTQ_FAILPOINTS="before_ack=kill")
    keys = [_charge(f"order-acks-{i}") for i in range(4)]
    ledger = runtime.ledger()
    wait_for(lambda: _killed(fenceless), what="worker SIGKILLed before its ack write")
    fenceless.stop_pool(armed)  # its respawned worker would be killed again
    committed = [k for k, r in ledger.get_many(keys).items() if r and r.state is State.DONE]
    assert committed, "no effect was committed before the kill"
    fenceless.start_workers(1, 4)
    fenceless.start_reconciler()  # for any claim the kill left mid-effect
    wait_states(ledger, keys, timeout=60)
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="redeliveries acked", timeout=60)
    assert fenceless.stats()["executions"] == dict.fromkeys(keys, 1)
    # Each committed effect's message came back and found its record DONE.
    assert ledger.counts()[("dup_claim", "charge")] >= len(committed)


def test_a_worker_process_dying_during_its_boot_is_restarted_at_once(live: LocalStack) -> None:
    # Dramatiq's main process waits up to --worker-fork-timeout (30 s by default) for a
    # worker process to report its boot, deaf to that process's death meanwhile.
    started = time.monotonic()
    live.start_workers(1, 1, EFFECTQ_TOOLS="tests.support.boot_crash")
    wait_for(lambda: _killed(live), what="the dead worker process seen", timeout=20)
    print(f"restart logged {time.monotonic() - started:.1f}s after the pool started")


@pytest.mark.parametrize(("point", "executed"), [("after_claim", 0), ("after_effect", 1)])
def test_killed_holder_is_never_re_executed_blind(
    fenceless: LocalStack, point: str, executed: int
) -> None:
    pool = fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS=f"{point}=kill")
    key = _charge(f"order-{point}")
    ledger = runtime.ledger()
    wait_for(lambda: _killed(fenceless), what=f"worker SIGKILLed at {point}")
    # Redelivered (heartbeat timeout) to the restarted worker, the message finds the claim
    # live, then expired: in_flight, then blocked — retried later, never executed, never
    # acked, while no reconciler runs.
    wait_for(lambda: broker_messages(fenceless)["delayed"] >= 1, what="retry scheduled")
    record = ledger.get(key)
    assert record is not None and record.state is State.CLAIMED and record.token == 1
    assert fenceless.stats()["executions"].get(key, 0) == executed
    assert broker_messages(fenceless)["dead"] == 0
    # The reconciler completes the story: not found → FAILED → the message's next delivery
    # executes it; found → DONE → the next delivery is a duplicate.
    fenceless.stop_pool(pool)
    fenceless.start_workers(1, 2)
    fenceless.start_reconciler()
    [record] = wait_states(ledger, [key], timeout=60).values()
    assert record is not None
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="message acked", timeout=60)
    assert fenceless.stats()["executions"] == {key: 1}
    notes = [h.note for h in record.history]
    expected = "not found after the settle window" if executed == 0 else "found at the provider"
    assert any(expected in note for note in notes), notes


def test_ledger_redis_killed_mid_run_no_effect_runs_without_a_claim(
    fenceless: LocalStack, own_ledger: RedisServer
) -> None:
    fenceless.sandbox.configure(latency_ms=20)
    keys = [_charge(f"order-outage-{i}") for i in range(300)]
    env = {"EFFECTQ_REDIS_URL": own_ledger.url}
    fenceless.start_workers(2, 8, **env)
    fenceless.start_reconciler(**env)
    wait_for(lambda: fenceless.stats()["total"] >= 60, what="a fifth executed")
    own_ledger.kill()
    executed_during = fenceless.stats()["total"]
    own_ledger.start()  # from its AOF, same port
    ledger = runtime.ledger()
    records = wait_states(ledger, keys, timeout=120)
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="queue drained", timeout=60)
    stats = fenceless.stats()
    assert executed_during < 300
    assert stats["total"] == 300 and set(stats["executions"].values()) == {1}
    with httpx.Client(base_url=fenceless.sandbox.url) as provider:
        for key, record in records.items():
            receipt = provider.get(f"/v1/effects/{key}").json()
            assert record is not None
            claimed_tokens = {h.token for h in record.history if h.state == "CLAIMED"}
            # Every execution ran under a token the ledger granted as a claim.
            assert receipt["token"] in claimed_tokens, (key, receipt["token"], record.history)


def test_sigterm_during_a_slow_effect_finishes_and_acks(fenceless: LocalStack) -> None:
    fenceless.sandbox.configure(latency_ms=3000)
    pool = fenceless.start_workers(1, 2)
    key = _charge("order-slow")
    ledger = runtime.ledger()
    wait_for(lambda: ledger.get(key) is not None, what="claimed")
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=60) == 0
    record = ledger.get(key)
    assert record is not None and record.state is State.DONE
    assert fenceless.stats()["executions"] == {key: 1}
    assert broker_messages(fenceless) == DRAINED


def _default(name: str) -> int:
    # The core settings, or the example tools' own (their lease and settle window).
    fields = {**Settings.model_fields, **ExampleSettings.model_fields}
    value: int = fields[name].default
    return value


# The settings a user deploys with: none of the stack's fast failure detection.
PRODUCTION = {key: str(_default(key.removeprefix("EFFECTQ_").lower())) for key in FAST_ENV}


def test_a_killed_workers_message_comes_back_within_the_stated_bound_on_the_defaults(
    fenceless: LocalStack,
) -> None:
    assert _default("broker_maintenance_chance") == 1_000  # Dramatiq's: 0.1 % of commands
    # The stated bound: heartbeat timeout + maintenance interval, plus a live worker's next
    # poll, the claim and the effect itself (a few seconds).
    timeout_ms = _default("broker_heartbeat_timeout_ms")
    bound_s = (timeout_ms + _default("broker_maintenance_interval_ms")) / 1000 + 5
    armed = fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS="after_claim=kill", **PRODUCTION)
    key = _charge("order-default-recovery")
    wait_for(lambda: _killed(fenceless), what="worker SIGKILLed after its claim", timeout=60)
    killed_at = time.monotonic()
    fenceless.stop_pool(armed)  # its respawned worker would be killed again
    fenceless.start_workers(1, 2, **PRODUCTION)
    fenceless.start_reconciler(**PRODUCTION)
    ledger = runtime.ledger()
    wait_states(ledger, [key], {State.FAILED}, timeout=60)  # the lease (30 s), the settle
    [record] = wait_states(ledger, [key], timeout=bound_s - (time.monotonic() - killed_at)).values()
    recovered_s = time.monotonic() - killed_at
    print(f"recovered {recovered_s:.1f}s after the kill (bound {bound_s:.0f}s)")
    assert record is not None and record.state is State.DONE
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="message acked", timeout=30)
    assert fenceless.stats()["executions"] == {key: 1}


def test_sigterm_to_the_whole_process_group_drains_in_flight_effects(
    fenceless: LocalStack,
) -> None:
    # systemd's KillMode=control-group, a terminal's Ctrl-C, `kill -TERM -PGID`: every
    # process of the pool gets the signal, the Dramatiq worker process more than once.
    fenceless.sandbox.configure(latency_ms=3000)
    pool = fenceless.start_workers(1, 4)
    keys = [_charge(f"order-group-{i}") for i in range(4)]
    ledger = runtime.ledger()
    wait_states(ledger, keys, {State.CLAIMED}, timeout=60)
    os.killpg(pool.pid, signal.SIGTERM)  # the pool is a session: its pgid is its pid
    assert pool.wait(timeout=60) == 0
    records = wait_states(ledger, keys, timeout=5)
    for record in records.values():
        assert record is not None
        assert not any(h.note.startswith("handover") for h in record.history), record.history
    stats = fenceless.stats()
    assert stats["total"] == 4 and set(stats["executions"].values()) == {1}
    assert broker_messages(fenceless) == DRAINED
    assert "Killing worker process" not in fenceless.log("workers.log")
