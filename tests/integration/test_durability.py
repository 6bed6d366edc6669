"""Durability modes (DESIGN §2): workers refuse a ledger Redis without AOF unless told the
ledger may be volatile, and the ``WAIT``-for-replicas mode measured against a real failover
(SIGKILL of the primary, ``REPLICAOF NO ONE`` on its replica)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from dedupe import (
    CampaignPlan,
    CampaignStore,
    ClaimOutcome,
    Ledger,
    LedgerError,
    LedgerUnavailableError,
    VolatileLedgerError,
)
from tests.support.ledgers import charge, poll
from tests.support.stack import wait_for
from workers.dev.redis_server import RedisServer, default_redis_binary

LOCAL = "redis://127.0.0.1:6379"
LEDGER_DB, BROKER_DB = 14, 15


def _local_or_skip() -> redis.Redis:
    client = redis.Redis.from_url(f"{LOCAL}/{LEDGER_DB}", socket_connect_timeout=1.0)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"no Redis on 127.0.0.1:6379 ({exc}); CI=true requires it")
        pytest.skip(f"no Redis on 127.0.0.1:6379 ({exc})")
    if int(client.info("persistence").get("aof_enabled", 0)) == 1:
        pytest.skip("the pre-started Redis on 6379 has AOF on: not a volatile ledger")
    return client


class _Pool:
    """One ``python -m workers worker`` against the volatile 6379, in a namespace and queue
    of its own (both removed afterwards: only what this test created)."""

    def __init__(self, workdir: Path) -> None:
        tag = uuid.uuid4().hex[:10]
        self.namespace = f"eqdur{tag}"
        self.queue = f"eqdur{tag}"
        self.log_path = workdir / f"worker-{tag}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECTQ_")}
        env.update(
            EFFECTQ_REDIS_URL=f"{LOCAL}/{LEDGER_DB}",
            EFFECTQ_BROKER_URL=f"{LOCAL}/{BROKER_DB}",
            EFFECTQ_NAMESPACE=self.namespace,
            # The machine's Redis holds every earlier run's namespaces: a new one on purpose.
            EFFECTQ_ALLOW_NEW_NAMESPACE="true",
            EFFECTQ_QUEUE=self.queue,
            EFFECTQ_METRICS_PORT="0",
            EFFECTQ_PROVIDER_URL="http://127.0.0.1:9",  # never reached: nothing valid is sent
            PYTHONUNBUFFERED="1",
            **extra,
        )
        return env

    def start(self, *cmd: str, **extra: str) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *cmd],
                env=self.env(**extra),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.proc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def cleanup(self) -> None:
        for db, pattern in ((LEDGER_DB, f"*{self.namespace}*"), (BROKER_DB, f"*{self.queue}*")):
            client = redis.Redis.from_url(f"{LOCAL}/{db}")
            names = list(client.scan_iter(match=pattern, count=1000))
            if names:
                client.delete(*names)
            client.close()


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[_Pool]:
    _local_or_skip().close()
    p = _Pool(tmp_path)
    yield p
    p.stop()
    p.cleanup()


REFUSAL = "the ledger Redis has no AOF persistence (appendonly no)"


def test_worker_pool_refuses_to_start_on_a_ledger_without_aof(pool: _Pool) -> None:
    proc = pool.start("-m", "workers", "worker", "-p", "1", "-t", "1")
    code = proc.wait(timeout=30)  # refuses at start: no message needed to see it
    log = pool.log()
    assert code == 2, log
    assert REFUSAL in log
    assert "EFFECTQ_ALLOW_VOLATILE_LEDGER=true" in log
    # One clear line, no traceback, and no worker process was ever spawned.
    assert "Traceback" not in log
    assert [line for line in log.splitlines() if line.strip()] == [
        line for line in log.splitlines() if line.startswith("effectq: ")
    ]


def test_plain_dramatiq_worker_refuses_to_boot_too(pool: _Pool) -> None:
    # The second line of defence: `dramatiq workers.entry` (what the supervisor runs) without
    # the effectq CLI stops in the middleware's before_worker_boot.
    proc = pool.start("-m", "dramatiq", "workers.entry", "-p", "1", "-t", "1")
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"dramatiq kept running on a volatile ledger:\n{pool.log()[-2000:]}")
    log = pool.log()
    assert code != 0, log
    assert "refusing to start" in log and REFUSAL in log


def test_volatile_ledger_is_served_when_explicitly_allowed(pool: _Pool) -> None:
    proc = pool.start(
        "-m", "workers", "worker", "-p", "1", "-t", "2", EFFECTQ_ALLOW_VOLATILE_LEDGER="true"
    )
    ledger = Ledger.from_url(f"{LOCAL}/{LEDGER_DB}", namespace=pool.namespace, allow_volatile=True)
    broker = RedisBroker(url=f"{LOCAL}/{BROKER_DB}")  # type: ignore[no-untyped-call]
    try:
        # Serving: a malformed message on its queue comes back as a dead-letter record.
        broker.enqueue(
            dramatiq.Message(
                queue_name=pool.queue, actor_name="send_email", args=("junk",), kwargs={},
                options={},
            )
        )  # fmt: skip
        wait_for(lambda: ledger.dead_letters(), timeout=45, what="dead-letter from the pool")
    finally:
        broker.close()
    assert proc.poll() is None, pool.log()
    [dead] = ledger.dead_letters()
    assert "exactly one envelope" in dead["reason"]
    assert REFUSAL not in pool.log()


def test_ledger_constructor_refuses_volatile_redis(local_redis: redis.Redis) -> None:
    with pytest.raises(VolatileLedgerError, match="no AOF persistence"):
        Ledger.from_url(f"{LOCAL}/{LEDGER_DB}", namespace=f"t{uuid.uuid4().hex[:8]}")


# -- WAIT for replicas: a real failover ---------------------------------------------------

TRIALS = int(os.environ.get("EFFECTQ_FAILOVER_TRIALS", "100"))
BURST = 5  # claims per trial; the primary is killed right after the last is acknowledged


class _Pair:
    """Two redis-servers; one is primary, the other its replica. ``failover`` SIGKILLs the
    primary, promotes the replica and restarts the dead one as the new replica."""

    def __init__(self, workdir: Path) -> None:
        # No persistence: what survives is what replication delivered, nothing else.
        common = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
        binary = default_redis_binary()
        self.servers = [
            RedisServer(binary, workdir / "a", aof=False, extra_args=common),
            RedisServer(binary, workdir / "b", aof=False, extra_args=common),
        ]
        self.primary, self.replica = self.servers

    def start(self) -> None:
        for server in self.servers:
            server.start()
        self._attach()

    def _attach(self) -> None:
        self.replica.client().replicaof("127.0.0.1", self.primary.port)
        primary = self.primary.client()

        def online() -> bool:
            info = primary.info("replication")
            slave = info.get("slave0")
            return isinstance(slave, dict) and slave.get("state") == "online"

        wait_for(online, timeout=20, what="replica online")
        replica = self.replica.client()
        wait_for(
            lambda: replica.info("replication").get("master_link_status") == "up",
            timeout=20,
            what="replica link up",
        )

    def failover(self) -> redis.Redis:
        self.primary.kill()
        promoted = self.replica.client(decode_responses=True)
        promoted.replicaof("NO", "ONE")
        return promoted

    def rejoin(self) -> None:
        dead = self.primary
        dead.start()
        self.primary, self.replica = self.replica, dead
        self._attach()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def _trials(pair: _Pair, wait_replicas: int, trials: int) -> dict[str, int]:
    figures = {"acknowledged": 0, "lost": 0, "refused": 0}
    namespace = f"f{uuid.uuid4().hex[:8]}"
    for _ in range(trials):
        ledger = Ledger(
            pair.primary.client(decode_responses=True),
            namespace=namespace,
            allow_volatile=True,
            wait_replicas=wait_replicas,
        )
        acknowledged = []
        for _ in range(BURST):
            effect = charge()
            try:
                claim = ledger.claim(effect, lease_s=30, holder="trial/1")
            except LedgerUnavailableError:
                figures["refused"] += 1  # not acknowledged by the replica: never acted on
                continue
            assert claim.outcome is ClaimOutcome.ACQUIRED
            acknowledged.append(effect.key)
        promoted = pair.failover()
        after = Ledger(promoted, namespace=namespace, allow_volatile=True)
        survived = after.get_many(acknowledged)
        figures["acknowledged"] += len(acknowledged)
        figures["lost"] += sum(1 for record in survived.values() if record is None)
        pair.rejoin()
    return figures


@pytest.mark.slow
def test_wait_replicas_keeps_acknowledged_claims_across_a_primary_kill(tmp_path: Path) -> None:
    pair = _Pair(tmp_path)
    pair.start()
    try:
        started = time.monotonic()
        waited = _trials(pair, 1, TRIALS)
        plain = _trials(pair, 0, TRIALS)
        elapsed = time.monotonic() - started
    finally:
        pair.stop()
    print(
        f"\nfailover x{TRIALS} ({BURST} claims each, {elapsed:.1f}s): "
        f"WAIT=1 {waited}; no WAIT {plain}"
    )
    # What Redis promises: a write the replica acknowledged (WAIT) is on the replica, so
    # promoting it keeps every acknowledged claim. Without WAIT nothing is promised: the
    # count is measured and reported, not asserted (on one machine it is usually 0).
    assert waited["acknowledged"] > 0
    assert waited["lost"] == 0, waited
    assert plain["acknowledged"] + plain["refused"] == TRIALS * BURST
    assert plain["refused"] == 0


@pytest.mark.slow
def test_lagging_replica_wait_refuses_the_claim_plain_mode_loses_it(tmp_path: Path) -> None:
    """The deterministic form of the window: the replica is frozen (SIGSTOP) and its link
    cut (CLIENT KILL TYPE replica) while a claim is made, then the primary dies and the
    replica is promoted. Without WAIT the claim was acknowledged and is gone (the promoted
    replica grants it again); with WAIT it was never acknowledged (LedgerUnavailableError:
    the worker does not act on it)."""
    pair = _Pair(tmp_path)
    pair.start()
    try:
        outcomes: dict[int, str] = {}
        for wait_replicas in (1, 0):
            ledger = Ledger(
                pair.primary.client(decode_responses=True),
                namespace=f"g{uuid.uuid4().hex[:8]}",
                allow_volatile=True,
                wait_replicas=wait_replicas,
                wait_timeout_ms=300,
            )
            effect = charge()
            pair.replica.sigstop()
            pair.primary.client().client_kill_filter(_type="replica")
            try:
                ledger.claim(effect, lease_s=30, holder="lag/1")
                outcomes[wait_replicas] = "acknowledged"
            except LedgerUnavailableError as exc:
                assert "acknowledged by 0 of 1 replicas" in exc.message
                outcomes[wait_replicas] = "refused"
            pair.primary.kill()  # before the replica can reconnect
            pair.replica.sigcont()
            promoted = pair.failover()
            after = Ledger(promoted, namespace=ledger.namespace, allow_volatile=True)
            survived = after.get(effect.key) is not None
            outcomes[wait_replicas] += ", survived" if survived else ", lost"
            if outcomes[wait_replicas] == "acknowledged, lost":
                # The promoted replica grants the same effect a second time.
                again = after.claim(effect, lease_s=30, holder="lag/2")
                assert again.outcome is ClaimOutcome.ACQUIRED
            pair.rejoin()
    finally:
        pair.stop()
    print(f"\nfrozen replica: WAIT=1 {outcomes[1]}; no WAIT {outcomes[0]}")
    assert outcomes[1].startswith("refused")
    assert outcomes[0] == "acknowledged, lost"


# -- eviction and server refusals (issue 15, item 2) ---------------------------------------


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_an_evicting_redis_is_refused_as_a_ledger(
    redis_binary: str, tmp_path: Path, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # allkeys-*: a live CLAIMED record can be evicted and its claim granted again;
    # volatile-*: DONE records (they carry a TTL) go first, and the effect runs again.
    monkeypatch.delenv("EFFECTQ_ALLOW_VOLATILE_LEDGER", raising=False)
    evicting = ("--maxmemory-policy", policy, "--maxmemory", "64mb")
    with RedisServer(redis_binary, tmp_path, aof=True, extra_args=evicting) as server:
        with pytest.raises(VolatileLedgerError, match=f"maxmemory-policy is {policy}"):
            Ledger.from_url(server.url)
        Ledger.from_url(server.url, allow_volatile=True)  # explicitly allowed: served


def test_a_full_redis_is_ledger_unavailable_never_bad_input(redis_server: RedisServer) -> None:
    ledger = Ledger.from_url(redis_server.url, namespace=f"oom{uuid.uuid4().hex[:8]}")
    held = charge()
    claim = ledger.claim(held, lease_s=30, holder="w/1")
    finished = charge()
    done = ledger.claim(finished, lease_s=30, holder="w/1")
    assert ledger.commit(finished.key, done.token, {"id": "r"}, retention_s=60).ok
    store = CampaignStore(ledger)
    plan = CampaignPlan("c-1", "charge", "default", 1, 1, "a", "b")
    admin = redis_server.client()
    admin.config_set("maxmemory", 1)  # noeviction and over the limit: every write refused
    try:
        attempts = {
            "claim": lambda: ledger.claim(charge(), lease_s=30, holder="w/2"),
            "heartbeat": lambda: ledger.heartbeat(held.key, claim.token, lease_s=30),
            "commit": lambda: ledger.commit(held.key, claim.token, {"id": "x"}, retention_s=60),
            "fail": lambda: ledger.fail(held.key, claim.token, reason="x", retention_s=60),
            "handover": lambda: ledger.handover(held.key, claim.token, reason="x"),
            "submit": lambda: ledger.submit(charge(), message_id="m", pending_s=60),
            "submit_many": lambda: ledger.submit_many([(charge(), "m")], pending_s=60),
            "operate": lambda: ledger.operate(finished.key, "revoke", note="x", retention_s=60),
            "dead_letter": lambda: ledger.dead_letter(
                message_id="m", tool="charge", key=held.key, reason="x"
            ),
            "audit": lambda: ledger.audit(action="revoke", key=held.key),
            "members": lambda: ledger.members("reconcilers", "r/1", ttl_s=10),
            "freeze": lambda: store.freeze(plan, {held.key: "cus_1"}),
            "mark_sent": lambda: store.mark_sent("c-1", 1, [held.key]),
        }
        written = set()
        for name, attempt in attempts.items():
            try:
                attempt()
            except LedgerUnavailableError as exc:
                assert "OOM" in exc.message, (name, exc.message)
            except LedgerError as exc:
                pytest.fail(f"{name}: OOM reported as {type(exc).__name__}: {exc.message}")
            else:
                written.add(name)
        # A ledger Function is refused whole by a full server, before it runs. An EVALSHA
        # script (Redis 6.2) is checked at its first write only: a revoke's first write (ZREM
        # of the lease entry) frees memory, so that script runs whole. Every other call
        # was refused before it wrote anything.
        assert written == (set() if ledger._script.functions else {"operate"})
        # Reads still answer: an operator can look while the server is full.
        record = ledger.get(held.key)
        assert record is not None and record.token == claim.token
    finally:
        admin.config_set("maxmemory", 0)
    assert ledger.commit(held.key, claim.token, {"id": "x"}, retention_s=60).ok


def test_a_redis_that_cannot_persist_is_ledger_unavailable(redis_server: RedisServer) -> None:
    """MISCONF: an RDB snapshot failed (here its child is SIGKILLed) and the server stops
    taking writes (stop-writes-on-bgsave-error). A claim then is "try later", not bad input."""
    ledger = Ledger.from_url(redis_server.url, namespace=f"mis{uuid.uuid4().hex[:8]}")
    held = charge()
    claim = ledger.claim(held, lease_s=30, holder="w/1")
    admin = redis_server.client(decode_responses=True)
    admin.config_set("save", "3600 1")  # writes stop only while snapshots are configured
    admin.config_set("rdb-key-save-delay", 1_000_000)  # the snapshot child stays alive
    admin.bgsave()
    children = Path(f"/proc/{redis_server.pid}/task/{redis_server.pid}/children")
    [child] = poll(lambda: children.read_text().split(), bool, timeout=10)
    os.kill(int(child), signal.SIGKILL)
    poll(lambda: admin.info("persistence"), lambda i: i["rdb_bgsave_in_progress"] == 0)
    assert admin.info("persistence")["rdb_last_bgsave_status"] == "err"
    try:
        with pytest.raises(LedgerUnavailableError, match="MISCONF"):
            ledger.claim(charge(), lease_s=30, holder="w/2")
        with pytest.raises(LedgerUnavailableError, match="MISCONF"):
            ledger.commit(held.key, claim.token, {"id": "r"}, retention_s=60)
    finally:
        admin.config_set("rdb-key-save-delay", 0)
        admin.config_set("save", "")
    assert ledger.commit(held.key, claim.token, {"id": "r"}, retention_s=60).ok
