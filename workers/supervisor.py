"""``effectq worker``: a pool of Dramatiq worker processes that survives their deaths.

Dramatiq's own CLI shuts the whole pool down when one worker process dies. Here each
process is its own ``dramatiq -p 1`` child, restarted when it exits unexpectedly (with a
bounded backoff), and SIGTERM/SIGINT are passed through for a graceful drain: Dramatiq
finishes the messages it is running (up to ``--worker-shutdown-timeout``) and never acks
an unfinished one.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Supervisor"]

log = logging.getLogger("effectq.worker")


@dataclass
class _Child:
    slot: int
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    restarts: int = 0


class Supervisor:
    def __init__(
        self,
        module: str,
        *,
        processes: int,
        threads: int,
        queues: Sequence[str] = (),
        shutdown_timeout_ms: int = 600_000,
        extra_args: Sequence[str] = (),
    ) -> None:
        if processes < 1 or threads < 1:
            raise ValueError("processes and threads must be at least 1")
        self.module = module
        self.processes = processes
        self.threads = threads
        self.queues = list(queues)
        self.shutdown_timeout_ms = shutdown_timeout_ms
        self.extra_args = list(extra_args)
        self._children: dict[int, _Child] = {}
        self._stopping = False

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "dramatiq", self.module, "-p", "1", "-t", str(self.threads)]
        cmd += ["--worker-shutdown-timeout", str(self.shutdown_timeout_ms)]
        if self.queues:
            cmd += ["-Q", *self.queues]
        return cmd + self.extra_args

    def _spawn(self, slot: int, restarts: int = 0) -> None:
        proc = subprocess.Popen(self.command())
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
        for slot in range(self.processes):
            self._spawn(slot)
        while True:
            alive = 0
            for child in list(self._children.values()):
                code = child.proc.poll()
                if code is None:
                    alive += 1
                    continue
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
