"""Fixtures of the cluster tests that work on any module's ``cluster``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import LocalCluster
from tests.support.proxy import ReplyLosingProxy


@pytest.fixture
def healthy(cluster: LocalCluster) -> Iterator[None]:
    """The test ends on a whole, healthy cluster (a node it killed rejoins)."""
    yield
    cluster.heal()


@pytest.fixture
def proxies(cluster: LocalCluster) -> Iterator[dict[int, ReplyLosingProxy]]:
    """One proxy per node; the ledger's client reaches every node through its proxy."""
    made = {node.port: ReplyLosingProxy(node.port) for node in cluster.nodes}
    try:
        yield made
    finally:
        for proxy in made.values():
            proxy.close()
