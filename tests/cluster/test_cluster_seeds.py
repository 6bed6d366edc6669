"""The ledger's way into a Redis Cluster and through its failovers (issue 15, item 14), on a
real 3-master cluster with one replica each: several seed nodes, cluster detection that
only a definite answer decides, and calls that survive a failover the client slept
through (the slot map is stale until something fails)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from dedupe import ClaimOutcome, Effect, Ledger, LedgerError, LedgerUnavailableError
from tests.support.cluster import LocalCluster, local_cluster
from tests.support.ledgers import charge, fresh_ledger, poll
from workers.dev.redis_server import RedisServer

# Every test starts and ends on a whole, healthy cluster (tests/cluster/conftest.py).
pytestmark = pytest.mark.usefixtures("healthy")


@pytest.fixture(scope="module")
def cluster(redis_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(redis_binary, tmp_path_factory.mktemp("seeds"), replicas=True) as c:
        yield c


def spread(n: int = 300) -> list[Effect]:
    """Fresh effects whose keys land on every master (256 buckets over 3 slot ranges)."""
    return [charge() for _ in range(n)]


def claims_work(ledger: Ledger, effects: list[Effect]) -> None:
    for effect in effects:
        assert ledger.claim(effect, lease_s=30, holder="w/1").outcome is ClaimOutcome.ACQUIRED
    records = ledger.get_many(e.key for e in effects)
    assert all(r is not None for r in records.values())


def test_a_seed_list_reaches_the_cluster_with_its_first_node_dead(cluster: LocalCluster) -> None:
    first = cluster.masters()[0]
    seeds = cluster.seeds(first)
    cluster.fail_over(first)
    with pytest.raises(LedgerUnavailableError):
        Ledger.from_url(first.url)  # the one bootstrap node of old
    ledger = fresh_ledger(seeds)
    assert ledger.cluster
    claims_work(ledger, spread())


def test_seeds_must_differ_only_in_host_and_port(cluster: LocalCluster) -> None:
    a, b = cluster.nodes[0], cluster.nodes[1]
    mixed = f"{a.url},redis://someone:s3cret@127.0.0.1:{b.port}/0"
    with pytest.raises(LedgerError, match="differ in more than host and port") as caught:
        Ledger.from_url(mixed)
    assert "s3cret" not in caught.value.message
    with pytest.raises(LedgerError, match="URL 2 of 2 is not a redis://") as caught:
        Ledger.from_url(f"{a.url},http://someone:s3cret@127.0.0.1:{b.port}")
    assert "s3cret" not in caught.value.message


def test_several_seeds_that_are_not_a_cluster_are_refused(shared_redis_server: RedisServer) -> None:
    url = shared_redis_server.url
    with pytest.raises(LedgerError, match="not a Redis Cluster node"):
        Ledger.from_url(f"{url},{url}")


def _paused(node_url: str, ms: int) -> None:
    """Hold every client command on the node for ``ms`` (the cluster bus runs on, so
    nobody fails over): INFO cluster times out there."""
    client = redis.Redis.from_url(node_url)
    client.execute_command("CLIENT", "PAUSE", ms, "ALL")
    client.close()


def _answers(node_url: str) -> bool:
    client = redis.Redis.from_url(node_url, socket_timeout=0.2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def test_a_transient_info_error_on_the_first_seed_still_detects_the_cluster(
    cluster: LocalCluster,
) -> None:
    replica = next(n for n in cluster.nodes if n not in cluster.masters())
    _paused(replica.url, 3000)
    try:
        ledger = fresh_ledger(cluster.seeds(replica), socket_timeout=1.0)
        assert ledger.cluster
        claims_work(ledger, spread())
    finally:
        poll(lambda: _answers(replica.url), bool, timeout=10)


def test_a_seed_that_cannot_say_whether_it_is_a_cluster_is_unavailable_not_plain(
    cluster: LocalCluster,
) -> None:
    """No seed answered INFO cluster: no silent plain client on a cluster node (2/3 of
    its keys would answer MOVED)."""
    replica = next(n for n in cluster.nodes if n not in cluster.masters())
    _paused(replica.url, 3000)
    try:
        with pytest.raises(LedgerUnavailableError, match="no seed"):
            Ledger.from_url(replica.url, socket_timeout=0.3, allow_volatile=True)
    finally:
        poll(lambda: _answers(replica.url), bool, timeout=10)


def test_a_plain_client_on_a_cluster_node_says_it_is_misconfigured(cluster: LocalCluster) -> None:
    ledger = fresh_ledger(cluster.url, cluster=False)
    with pytest.raises(LedgerUnavailableError, match="Redis Cluster node") as caught:
        for effect in spread(60):
            ledger.claim(effect, lease_s=30, holder="w/1")
    assert "cluster" in caught.value.message
    with pytest.raises(LedgerUnavailableError, match="Redis Cluster node"):
        ledger.submit_many([(e, f"m-{i}") for i, e in enumerate(spread(60))], pending_s=60)


def test_a_producer_idle_through_a_failover_succeeds_on_its_first_call(
    cluster: LocalCluster,
) -> None:
    ledger = fresh_ledger(cluster.seeds())
    warm = spread()
    ledger.submit_many([(e, f"w-{i}") for i, e in enumerate(warm)], pending_s=60)
    ledger.get_many(e.key for e in warm)  # pooled connections to every master
    cluster.fail_over(cluster.master_of(ledger._keys(warm[0].key)[0]))
    [answer] = ledger.submit_many([(charge(), "m-1")], pending_s=60)
    assert answer.status == "enqueue"
    answers = ledger.submit_many([(e, f"m-{i}") for i, e in enumerate(spread())], pending_s=60)
    assert {a.status for a in answers} == {"enqueue"}


@pytest.mark.parametrize("call", ["claim", "get", "submit"])
def test_every_safe_call_survives_a_failover_it_slept_through(
    cluster: LocalCluster, call: str
) -> None:
    ledger = fresh_ledger(cluster.seeds())
    effects = spread()
    ledger.get_many(e.key for e in effects)
    ledger.submit_many([(charge(), "w")], pending_s=60)
    cluster.fail_over(cluster.master_of(ledger._keys(effects[0].key)[0]))
    if call == "claim":
        claims_work(ledger, effects)
    elif call == "get":
        assert set(ledger.get_many(e.key for e in effects).values()) == {None}
    else:
        for i, effect in enumerate(effects):
            assert ledger.submit(effect, message_id=f"m-{i}", pending_s=60).status == "enqueue"


def test_a_submit_repeated_with_its_own_message_id_answers_enqueue_again(
    cluster: LocalCluster,
) -> None:
    """What makes a submit safe to repeat after a reply was lost: the same (fingerprint,
    message id) finds its own marker, reserved or confirmed; another message id finds the
    confirmed one pending."""
    ledger = fresh_ledger(cluster.seeds())
    effect = charge()
    assert ledger.submit(effect, message_id="m-1", pending_s=60).status == "enqueue"
    assert ledger.submit(effect, message_id="m-1", pending_s=60).status == "enqueue"
    ledger.confirm_pending([(effect, "m-1")], 60)
    assert ledger.submit(effect, message_id="m-1", pending_s=60).status == "enqueue"
    assert ledger.submit(effect, message_id="m-2", pending_s=60).status == "pending"


def _confirmed(ledger: Ledger, sent: list[tuple[Effect, str]]) -> bool:
    try:
        ledger.confirm_pending(sent, 60)
    except LedgerUnavailableError:
        return False
    return True


def test_submit_many_of_a_batch_spanning_a_failover_completes(cluster: LocalCluster) -> None:
    ledger = fresh_ledger(cluster.seeds())
    effects = [charge() for _ in range(3000)]
    batch = [(e, f"m-{i}") for i, e in enumerate(effects)]
    ledger.submit_many(batch[:10], pending_s=60)
    victim = cluster.master_of(ledger._keys(effects[0].key)[0])
    result: list[object] = []
    # The master dies under the batch: its slots answer nothing, then CLUSTERDOWN, then
    # move to the promoted replica.
    killer = threading.Timer(0.05, victim.kill)
    killer.start()
    started = time.monotonic()
    try:
        result.extend(a.status for a in ledger.submit_many(batch, pending_s=60))
    finally:
        killer.join()
    took = time.monotonic() - started
    print(f"\nsubmit_many of 3000 across a master SIGKILL + failover: {took:.1f}s")
    assert result == ["enqueue"] * len(batch)
    # The broker took every message. The confirm goes through the cluster client, which
    # may still send a slot to the dead master: a producer logs that and lets the
    # reservations lapse; here it goes again until the slot map has caught up.
    poll(lambda: _confirmed(ledger, batch), bool, timeout=30)
    again = ledger.submit_many([(e, f"n-{i}") for i, e in enumerate(effects)], pending_s=60)
    assert {a.status for a in again} == {"pending"}  # every marker is there


def test_effectq_list_takes_the_seed_list_from_settings(cluster: LocalCluster) -> None:
    first = cluster.masters()[0]
    seeds = cluster.seeds(first)
    ledger = fresh_ledger(cluster.url)
    held = charge()
    ledger.claim(held, lease_s=600, holder="w/1")
    cluster.fail_over(first)
    env = {
        **os.environ,
        "EFFECTQ_REDIS_URL": seeds,
        "EFFECTQ_NAMESPACE": ledger.namespace,
    }
    done = subprocess.run(
        [sys.executable, "-m", "workers", "list", "--state", "CLAIMED", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert held.key in done.stdout


@pytest.mark.parametrize("wait_replicas", [0, 1])
def test_a_holder_idle_through_a_failover_heartbeats_and_commits_on_its_first_call(
    cluster: LocalCluster, wait_replicas: int
) -> None:
    """Writes under the holder's token are safe to repeat (the same heartbeat, commit or
    fail answers ok again), so they go again once after the slot map is re-read — also in
    WAIT mode, whose node pipeline the cluster client does not retry. In WAIT mode a commit
    no replica of the new master acknowledged (it has none yet) is applied but answered
    "unavailable": the worker's commit loop repeats it, and the message's next delivery
    finds it DONE — nothing settles on a write a second failover could lose unnoticed."""
    ledger = fresh_ledger(cluster.seeds(), wait_replicas=wait_replicas)
    effects = spread(30)
    victim = cluster.master_of(ledger._keys(effects[0].key)[0])
    mine = [e for e in effects if cluster.master_of(ledger._keys(e.key)[0]) is victim][:2]
    claims = [ledger.claim(e, lease_s=60, holder="w/1") for e in mine]
    assert all(c.outcome is ClaimOutcome.ACQUIRED for c in claims)
    cluster.fail_over(victim)
    assert not ledger.heartbeat(mine[0].key, claims[0].token, lease_s=60).fenced
    try:
        write = ledger.commit(mine[1].key, claims[1].token, {"id": "r"}, retention_s=60)
        assert not write.fenced and write.state == "DONE"
    except LedgerUnavailableError as exc:
        assert wait_replicas and "acknowledged by 0 of 1" in exc.message
    record = ledger.get(mine[1].key)
    assert record is not None and record.state.value == "DONE"
