"""``effectq worker``: a pool of Dramatiq worker processes that survives their deaths.

Dramatiq's own CLI shuts the whole pool down when one worker process dies. Here each
process is its own ``dramatiq -p 1`` child, restarted when it exits unexpectedly (with a
bounded backoff), and SIGTERM/SIGINT are passed through for a graceful drain: Dramatiq
finishes the messages it is running (up to ``--worker-shutdown-timeout``) and never acks
an unfinished one.

A signal to the whole group (``kill -TERM -PGID``, a terminal's Ctrl-C) or cgroup
(systemd's ``KillMode=control-group``) reaches every process, so a worker process gets the
shutdown two or three times; it counts only the first (``workers.broker.middleware``), and the
drain goes on. The children stay in the supervisor's process group: a SIGKILL to the group
(an impatient operator, a test harness) still takes the whole pool, and systemd signals the
whole cgroup whatever the groups, so a session of their own would not spare them anyway.
A worker process that cannot reach its ledger at boot exits before consuming, and is
restarted here with the same backoff.

Metrics: the supervisor gives its children a prometheus-client multiprocess directory of
its own (``PROMETHEUS_MULTIPROC_DIR`` in their environment, so it is set before any of
them imports prometheus-client), serves the sum over it with the ledger's scrape-time
series on ``EFFECTQ_METRICS_PORT``, and reaps the files of dead worker processes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .metrics import server as metrics
from .settings import Settings, ledger_from_settings

if TYPE_CHECKING:
    from dedupe import Ledger

__all__ = ["ENTRY", "Supervisor"]

log = logging.getLogger("effectq.worker")


@dataclass
class _Child:
    slot: int
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    restarts: int = 0


#: What each child imports: its runtime from the environment, with EFFECTQ_TOOLS bound.
ENTRY = "workers.entry"


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        *,
        processes: int,
        threads: int,
        queues: Sequence[str] = (),
        shutdown_timeout_ms: int = 600_000,
        extra_args: Sequence[str] = (),
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        metrics_dir: str | None = None,
    ) -> None:
        if processes < 1 or threads < 1:
            raise ValueError("processes and threads must be at least 1")
        self.settings = settings
        self.processes = processes
        self.threads = threads
        self.queues = list(queues)
        self.shutdown_timeout_ms = shutdown_timeout_ms
        self.extra_args = list(extra_args)
        self.metrics_port = settings.metrics_port if metrics_port is None else metrics_port
        self.metrics_host = settings.metrics_host if metrics_host is None else metrics_host
        self.metrics_dir = settings.metrics_dir if metrics_dir is None else metrics_dir
        self._children: dict[int, _Child] = {}
        self._stopping = False
        self._env: dict[str, str] = dict(os.environ)

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "dramatiq", ENTRY, "-p", "1", "-t", str(self.threads)]
        cmd += ["--worker-shutdown-timeout", str(self.shutdown_timeout_ms)]
        # No fork processes to hold back: Dramatiq's wait for the boot (30 s by default) would
        # leave a worker process that died while booting unseen, and its restart late.
        cmd += ["--worker-fork-timeout", "10"]
        if self.queues:
            cmd += ["-Q", *self.queues]
        return cmd + self.extra_args

    def _spawn(self, slot: int, restarts: int = 0) -> None:
        proc = subprocess.Popen(self.command(), env=self._env)
        self._children[slot] = _Child(slot, proc, restarts=restarts)
        log.info("worker %d started (pid %d)", slot, proc.pid)

    def _signal_all(self, signum: int, _frame: object = None) -> None:
        self._stopping = True
        for child in self._children.values():
            if child.proc.poll() is None:
                child.proc.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal_all)
        signal.signal(signal.SIGINT, self._signal_all)
        directory, created = metrics.prepare_dir(self.metrics_dir)
        self._env = {**os.environ, metrics.ENV_DIR: str(directory)}
        ledger: list[Ledger] = []

        def read_ledger() -> Ledger:
            # Built at the first scrape, kept: the pool's own connection for its series.
            if not ledger:
                ledger.append(ledger_from_settings(self.settings))
            return ledger[0]

        server = metrics.serve(
            self.metrics_port,
            self.metrics_host,
            read_ledger,
            multiprocess_dir=str(directory),
            broker_url=self.settings.broker_url,
            queues=self.queues or [self.settings.queue],
        )
        try:
            return self._supervise(directory)
        finally:
            if server is not None:
                server.close()
            if created:
                metrics.remove_dir(directory)

    def _supervise(self, metrics_dir: Path) -> int:
        for slot in range(self.processes):
            self._spawn(slot)
        while True:
            alive = 0
            for child in list(self._children.values()):
                code = child.proc.poll()
                if code is None:
                    alive += 1
                    continue
                metrics.reap(metrics_dir)
                if self._stopping:
                    continue
                # Quick repeated deaths (a bad import, no broker) back off up to 30 s.
                quick = time.monotonic() - child.started < 10
                restarts = child.restarts + 1 if quick else 0
                delay = min(0.5 * 2**restarts, 30.0) if quick else 0.0
                log.warning(
                    "worker %d (pid %d) exited with %s; restarting in %.1fs",
                    child.slot, child.proc.pid, code, delay,
                )  # fmt: skip
                time.sleep(delay)
                if not self._stopping:
                    self._spawn(child.slot, restarts)
                    alive += 1
            if self._stopping and alive == 0:
                return 0
            time.sleep(0.2)
