"""A tools module whose Dramatiq worker process dies inside its own boot: after its threads
started, before it told its ``dramatiq`` main process that it booted (a process that takes a
waiting message and crashes on it at once can die just there)."""

from __future__ import annotations

import os
import signal

import dramatiq

import workers.examples  # noqa: F401  (the tools this pool serves)
from workers import runtime


class _DieAtBoot(dramatiq.Middleware):
    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


runtime.broker().add_middleware(_DieAtBoot())
