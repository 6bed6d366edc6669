"""A process under ``effectq worker`` and its supervisor: it dies with its parent, and it
beats while it makes progress (``Heartbeat``). Both are set by the supervisor through the
child's environment (``SUPERVISOR_PID_ENV``, ``HEARTBEAT_FILE_ENV``).

The parent-death signal: a Dramatiq worker process whose main process was SIGKILLed is
re-parented (to PID 1 or a subreaper) and goes on consuming beside the replacement its
supervisor starts; a Dramatiq main process whose supervisor died goes on too, unsupervised.
Each of them asks Linux for a signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``):
SIGTERM, a shutdown like any other, so it drains — it stops consuming, finishes the calls it
runs and never acks an unfinished one (DESIGN §3: a shutdown signal however delivered
drains; it never kills a call).

Run as ``python -m workers.lifeline <dramatiq arguments>``, this module is the Dramatiq main
process the supervisor starts: it arms the signal against the supervisor
(``EFFECTQ_SUPERVISOR_PID``), then runs Dramatiq's CLI. ``workers.entry`` arms it in each
worker process against the main process that forked it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import dramatiq

__all__ = [
    "HEARTBEAT_FILE_ENV",
    "SUPERVISOR_PID_ENV",
    "Heartbeat",
    "die_with_parent",
    "heartbeat_from_environment",
]

log = logging.getLogger("effectq.worker")
# The heartbeat's records keep the name they had as a module of their own.
beat_log = logging.getLogger("workers.heartbeat")

#: The supervisor's pid, in each Dramatiq main process's environment.
SUPERVISOR_PID_ENV = "EFFECTQ_SUPERVISOR_PID"
#: Where the supervisor tells a child its heartbeat file is.
HEARTBEAT_FILE_ENV = "EFFECTQ_HEARTBEAT_FILE"

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _arm(signum: int) -> bool:
    """Ask Linux for ``signum`` when the parent dies; False where that cannot be asked."""
    if not sys.platform.startswith("linux"):
        # No parent-death signal elsewhere (macOS, the BSDs: a developer's machine): the
        # process outlives a SIGKILLed parent until a signal to its group reaches it.
        return False
    # The running program's own symbols (libc's among them): ``find_library("c")`` would
    # run ``ldconfig -p``, a process in the pool's tree at every boot.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        log.warning("parent-death signal not set: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


def die_with_parent(expected_parent: int, signum: int = signal.SIGTERM) -> bool:
    """Get ``signum`` when the parent dies; False when it died already (this process was
    re-parented before the signal was armed, so none will come): then leave at once.

    The signal follows the parent *thread* that forked this process: fork from the main
    thread of a process that lives as long as its children should."""
    _arm(signum)
    # Checked after arming: a parent that dies from here on sends the signal; one that died
    # before left this process with another parent already.
    return os.getppid() == expected_parent


# -- the liveness heartbeat ------------------------------------------------------------------


class Heartbeat(dramatiq.Middleware):
    """A Dramatiq worker process's liveness heartbeat, read by its supervisor's ``/healthz``.

    The supervisor names a file per child (``EFFECTQ_HEARTBEAT_FILE``, in the pool's metrics
    directory). Once the worker consumes (Dramatiq's worker booted, a consumer thread running)
    a thread of this process creates the file, then touches it every ``tick_s`` — but only
    while the worker makes progress:

    * every consumer and worker thread Dramatiq started is alive (a consumer that died leaves
      the process up and the queue unread);
    * some worker thread is idle (polling the work queue), or a worker thread started or
      finished a message within ``stall_s``. Every thread inside one message for longer than
      that is stuck as far as anyone can tell: keep ``stall_s`` above the longest tool call.

    A frozen process (SIGSTOP, a deadlock holding the GIL, swapped out) touches nothing at all.
    The supervisor reads the file's age: no file yet means not ready; older than ``stall_s``
    means stalled.
    """

    def __init__(self, path: Path, *, stall_s: float) -> None:
        self.path = path
        self.stall_s = stall_s
        self.tick_s = min(max(stall_s / 4, 0.05), 5.0)
        self._lock = threading.Lock()
        self._busy: dict[int, float] = {}  # worker thread → when its message started
        self._last_progress = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._consumers = 0
        self._started = False

    # -- Dramatiq's hooks -------------------------------------------------------------

    def after_consumer_thread_boot(self, broker: dramatiq.Broker, thread: Any) -> None:
        with self._lock:
            self._consumers += 1
            self._threads.append(thread)

    def after_worker_thread_boot(self, broker: dramatiq.Broker, thread: Any) -> None:
        with self._lock:
            self._threads.append(thread)

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._run, name="effectq-heartbeat", daemon=True).start()

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        now = time.monotonic()
        with self._lock:
            self._busy[threading.get_ident()] = now
            self._last_progress = now

    def after_process_message(
        self, broker: dramatiq.Broker, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        self._finished()

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self._finished()

    # -- the heartbeat ----------------------------------------------------------------

    def _finished(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._busy.pop(threading.get_ident(), None)
            self._last_progress = now

    def progressing(self) -> bool:
        """Whether this worker is consuming and its threads make progress (see above)."""
        with self._lock:
            if self._consumers == 0 or not all(t.is_alive() for t in self._threads):
                return False
            workers = len(self._threads) - self._consumers
            if len(self._busy) < workers:
                return True
            return time.monotonic() - self._last_progress <= self.stall_s

    def _run(self) -> None:
        withheld = False
        while True:
            if self.progressing():
                try:
                    self.path.touch()
                except OSError as exc:
                    beat_log.error("heartbeat: cannot touch the heartbeat file: %s", exc.strerror)
                withheld = False
            elif not withheld and self._consumers:
                withheld = True
                beat_log.warning(
                    "no progress for %gs (a thread died, or every worker thread is stuck "
                    "in a message): heartbeat withheld",
                    self.stall_s,
                )
            time.sleep(self.tick_s)


def heartbeat_from_environment(stall_s: float) -> Heartbeat | None:
    """The heartbeat the supervisor asked this process for, if any."""
    path = os.environ.get(HEARTBEAT_FILE_ENV, "")
    return Heartbeat(Path(path), stall_s=stall_s) if path else None


# -- the Dramatiq main process ---------------------------------------------------------------


def main() -> None:
    """The Dramatiq main process of one supervisor slot: Dramatiq's CLI, armed."""
    from collections.abc import Callable
    from pathlib import Path

    import dramatiq
    import dramatiq.cli

    dramatiq_main: Callable[[], int] = dramatiq.cli.main  # untyped upstream

    expected = os.environ.get(SUPERVISOR_PID_ENV)
    if not die_with_parent(int(expected) if expected else os.getppid()):
        sys.stderr.write("effectq: the supervisor died before this pool started; exiting\n")
        sys.exit(0)
    # As `python -m dramatiq` would see it: Dramatiq's reload (SIGHUP with --watch) execs
    # sys.argv[0] as that module, and the armed signal survives the exec.
    sys.argv[0] = str(Path(dramatiq.__file__).with_name("__main__.py"))
    # Dramatiq's own lines (booting, signals, shutdown) in effectq's format: JSON with
    # EFFECTQ_LOG_FORMAT=json like every other line of the pool.
    from . import logs

    sys.argv[1:1] = logs.dramatiq_main_args()
    sys.exit(dramatiq_main())


if __name__ == "__main__":
    main()
