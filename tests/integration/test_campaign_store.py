"""``CampaignStore`` on its own, on a single server and a Redis Cluster (system Redis 7.x
and the embedded 6.2): approval is a compare-and-set, racing plans never merge, every
key the store writes expires, and status counts only the approved plan's recipients."""

from __future__ import annotations

import hashlib

from dedupe import CampaignPlan, CampaignStore, Ledger, State, campaign_tag
from tests.support.cluster import LocalCluster
from tests.support.ledgers import RETENTION_S, charge, fresh_ledger
from workers.dev.redis_server import RedisServer

TTL_S = 3600.0


def _plan(campaign: str, keys: list[str], version: int = 1) -> CampaignPlan:
    fingerprint = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()
    return CampaignPlan(campaign, "charge", "default", version, len(keys), "a" * 64, fingerprint)


def test_approval_is_a_compare_and_set_and_racing_plans_never_merge(
    ledger_server: RedisServer | LocalCluster,
) -> None:
    ledger = fresh_ledger(ledger_server.url)
    store = CampaignStore(ledger)
    mine = {charge("camp-race", customer=f"a{i}").key: f"a{i}" for i in range(3)}
    theirs = {charge("camp-race", customer=f"b{i}").key: f"b{i}" for i in range(2)}
    first, second = _plan("camp-race", list(mine)), _plan("camp-race", list(theirs))
    # Both read "no plan"; the first approval wins, the second is refused.
    assert store.freeze(first, mine, approved=None, ttl_s=TTL_S)
    assert not store.freeze(second, theirs, approved=None, ttl_s=TTL_S)
    assert store.meta("camp-race") == first
    assert store.plan_keys(first) == set(mine)  # nothing of the loser's list in the plan
    # An identical plan approved meanwhile is no conflict.
    assert store.freeze(first, mine, approved=None, ttl_s=TTL_S)
    # A new version approves against the version it was checked against, once.
    v2 = _plan("camp-race", list(theirs), version=2)
    assert store.freeze(v2, theirs, approved=first, removed=mine, ttl_s=TTL_S)
    assert not store.freeze(_plan("camp-race", list(mine), 2), mine, approved=first)
    assert store.meta("camp-race") == v2 and store.removed_rows(v2) == mine


def test_every_key_the_store_writes_expires_and_is_refreshed(
    ledger_server: RedisServer | LocalCluster,
) -> None:
    ledger = fresh_ledger(ledger_server.url)
    store = CampaignStore(ledger)
    rows = {charge("camp-ttl", customer=f"c{i}").key: f"c{i}" for i in range(3)}
    old = {charge("camp-ttl", customer="gone").key: "gone"}
    plan = _plan("camp-ttl", list(rows))
    assert store.freeze(plan, rows, removed=old, ttl_s=TTL_S)
    store.mark_sent("camp-ttl", 1, list(rows)[:2], ttl_s=TTL_S)
    store.touch(plan, 2 * TTL_S)
    names = [
        f"{ledger.namespace}:campaign:{campaign_tag('camp-ttl')}{suffix}"
        for suffix in ("", f":plan:1:{plan.plan_fingerprint[:16]}",
                       f":removed:1:{plan.plan_fingerprint[:16]}", ":sent:1")
    ]  # fmt: skip
    for name in names:
        assert TTL_S < ledger.client.pttl(name) / 1000 <= 2 * TTL_S, name


def test_counts_cover_the_approved_plan_only(ledger_server: RedisServer | LocalCluster) -> None:
    ledger: Ledger = fresh_ledger(ledger_server.url)
    store = CampaignStore(ledger)
    tag = campaign_tag("camp-counts")
    effects = [charge("camp-counts", customer=f"d{i}") for i in range(3)]
    v1 = _plan("camp-counts", [e.key for e in effects])
    assert store.freeze(v1, {e.key: str(i) for i, e in enumerate(effects)})
    for effect in effects:
        claim = ledger.claim(effect, lease_s=30, holder="w/1", campaign=tag)
        ledger.commit(effect.key, claim.token, {"id": effect.key[:8]}, retention_s=RETENTION_S)
    assert store.state_counts("camp-counts")[State.DONE.value] == 3
    kept = {e.key: str(i) for i, e in enumerate(effects[:2])}
    v2 = _plan("camp-counts", list(kept), version=2)
    assert store.freeze(v2, kept, approved=v1, removed={effects[2].key: "2"})
    assert store.state_counts("camp-counts")[State.DONE.value] == 2


def test_a_campaign_id_used_again_after_its_plan_expired_counts_from_zero(
    ledger_server: RedisServer | LocalCluster,
) -> None:
    ledger = fresh_ledger(ledger_server.url)
    store = CampaignStore(ledger)
    tag = campaign_tag("camp-again")
    earlier = charge("camp-again", customer="e0")
    claim = ledger.claim(earlier, lease_s=30, holder="w/1", campaign=tag)
    ledger.commit(earlier.key, claim.token, {"id": "e0"}, retention_s=RETENTION_S)
    # The earlier life's plan and record are gone; the bucket counters are not.
    ledger.client.delete(f"{ledger.namespace}:campaign:{tag}")
    rows = {charge("camp-again", customer=f"f{i}").key: f"f{i}" for i in range(2)}
    plan = _plan("camp-again", list(rows))
    assert store.freeze(plan, rows, ttl_s=TTL_S)
    assert store.state_counts("camp-again")[State.DONE.value] == 0
    assert store.freeze(plan, rows, ttl_s=TTL_S)  # the same plan again keeps its baseline
    first = charge("camp-again", customer="f0")
    claim = ledger.claim(first, lease_s=30, holder="w/1", campaign=tag)
    ledger.commit(first.key, claim.token, {"id": "f0"}, retention_s=RETENTION_S)
    assert store.state_counts("camp-again")[State.DONE.value] == 1


def test_staging_says_which_keys_are_new_and_the_digest_ignores_order(
    ledger_server: RedisServer | LocalCluster,
) -> None:
    from dedupe.campaigns import PlanDigest

    ledger = fresh_ledger(ledger_server.url)
    store = CampaignStore(ledger)
    keys = [charge("camp-stage", customer=f"g{i}").key for i in range(4)]
    plan = CampaignPlan("camp-stage", "charge", "default", 1, 0, "", "", rows_id="0" * 16)
    assert store.stage(plan, {k: "x" for k in keys[:3]}, TTL_S) == [True] * 3
    assert store.stage(plan, {keys[1]: "y", keys[3]: "z"}, TTL_S) == [False, True]
    assert store.plan_keys(plan) == set(keys)
    forward, backward = PlanDigest(), PlanDigest()
    for key in keys:
        forward.add(key)
    for key in reversed(keys):
        backward.add(key)
    assert forward.hexdigest() == backward.hexdigest() and forward.count == 4
    fewer = PlanDigest()
    for key in keys[:3]:
        fewer.add(key)
    assert fewer.hexdigest() != forward.hexdigest()
    store.discard(plan)
    assert store.plan_keys(plan) == set()
