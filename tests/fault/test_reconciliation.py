"""The reconciler against the real sandbox, with real worker processes crashed or frozen at
named points: lost acknowledgements, lookup lag, failing lookups and an operator, a holder
SIGSTOPped past its lease, several reconcilers at once. Provider counts decide."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from dedupe import State, ToolSpec, derive
from reconciler import Reconciler
from tests.support.ledgers import fresh_ledger
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import get_tool, metrics, runtime, submit
from workers.dev.local import LocalStack
from workers.dev.redis_server import RedisServer


def _email(scope: str) -> str:
    return submit("send_email", scope=scope, recipient="ops@example.com", subject="s").key


def test_lost_ack_is_found_by_lookup_and_the_redelivery_is_a_duplicate(
    fenceless: LocalStack,
) -> None:
    fenceless.sandbox.configure(drop_ack_rate=1.0)
    fenceless.start_workers(1, 2)
    fenceless.start_reconciler()
    key = _email("evt-lost-ack")
    [record] = wait_states(runtime.ledger(), [key]).values()
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="acked")
    assert fenceless.stats()["executions"] == {key: 1}
    assert record is not None and "found at the provider" in record.reason
    assert record.raw_response and json.loads(record.raw_response)["key"] == key


def test_lookup_lag_longer_than_the_lease_is_never_read_as_not_executed(
    fenceless: LocalStack,
) -> None:
    # Lease 3 s; the provider shows a new effect to lookups only after 5 s; the tool's
    # settle window (8 s) covers the lag.
    fenceless.sandbox.configure(lookup_lag_s=5.0)
    env = {"EFFECTQ_EXAMPLE_SETTLE_S": "8"}
    pool = fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS="after_effect=kill", **env)
    fenceless.start_reconciler(**env)
    key = _email("evt-lagging")
    wait_for(lambda: fenceless.stats()["total"] == 1, what="executed")
    fenceless.stop_pool(pool)
    fenceless.start_workers(1, 2, **env)
    [record] = wait_states(runtime.ledger(), [key], timeout=60).values()
    assert record is not None
    notes = [h.note for h in record.history]
    assert not any("not found after the settle window" in n for n in notes), notes
    assert "found at the provider" in record.reason
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="acked", timeout=60)
    assert fenceless.stats()["executions"] == {key: 1}


def _cli(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers", *args], env=stack.env(), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(("point", "executed"), [("after_effect", True), ("after_claim", False)])
def test_failing_lookups_turn_unknown_then_an_operator_settles_it(
    fenceless: LocalStack, point: str, executed: bool
) -> None:
    fenceless.sandbox.configure(lookup_enabled=False)
    env = {"EFFECTQ_RECONCILER_BUDGET": "3", "EFFECTQ_RECONCILER_BACKOFF_S": "0.1"}
    pool = fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS=f"{point}=kill")
    fenceless.start_reconciler(**env)
    key = _email(f"evt-unknown-{point}")
    ledger = runtime.ledger()
    [record] = wait_states(ledger, [key], {State.UNKNOWN}, timeout=60).values()
    assert record is not None and "lookup unavailable 3 times" in record.reason
    fenceless.stop_pool(pool)
    fenceless.start_workers(1, 2)
    # The key blocks every delivery: the message is retried, never executed again.
    wait_for(lambda: broker_messages(fenceless)["delayed"] == 1, what="message held back")
    assert ledger.get(key).state is State.UNKNOWN  # type: ignore[union-attr]
    assert fenceless.stats()["total"] == int(executed)
    listed = _cli(fenceless, "list", "--state", "unknown", "--json")
    assert listed.returncode == 0 and [r["key"] for r in json.loads(listed.stdout)] == [key]
    if executed:
        args = ["--executed", "--receipt", json.dumps({"id": "from-provider-dashboard"})]
    else:
        args = ["--not-executed"]
    done = _cli(fenceless, "resolve", key, *args, "--actor", "sre-kim", "--reason", "checked")
    assert done.returncode == 0, done.stderr
    wait_states(ledger, [key], timeout=60)
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="acked", timeout=60)
    assert fenceless.stats()["executions"] == {key: 1}
    [entry] = ledger.audit_log()
    assert entry["actor"] == "sre-kim" and entry["key"] == key
    assert entry["action"] == ("resolve_done" if executed else "resolve_failed")
    refused = _cli(fenceless, "resolve", key, "--not-executed", "--actor", "x", "--reason", "y")
    assert refused.returncode == 8 and "only an UNKNOWN effect can be resolved" in refused.stderr


def test_holder_stopped_past_its_lease_is_fenced_on_waking(live: LocalStack) -> None:
    live.start_workers(1, 2, EFFECTQ_FAILPOINTS="before_commit=stop")
    live.start_reconciler()
    key = _email("evt-frozen")
    ledger = runtime.ledger()

    def frozen() -> list[psutil.Process]:
        procs = [psutil.Process(pid) for pid in live.worker_processes()]
        return [p for p in procs if p.status() == psutil.STATUS_STOPPED]

    wait_for(frozen, what="holder SIGSTOPped before its commit")
    [record] = wait_states(ledger, [key], timeout=60).values()  # reconciled meanwhile
    assert record is not None and "found at the provider" in record.reason
    for proc in frozen():
        proc.resume()
    wait_for(lambda: ledger.get(key).late_receipts, what="late receipt")  # type: ignore[union-attr]
    record = ledger.get(key)
    assert record is not None and record.state is State.DONE
    assert record.late_receipts[0]["token"] == 1 and record.token == 2
    assert ledger.counts()[("fenced", "commit")] == 1
    assert live.stats()["executions"] == {key: 1}


@pytest.mark.parametrize("reconcilers", [2, 4])
def test_several_reconcilers_resolve_each_expired_claim_exactly_once(
    live: LocalStack, reconcilers: int
) -> None:
    ledger = runtime.ledger()
    spec = get_tool("charge").spec
    keys = []
    provider = httpx.Client(base_url=live.sandbox.url)
    for i in range(200):
        effect = derive(
            spec, f"order-r{i}", {"customer": f"c{i}", "amount": "1", "currency": "eur"}
        )
        claim = ledger.claim(effect, lease_s=0.5, holder="dead/1")
        if i % 2:  # half of them really happened before their holder died
            headers = {"Idempotency-Key": claim.idempotency_key, "Fencing-Token": str(claim.token)}
            provider.post("/v1/effects", json={"i": i}, headers=headers).raise_for_status()
        keys.append(effect.key)
    time.sleep(0.5)  # the leases run out on the server's clock meanwhile
    for _ in range(reconcilers):
        live.start_reconciler(interval=0.1, EFFECTQ_EXAMPLE_SETTLE_S="0.5")
    records = wait_states(ledger, keys, {State.DONE, State.FAILED}, timeout=90)
    for i, record in enumerate(records.values()):
        assert record is not None
        settled = [h for h in record.history if h.state in ("DONE", "FAILED")]
        assert len(settled) == 1, record.history
        assert record.state is (State.DONE if i % 2 else State.FAILED)
    assert live.stats()["total"] == 100


def test_a_receipt_over_the_bound_is_never_truncated_but_left_to_an_operator(
    fenceless: LocalStack,
) -> None:
    fenceless.start_workers(1, 2)
    fenceless.start_reconciler()
    big = "x" * 20_000  # the provider echoes it: a 20 kB receipt, over the 16 KiB bound
    key = submit("set_value", scope="op-big", target="acct-9", value=big).key
    [record] = wait_states(runtime.ledger(), [key], {State.UNKNOWN}, timeout=60).values()
    assert record is not None and "found, but receipt is" in record.reason
    assert "over the 16384-byte bound" in record.reason
    assert record.receipt is None
    assert fenceless.stats()["executions"] == {key: 1}


def test_a_reconciler_lacking_a_tools_spec_leaves_its_claims_to_one_that_has_it(
    shared_redis_server: RedisServer,
) -> None:
    ledger = fresh_ledger(shared_redis_server.url)
    known = ToolSpec(name="known_tool", identity=("x",))  # no lookup: UNKNOWN when taken
    foreign = ToolSpec(name="foreign_tool", identity=("x",))
    mine = derive(known, "s-1", {"x": "1"})
    theirs = [derive(foreign, f"s-{i}", {"x": "1"}) for i in range(3)]
    for effect in (mine, *theirs):
        ledger.claim(effect, lease_s=0.05, holder="dead/1")
    time.sleep(0.1)  # every lease runs out on the server's clock

    counted = metrics.ReconcilerMetrics()  # the observer `effectq reconciler` passes
    outcomes = Reconciler(ledger, {"known_tool": known}, observer=counted).run_once()

    assert outcomes == {"unknown": 1, "unowned": 3}
    for effect in theirs:  # not taken over, not made UNKNOWN: left as they were
        record = ledger.get(effect.key)
        assert record is not None and record.state is State.CLAIMED and record.token == 1
    gauge = metrics.REGISTRY.get_sample_value
    assert gauge("effectq_reconciler_unowned_claims", {"tool": "foreign_tool"}) == 3
    # Reconcilers of other tools form groups of their own, each covering every bucket.
    other = Reconciler(ledger, {"foreign_tool": foreign})
    assert other.group != Reconciler(ledger, {"known_tool": known}).group
    assert other.run_once() == {"unknown": 3}
    assert Reconciler(ledger, {"known_tool": known}, observer=counted).run_once() == {}
    assert gauge("effectq_reconciler_unowned_claims", {"tool": "foreign_tool"}) == 0
