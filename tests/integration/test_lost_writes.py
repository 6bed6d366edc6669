"""A tool whose provider does not deduplicate by key never runs on a ledger that can lose an
acknowledged write unless the operator says so (issue 37, item 3): with appendfsync
everysec a host crash forgets up to about a second of claims and commits, and only the
provider's idempotency key would then stop a second execution."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.dev.redis_server import RedisServer


def _worker(server: RedisServer, tools: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EFFECTQ_")},
        "EFFECTQ_REDIS_URL": server.url,
        "EFFECTQ_BROKER_URL": server.url.rpartition("/")[0] + "/1",
        "EFFECTQ_TOOLS": tools,
        "EFFECTQ_METRICS_PORT": "0",
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-m", "workers", "worker", "-p", "1", "-t", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("policy", ["everysec", "no"])
def test_a_tool_without_provider_idempotency_refuses_a_ledger_that_can_lose_writes(
    redis_server: RedisServer, policy: str
) -> None:
    redis_server.client().config_set("appendfsync", policy)
    done = _worker(redis_server, "tests.support.unkeyed_tools")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"appendfsync {policy}" in line and "smtp_send" in line
    assert "EFFECTQ_ALLOW_LOST_WRITES" in line and "Traceback" not in done.stderr


def test_the_refusal_is_lifted_by_always_wait_or_the_operators_word(
    redis_server: RedisServer,
) -> None:
    from dedupe import Ledger
    from workers.settings import Settings, check_lost_writes

    spec = __import__("tests.support.unkeyed_tools", fromlist=["smtp_send"]).smtp_send.spec
    ledger = Ledger.from_url(redis_server.url, namespace="lw")
    assert ledger.fsync_policy() == "always"
    check_lost_writes(Settings(redis_url=redis_server.url), ledger, [spec])  # always: fine
    redis_server.client().config_set("appendfsync", "everysec")
    assert ledger.fsync_policy() == "everysec"
    for allowed in ({"allow_lost_writes": True}, {"wait_replicas": 1}):
        check_lost_writes(Settings(redis_url=redis_server.url, **allowed), ledger, [spec])  # type: ignore[arg-type]
    keyed = type(spec)(name="keyed", identity=("recipient",), provider_idempotency=True)
    check_lost_writes(Settings(redis_url=redis_server.url), ledger, [keyed])


def test_a_cluster_is_judged_by_its_weakest_master(tmp_path: Path) -> None:
    from dedupe import Ledger
    from tests.support.cluster import local_cluster
    from workers.dev.redis_server import default_redis_binary

    with local_cluster(default_redis_binary(), tmp_path) as cluster:
        ledger = Ledger.from_url(cluster.seeds(), namespace="lw")
        assert ledger.fsync_policy() == "always"
        cluster.masters()[1].client().config_set("appendfsync", "everysec")
        assert ledger.fsync_policy() == "everysec"
