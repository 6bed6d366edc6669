"""The ledger on a real Redis Cluster (3 masters, one replica each, started here): keys
spread over every master, the reconciler and the operator listings reach every master,
batched submits survive an emptied script cache, and a master killed mid-run with its
replica promoted — measured with WAIT mode on and off.

(The state table and the 50-process race run on a cluster too: the ``cluster`` variants of
tests/integration/test_ledger_states.py and test_ledger_race.py.)"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from dedupe import (
    ClaimOutcome,
    Ledger,
    LedgerUnavailableError,
    NotFound,
    State,
    ToolSpec,
    VolatileLedgerError,
    derive,
)
from reconciler import Reconciler
from tests.support.cluster import LocalCluster, local_cluster
from tests.support.ledgers import charge, fresh_ledger, poll
from tests.support.stack import wait_for


@pytest.fixture(scope="module")
def cluster(redis_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(redis_binary, tmp_path_factory.mktemp("cluster"), replicas=True) as c:
        yield c


@pytest.fixture
def ledger(cluster: LocalCluster) -> Ledger:
    return fresh_ledger(cluster.url)


def records_per_master(cluster: LocalCluster, namespace: str) -> dict[int, int]:
    return {
        m.port: sum(1 for _ in m.client().scan_iter(match=f"{{{namespace}:*}}:r:*", count=1000))
        for m in cluster.masters()
    }


def test_from_url_finds_the_cluster_and_checks_every_master(
    cluster: LocalCluster, ledger: Ledger
) -> None:
    assert ledger.cluster
    last = cluster.masters()[-1].client()
    last.config_set("appendonly", "no")  # one master of three without an AOF
    try:
        with pytest.raises(VolatileLedgerError, match="no AOF persistence"):
            Ledger.from_url(cluster.url)
    finally:
        last.config_set("appendonly", "yes")


def test_keys_spread_over_every_master(cluster: LocalCluster, ledger: Ledger) -> None:
    effects = [charge() for _ in range(3000)]
    ledger.submit_many([(e, f"m-{i}") for i, e in enumerate(effects)], pending_s=60)
    for effect in effects:
        assert ledger.claim(effect, lease_s=30, holder="w/1").outcome is ClaimOutcome.ACQUIRED
    spread = records_per_master(cluster, ledger.namespace)
    print(f"\nrecords per master (port: count) of 3000: {spread}")
    assert sum(spread.values()) == 3000 and len(spread) == 3
    assert min(spread.values()) > 3000 / 3 * 0.8  # 256 buckets over 3 slot ranges


def test_submit_many_reloads_scripts_a_master_forgot(cluster: LocalCluster, ledger: Ledger) -> None:
    for master in cluster.masters():  # what a restart or failover does to the script cache
        master.client().script_flush()
    effects = [charge() for _ in range(60)]
    answers = ledger.submit_many([(e, f"m-{i}") for i, e in enumerate(effects)], pending_s=60)
    assert [a.status for a in answers] == ["enqueue"] * 60
    ledger.confirm_pending([(e, f"m-{i}") for i, e in enumerate(effects)], 60)
    again = ledger.submit_many([(e, f"n-{i}") for i, e in enumerate(effects)], pending_s=60)
    assert [a.status for a in again] == ["pending"] * 60


class _Missing:
    def lookup(self, idempotency_key: str, token: int | None = None) -> NotFound:
        return NotFound()


def test_reconciler_and_listings_reach_every_master(cluster: LocalCluster, ledger: Ledger) -> None:
    looked_up = ToolSpec(name="charge", identity=("customer",), settle_s=0, lookup=_Missing())
    blind = ToolSpec(name="blind", identity=("x",))
    failed = [charge() for _ in range(60)]
    unknown = [derive(blind, f"s-{i}", {"x": str(i)}) for i in range(30)]
    for effect in [*failed, *unknown]:
        ledger.claim(effect, lease_s=0.05, holder="dead/1", campaign="camp1")
    assert len(set(records_per_master(cluster, ledger.namespace).values()) - {0}) >= 1
    time.sleep(0.1)
    assert len(ledger.expired()) == 90  # every bucket, on every master

    # "blind" declares no lookup: UNKNOWN at once (a tool not declared at all is left to a
    # reconciler that declares it).
    outcomes = Reconciler(ledger, {"charge": looked_up, "blind": blind}, batch=1000).run_once()
    assert outcomes == Counter(failed=60, unknown=30)
    assert sorted(ledger.keys_in(State.FAILED)) == sorted(e.key for e in failed)  # SCAN
    assert sorted(ledger.keys_in(State.UNKNOWN)) == sorted(e.key for e in unknown)  # indexes
    assert ledger.campaign_counts("camp1") == {
        **dict.fromkeys((s.value for s in State), 0), "FAILED": 60, "UNKNOWN": 30,
    }  # fmt: skip
    assert ledger.counts()[("UNKNOWN", "blind")] == 30  # stats hashes of every master


# -- a master killed mid-run, its replica promoted -----------------------------------------


def _claims_through_a_failover(cluster: LocalCluster, wait_replicas: int) -> dict[str, int]:
    """Claim fresh keys from a thread while the master serving a third of them is
    SIGKILLed and the cluster promotes its replica; then count acknowledged claims the
    promoted topology does not have."""
    ledger = Ledger.from_url(cluster.url, namespace=f"fo{wait_replicas}x{time.time_ns() % 10**6}",
                             wait_replicas=wait_replicas)  # fmt: skip
    victim = cluster.master_of(ledger._keys(charge("probe").key)[0])
    acknowledged: list[str] = []
    refused = 0
    stop = threading.Event()

    def claimer() -> None:
        nonlocal refused
        while not stop.is_set():
            effect = charge()
            try:
                claim = ledger.claim(effect, lease_s=60, holder="fo/1")
            except LedgerUnavailableError:
                refused += 1  # not acknowledged: a worker would not act on it
                time.sleep(0.02)
                continue
            assert claim.outcome is ClaimOutcome.ACQUIRED
            acknowledged.append(effect.key)

    thread = threading.Thread(target=claimer)
    thread.start()
    try:
        wait_for(lambda: len(acknowledged) > 300, timeout=30, what="claims before the kill")
        replica = cluster.replica_of(victim)
        victim.kill()
        before = len(acknowledged)
        # The replica takes over after the node timeout. Until the victim is back as its
        # replica, WAIT mode refuses that shard's claims (no replica to acknowledge them).
        poll(cluster.masters, lambda masters: replica in masters, timeout=30)
        victim.start()
        cluster.wait_ok()
        wait_for(lambda: len(acknowledged) > before + 300, timeout=60, what="claims after failover")
    finally:
        stop.set()
        thread.join(timeout=30)
    survived = Ledger.from_url(cluster.url, namespace=ledger.namespace).get_many(acknowledged)
    lost = sum(1 for r in survived.values() if r is None)
    return {"acknowledged": len(acknowledged), "refused": refused, "lost": lost}


@pytest.mark.slow
def test_master_killed_mid_run_with_and_without_wait(cluster: LocalCluster) -> None:
    waited = _claims_through_a_failover(cluster, wait_replicas=1)
    plain = _claims_through_a_failover(cluster, wait_replicas=0)
    print(f"\ncluster master SIGKILL + replica promotion: WAIT=1 {waited}; no WAIT {plain}")
    # WAIT: an acknowledged claim is on the replica that was promoted. Without WAIT Redis
    # promises nothing; the loss is measured and reported (usually 0 on one machine).
    assert waited["lost"] == 0, waited
    assert waited["acknowledged"] > 600 and plain["acknowledged"] > 600


def test_frozen_replica_wait_refuses_plain_mode_loses_the_claim(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The window made deterministic on a cluster: the victim's replica is frozen and its
    link cut while a claim is made, the master dies, and the replica is forced to take over
    (CLUSTER FAILOVER TAKEOVER). WAIT refused the claim; plain mode acknowledged a claim
    the promoted replica does not have, and grants it a second time."""
    outcomes: dict[int, str] = {}
    for wait_replicas in (1, 0):
        namespace = f"fz{wait_replicas}x{time.time_ns() % 10**6}"
        ledger = Ledger.from_url(
            cluster.url, namespace=namespace, wait_replicas=wait_replicas, wait_timeout_ms=300
        )
        effect = charge()
        master = cluster.master_of(ledger._keys(effect.key)[0])
        replica = cluster.replica_of(master)
        replica.sigstop()
        master.client().client_kill_filter(_type="replica")
        try:
            ledger.claim(effect, lease_s=60, holder="fz/1")
            outcomes[wait_replicas] = "acknowledged"
        except LedgerUnavailableError as exc:
            assert "acknowledged by 0 of 1 replicas" in exc.message
            outcomes[wait_replicas] = "refused"
        master.kill()
        replica.sigcont()
        replica.client().execute_command("CLUSTER FAILOVER", "TAKEOVER")
        record_key, promoted = ledger._keys(effect.key)[0], replica.port
        poll(lambda: cluster.master_of(record_key).port, lambda p: p == promoted, timeout=30)  # noqa: B023
        after = Ledger.from_url(cluster.url, namespace=ledger.namespace)
        survived = after.get(effect.key) is not None
        outcomes[wait_replicas] += ", survived" if survived else ", lost"
        if not survived:
            assert after.claim(effect, lease_s=60, holder="fz/2").outcome is ClaimOutcome.ACQUIRED
        master.start()
        cluster.wait_ok()
    print(f"\ncluster, frozen replica: WAIT=1 {outcomes[1]}; no WAIT {outcomes[0]}")
    assert outcomes[1].startswith("refused")
    assert outcomes[0] == "acknowledged, lost"
