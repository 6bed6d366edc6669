"""A Redis Cluster ledger whose replies are lost on the wire: redis-py's cluster client
resends a command that timed out (ten times by default, with backoff), which for a claim
means in_flight against its own claim after seconds of waiting. The ledger owns that
decision: a claim is sent once; a commit once more."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dedupe import Ledger, LedgerUnavailableError, State
from tests.support.cluster import LocalCluster, local_cluster
from tests.support.ledgers import RETENTION_S, charge, script_calls
from tests.support.proxy import ReplyLosingProxy

TIMEOUT_S = 0.3


@pytest.fixture(scope="module")
def cluster(redis_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(redis_binary, tmp_path_factory.mktemp("cluster")) as c:
        yield c


def proxied_ledger(cluster: LocalCluster, proxies: dict[int, ReplyLosingProxy]) -> Ledger:
    def remap(address: tuple[str, int]) -> tuple[str, int]:
        host, port = address
        return ("127.0.0.1", proxies[port].port) if port in proxies else (host, port)

    return Ledger.from_url(
        cluster.url, cluster=True, namespace="lost", socket_timeout=TIMEOUT_S,
        address_remap=remap,
    )  # fmt: skip


def cluster_calls(cluster: LocalCluster) -> int:
    return sum(script_calls(node.client()) for node in cluster.masters())


def test_a_claim_whose_reply_is_lost_on_a_cluster_runs_once_and_reports_unavailable(
    cluster: LocalCluster, proxies: dict[int, ReplyLosingProxy]
) -> None:
    ledger = proxied_ledger(cluster, proxies)
    effect = charge("order-lost-on-cluster")
    assert ledger.get(effect.key) is None  # the script is loaded on the key's node
    before = cluster_calls(cluster)
    # The open connections lose their replies; a client that reconnects and resends is
    # heard (and would be told in_flight against its own claim).
    for proxy in proxies.values():
        proxy.lose_replies(on_new_connections=False)
    with pytest.raises(LedgerUnavailableError):
        ledger.claim(effect, lease_s=60, holder="w/1")
    assert cluster_calls(cluster) - before == 1
    direct = Ledger.from_url(cluster.url, cluster=True, namespace="lost")
    record = direct.get(effect.key)
    assert record is not None and record.state is State.CLAIMED and record.holder == "w/1"


def test_a_commit_whose_reply_is_lost_on_a_cluster_is_sent_once_more_and_answers_ok(
    cluster: LocalCluster, proxies: dict[int, ReplyLosingProxy]
) -> None:
    ledger = proxied_ledger(cluster, proxies)
    effect = charge("order-lost-commit-on-cluster")
    claim = ledger.claim(effect, lease_s=60, holder="w/1")
    assert claim.acquired
    before = cluster_calls(cluster)
    for proxy in proxies.values():
        proxy.lose_replies(on_new_connections=False)
    write = ledger.commit(effect.key, claim.token, {"id": "ch_9"}, retention_s=RETENTION_S)
    assert write.ok and not write.fenced
    assert cluster_calls(cluster) - before == 2
    record = Ledger.from_url(cluster.url, cluster=True, namespace="lost").get(effect.key)
    assert record is not None and record.state is State.DONE and record.receipt == {"id": "ch_9"}
