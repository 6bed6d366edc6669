"""Campaign submissions ride out a master failover (issue 37, item 8).

The README promises a campaign submission rides out a failover for 30 s; the ledger's own
submits and confirms did, but the campaign store's writes (plan rows, approval, the "sent"
set) went to the cluster client once, so ``effectq campaign submit`` exited 7 within a
second of a master SIGKILL. On a real 3-master cluster with replicas: the store's calls
after a SIGKILL and after a lost reply, and the CLI with the master of the campaign's
"sent" set SIGKILLed mid-fan-out (every recipient's ledger records on the other masters, so
nothing but the store meets the failover), then real workers running every send once."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dedupe import CampaignPlan, CampaignStore, Ledger, derive
from dedupe.campaigns import campaign_tag
from tests.support.cluster import LocalCluster, local_cluster
from tests.support.ledgers import fresh_ledger
from tests.support.proxy import ReplyLosingProxy
from tests.support.stack import wait_for
from workers.dev.local import LocalStack
from workers.dev.redis_server import RedisServer, default_redis_binary
from workers.examples import send_email

# Every test starts and ends on a whole, healthy cluster (tests/cluster/conftest.py).
pytestmark = pytest.mark.usefixtures("healthy")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("campaign-failover")
    with local_cluster(default_redis_binary(), root, replicas=True) as c:
        yield c


def _plan(campaign_id: str) -> CampaignPlan:
    return CampaignPlan(campaign_id, "send_email", "send", 1, 0, "", "",
                        rows_id=secrets.token_hex(8))  # fmt: skip


def test_the_campaign_store_rides_out_a_master_sigkill(cluster: LocalCluster) -> None:
    ledger = fresh_ledger(cluster.seeds())
    store = CampaignStore(ledger)
    plan = _plan("store-failover")
    plan_key = ledger.keyspace.campaign(campaign_tag(plan.campaign_id), "plan", plan.rows_id)
    victim = cluster.master_of(plan_key)
    rows = {f"k{i}": f"p{i}@example.com" for i in range(50)}
    assert store.stage(plan, dict(list(rows.items())[:25]), ttl_s=600) == [True] * 25

    victim.kill()
    started = time.monotonic()
    # Staged while the cluster elects a new master: every row new, none lost.
    assert store.stage(plan, dict(list(rows.items())[25:]), ttl_s=600) == [True] * 25
    assert time.monotonic() - started < 30
    assert store.plan_keys(plan) == set(rows)
    store.mark_sent(plan.campaign_id, 1, rows, ttl_s=600)
    assert store.sent_count(plan.campaign_id, 1) == 50


def test_a_staged_batch_whose_reply_is_lost_is_staged_again_with_its_rows_new(
    cluster: LocalCluster, proxies: dict[int, ReplyLosingProxy]
) -> None:
    def remap(address: tuple[str, int]) -> tuple[str, int]:
        host, port = address
        return ("127.0.0.1", proxies[port].port) if port in proxies else (host, port)

    ledger = Ledger.from_url(
        cluster.url, cluster=True, namespace="lostcampaign", socket_timeout=1.0,
        address_remap=remap,
    )  # fmt: skip
    store = CampaignStore(ledger)
    plan = _plan("lost-stage")
    rows = {f"k{i}": f"p{i}@example.com" for i in range(10)}
    assert store.plan_keys(plan) == set()  # the connection to the plan's node is open
    for proxy in proxies.values():
        proxy.lose_replies(on_new_connections=False)
    # The first staging ran, its reply was lost; sent again on a new connection it answers
    # as the first did (HSET again would say "not new" for every row: a plan of nobody).
    assert store.stage(plan, rows, ttl_s=600) == [True] * 10
    assert store.plan_keys(plan) == set(rows)


@pytest.fixture
def cluster_stack(cluster: LocalCluster, tmp_path: Path) -> Iterator[LocalStack]:
    """Ledger on the cluster (every node a seed), broker on a Redis of its own."""
    (tmp_path / "stack").mkdir()
    broker = RedisServer(default_redis_binary(), tmp_path / "broker").start()
    try:
        with LocalStack(
            redis_url=cluster.seeds(), broker_url=f"{broker.url}/0", workdir=tmp_path / "stack"
        ) as stack:
            yield stack
    finally:
        broker.stop()


def test_campaign_submit_rides_out_a_master_sigkill_mid_fan_out(
    cluster: LocalCluster, cluster_stack: LocalStack, tmp_path: Path
) -> None:
    campaign = f"failover-{secrets.token_hex(4)}"
    ledger = Ledger.from_url(cluster.seeds())
    victim = cluster.master_of(ledger.keyspace.campaign(campaign_tag(campaign), "sent", 1))
    # Recipients whose records and markers live on the other masters: the ledger's own
    # calls never meet the failover, only the campaign store's "sent" write does.
    people: list[str] = []
    for i in range(1000):
        key = derive(send_email.spec, campaign, {"recipient": f"p{i}@example.com"}).key
        if cluster.master_of(ledger.keyspace.pending(key)) is not victim:
            people.append(f"p{i}@example.com")
        if len(people) == 5:
            break
    last = derive(send_email.spec, campaign, {"recipient": people[-1]}).key
    path = tmp_path / "campaign.json"
    path.write_text(json.dumps({"campaign_id": campaign, "tool": "send_email",
                                "args": {"subject": "hi"}, "recipients": people}))  # fmt: skip

    # A pause after the batch's markers: the kill lands before its send and "sent" write.
    env = cluster_stack.env(EFFECTQ_FAILPOINTS="after_submit_mark=sleep:2")
    submit = subprocess.Popen(
        [sys.executable, "-m", "workers", "campaign", "submit", "--json", str(path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: ledger.has_pending(last), timeout=60, what="the batch marked")
        assert submit.poll() is None, "the fan-out ended before the failover"
        killed_at = time.monotonic()
        victim.kill()
        out, err = submit.communicate(timeout=90)
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait()
    took = time.monotonic() - killed_at
    assert submit.returncode == 0, f"exit {submit.returncode} {took:.1f} s after the kill: {err}"
    report = json.loads(out)
    assert report["sent"] == len(people), report

    cluster.wait_ok()
    cluster_stack.start_workers(1, 4)
    wait_for(lambda: cluster_stack.stats()["total"] >= len(people), timeout=60, what="sends")
    executions = cluster_stack.stats()["executions"]
    assert len(executions) == len(people) and set(executions.values()) == {1}, executions
    status = subprocess.run(
        [sys.executable, "-m", "workers", "campaign", "status", "--json", campaign],
        env=cluster_stack.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
