"""``effectq worker``: a pool of Dramatiq worker processes that survives their deaths.

Dramatiq's own CLI shuts the whole pool down when one worker process dies. Here each
process is its own ``dramatiq -p 1`` child, restarted when it exits unexpectedly (with a
bounded backoff), and SIGTERM/SIGINT are passed through for a graceful drain: Dramatiq
finishes the messages it is running (up to ``--worker-shutdown-timeout``) and never acks
an unfinished one.

Children die with their parent (``workers.lifeline``): each Dramatiq main process gets
SIGTERM when this supervisor dies, each worker process when its main process dies, so none
goes on consuming unsupervised beside a replacement; they drain like on any shutdown.

The pool is one process group, the supervisor's (it leads it when started by a shell,
systemd or a container runtime), and a re-parented worker process stays in it. When a child
exits, the supervisor looks for strays: processes of its group that carry its pid in their
environment (``EFFECTQ_SUPERVISOR_PID``: started under it, never another program's) and no
longer descend from it. Each is logged with its pid, counted
(``effectq_worker_strays_total``), sent SIGTERM (its second, ignored) and waited for, at
shutdown too. Off Linux there is neither the parent-death signal nor /proc: a stray goes on
until a signal to the group reaches it.

A signal to the whole group (``kill -TERM -PGID``, a terminal's Ctrl-C) or cgroup
(systemd's ``KillMode=control-group``) reaches every process, so a worker process gets the
shutdown two or three times; it counts only the first (``workers.broker.middleware``), and the
drain goes on. A SIGKILL to the group (an impatient operator, a test harness) still takes
the whole pool, and systemd signals the whole cgroup whatever the groups, so a group per
child would not spare them anyway. A worker process that cannot reach its ledger at boot
exits before consuming, and is restarted here with the same backoff.

Metrics: the supervisor gives its children a prometheus-client multiprocess directory of
its own (``PROMETHEUS_MULTIPROC_DIR`` in their environment, so it is set before any of
them imports prometheus-client), serves the sum over it with the ledger's scrape-time
series on ``EFFECTQ_METRICS_PORT``, and reaps the files of dead worker processes.

Health, on the same port (docs/observability.md): each child's worker process touches a
heartbeat file of its own in that directory while it makes progress
(``workers.lifeline.Heartbeat``).
``/healthz`` fails while a child is dead and not yet restarted, when a child's heartbeat is
older than ``EFFECTQ_HEALTH_STALL_S`` (its first one counts from its start), and after more
than ``EFFECTQ_HEALTH_MAX_RESTARTS`` restarts within ``EFFECTQ_HEALTH_RESTART_WINDOW_S``;
``/readyz`` fails until every child consumes and while the ledger does not answer.
``effectq_worker_restarts_total`` counts the restarts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily

from . import lifeline
from .metrics import WorkerRestarts
from .metrics import server as metrics
from .settings import Settings, ledger_from_settings

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from dedupe import Ledger

__all__ = ["ENTRY", "Supervisor"]

log = logging.getLogger("effectq.worker")


@dataclass
class _Child:
    slot: int
    proc: subprocess.Popen[bytes]
    beat: Path
    started: float = field(default_factory=time.monotonic)
    restarts: int = 0
    # Wall clock, as the heartbeat file's mtime is: its first heartbeat is due from here.
    spawned_at: float = field(default_factory=time.time)
    exited: bool = False  # its exit seen (and its group looked at for strays)

    def heartbeat_age(self, now: float) -> tuple[bool, float]:
        """(whether it has sent one, seconds since the last one or since the spawn)."""
        try:
            return True, now - self.beat.stat().st_mtime
        except OSError:
            return False, now - self.spawned_at


#: What each child imports: its runtime from the environment, with EFFECTQ_TOOLS bound.
ENTRY = "workers.entry"

_PROC = Path("/proc")


def strays(supervisor: int) -> set[int]:
    """Processes started under ``supervisor`` that were re-parented away from it: live (not
    zombie) members of its process group, its pid in their environment, not its
    descendants. Read from /proc; empty where there is none (macOS: not counted there)."""
    if not _PROC.is_dir():
        return set()
    group = os.getpgid(supervisor)
    parents: dict[int, int] = {}  # the group's live members: their parent
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        state, ppid, pgrp = stat.rpartition(")")[2].split()[:3]
        if state != "Z" and int(pgrp) == group:
            parents[int(entry.name)] = int(ppid)

    def descends(pid: int) -> bool:
        for _ in range(len(parents) + 1):  # a bound: /proc read over time may hold a loop
            if pid == supervisor:
                return True
            if pid not in parents:
                return False
            pid = parents[pid]
        return False

    mark = f"{lifeline.SUPERVISOR_PID_ENV}={supervisor}".encode()
    return {p for p in parents if not descends(p) and mark in _environment(p)}


def _environment(pid: int) -> list[bytes]:
    """The environment ``pid`` was started with (a forked child: its parent's); [] when it
    cannot be read (gone, or not ours)."""
    try:
        return (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


class _Counts:
    """The supervisor's own series: its restarts and ``effectq_worker_strays_total``."""

    def __init__(self, restarts: WorkerRestarts) -> None:
        self.restarts = restarts
        self.strays = 0

    def collect(self) -> Iterator[Metric]:
        yield from self.restarts.collect()
        yield CounterMetricFamily(
            "effectq_worker_strays",
            "Processes started under this supervisor found re-parented away from it.",
            value=self.strays,
        )


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
        self._dir: Path | None = None  # the pool's metrics directory, once run() made it
        self.restarts = WorkerRestarts()
        self._counts = _Counts(self.restarts)
        self._strays: set[int] = set()  # found, not yet gone
        self._strays_checked = 0.0
        self._recent: deque[float] = deque()  # when each restart happened (monotonic)
        self._recent_lock = threading.Lock()  # the probes read it from their threads
        self._ledger: Ledger | None = None

    def command(self) -> list[str]:
        # Dramatiq's CLI, armed to die with this supervisor (workers.lifeline).
        cmd = [sys.executable, "-m", "workers.lifeline", ENTRY, "-p", "1", "-t", str(self.threads)]
        cmd += ["--worker-shutdown-timeout", str(self.shutdown_timeout_ms)]
        # No fork processes to hold back: Dramatiq's wait for the boot (30 s by default) would
        # leave a worker process that died while booting unseen, and its restart late.
        cmd += ["--worker-fork-timeout", "10"]
        if self.queues:
            cmd += ["-Q", *self.queues]
        return cmd + self.extra_args

    def _spawn(self, slot: int, restarts: int = 0) -> None:
        assert self._dir is not None, "children are spawned by run()"
        beat = self._dir / f"heartbeat-{slot}"
        beat.unlink(missing_ok=True)  # a predecessor's heartbeat is not this child's
        env = {
            **self._env,
            lifeline.HEARTBEAT_FILE_ENV: str(beat),
            lifeline.SUPERVISOR_PID_ENV: str(os.getpid()),
        }
        proc = subprocess.Popen(self.command(), env=env)
        self._children[slot] = _Child(slot, proc, beat, restarts=restarts)
        log.info("worker %d started (pid %d)", slot, proc.pid)

    # -- probes (called from the metrics server's threads) ------------------------------

    def _problems(self) -> Iterator[str]:
        now = time.time()
        stall_s = self.settings.health_stall_s
        for child in list(self._children.values()):
            code = child.proc.poll()
            if code is not None:
                yield f"worker {child.slot} exited with {code}, not restarted yet"
                continue
            sent, age = child.heartbeat_age(now)
            if age > stall_s:
                what = "heartbeat" if sent else "first heartbeat"
                yield f"worker {child.slot} stalled: no {what} for {age:.0f}s (limit {stall_s:g}s)"
        window = self.settings.health_restart_window_s
        with self._recent_lock:
            recent = sum(1 for at in self._recent if time.monotonic() - at <= window)
        if recent > self.settings.health_max_restarts:
            yield (
                f"{recent} restarts within {window:g}s (limit {self.settings.health_max_restarts})"
            )

    def health(self) -> metrics.Check:
        """Liveness: no dead, stalled or crash-looping child (always ok while draining)."""
        if self._stopping:
            return metrics.Check(True, ("draining",))
        return metrics.Check.of(self._problems())

    def ready(self) -> metrics.Check:
        """Readiness: every child consumes (it sent a heartbeat) and the ledger answers."""
        if self._stopping:
            return metrics.Check(False, ("draining",))
        now = time.time()
        waiting = [
            f"worker {c.slot} not consuming yet"
            for c in list(self._children.values())
            if c.proc.poll() is not None or not c.heartbeat_age(now)[0]
        ]
        if not self._children:
            waiting.append("no worker started yet")
        answer = metrics.ledger_answers(self._read_ledger)
        return metrics.Check.of([*waiting, *answer.reasons])

    def _read_ledger(self) -> Ledger:
        # Built at the first scrape or probe, kept: the pool's own connection.
        if self._ledger is None:
            self._ledger = ledger_from_settings(self.settings)
        return self._ledger

    def _restarted(self) -> None:
        self.restarts.inc()
        now = time.monotonic()
        with self._recent_lock:
            self._recent.append(now)
            while self._recent and now - self._recent[0] > self.settings.health_restart_window_s:
                self._recent.popleft()

    def _signal_all(self, signum: int, _frame: object = None) -> None:
        self._stopping = True
        for child in self._children.values():
            if child.proc.poll() is None:
                child.proc.send_signal(signum)
        for pid in self._strays:  # no parent of theirs passes it on
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _look_for_strays(self, child: _Child) -> None:
        """After ``child`` exited: the processes it left behind are counted and drain."""
        found = strays(os.getpid()) - self._strays
        if not found:
            return
        for pid in found:
            # Read just now as ours and alive; its pid cannot pass to another process
            # before it is reaped, and a stray is reaped by its adopter.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        self._strays |= found
        self._counts.strays += len(found)
        log.warning(
            "worker %d (pid %d) exited leaving %d stray process%s re-parented away (pids %s): "
            "sent SIGTERM, waiting for them to drain", child.slot, child.proc.pid, len(found),
            "es" if len(found) > 1 else "", ", ".join(map(str, sorted(found))),
        )  # fmt: skip

    def _watch_strays(self) -> None:
        # Once a second: each look reads /proc.
        if not self._strays or time.monotonic() - self._strays_checked < 1.0:
            return
        self._strays_checked = time.monotonic()
        gone = self._strays - strays(os.getpid())
        if gone:
            self._strays -= gone
            log.info("stray process%s gone: pids %s", "es" if len(gone) > 1 else "",
                     ", ".join(map(str, sorted(gone))))  # fmt: skip

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal_all)
        signal.signal(signal.SIGINT, self._signal_all)
        directory, created = metrics.prepare_dir(self.metrics_dir)
        self._dir = directory
        self._env = {**os.environ, metrics.ENV_DIR: str(directory)}
        server = metrics.serve(
            self.metrics_port,
            self.metrics_host,
            self._read_ledger,
            multiprocess_dir=str(directory),
            broker_url=self.settings.broker_url,
            queues=self.queues or [self.settings.queue],
            extra=self._counts,
            health=self.health,
            ready=self.ready,
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
                if not child.exited:
                    child.exited = True
                    self._look_for_strays(child)
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
                    self._restarted()
                    alive += 1
            self._watch_strays()
            # Strays drain like the rest of the pool: the supervisor outlives them.
            if self._stopping and alive == 0 and not self._strays:
                return 0
            time.sleep(0.2)
