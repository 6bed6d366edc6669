"""One background thread per worker process keeps the leases of running effects alive.

A tool body may run longer than its lease; without a heartbeat the reconciler would take a
live claim over. A fenced heartbeat means that has happened anyway (the process was paused
past its lease): the holder's commit will be fenced too, and the reconciler decides.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dedupe import Ledger, LedgerError

__all__ = ["Held", "LeaseKeeper"]

log = logging.getLogger(__name__)


@dataclass
class Held:
    key: str
    token: int
    lease_s: float
    fenced: bool = False
    stopped: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stop(self) -> None:
        """No heartbeat after this returns: call it before the commit, so that a heartbeat
        racing the commit is not counted as a fenced (stale) write."""
        with self.lock:
            self.stopped = True


class LeaseKeeper:
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._held: dict[tuple[str, int], Held] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, key: str, token: int, lease_s: float) -> Iterator[Held]:
        held = Held(key, token, lease_s)
        with self._lock:
            self._held[(key, token)] = held
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="effectq-leases", daemon=True
                )
                self._thread.start()
        try:
            yield held
        finally:
            with self._lock:
                self._held.pop((key, token), None)

    def _interval(self) -> float:
        with self._lock:
            leases = [h.lease_s for h in self._held.values()]
        # A third of the shortest lease: two heartbeats may be lost before it expires.
        return min(max(min(leases, default=5.0) / 3, 0.05), 5.0)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval())
            with self._lock:
                held = list(self._held.values())
            for h in held:
                with h.lock:
                    if h.fenced or h.stopped:
                        continue
                    try:
                        write = self._ledger.heartbeat(h.key, h.token, lease_s=h.lease_s)
                    except LedgerError as exc:
                        log.warning("heartbeat for %s failed: %s", h.key[:12], exc)
                        continue
                if write.fenced:
                    h.fenced = True
                    log.warning(
                        "lease of %s lost (now %s token %s)", h.key[:12], write.state, write.token
                    )
