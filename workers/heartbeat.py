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

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import dramatiq

__all__ = ["ENV", "Heartbeat", "from_environment"]

log = logging.getLogger(__name__)

#: Where the supervisor tells a child its heartbeat file is.
ENV = "EFFECTQ_HEARTBEAT_FILE"


class Heartbeat(dramatiq.Middleware):
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
                    log.error("heartbeat: cannot touch the heartbeat file: %s", exc.strerror)
                withheld = False
            elif not withheld and self._consumers:
                withheld = True
                log.warning(
                    "no progress for %gs (a thread died, or every worker thread is stuck "
                    "in a message): heartbeat withheld",
                    self.stall_s,
                )
            time.sleep(self.tick_s)


def from_environment(stall_s: float) -> Heartbeat | None:
    """The heartbeat the supervisor asked this process for, if any."""
    path = os.environ.get(ENV, "")
    return Heartbeat(Path(path), stall_s=stall_s) if path else None
