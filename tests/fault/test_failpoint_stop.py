"""The ``stop`` failpoint must freeze the calling thread *at* the failpoint.

``os.kill(os.getpid(), SIGSTOP)`` is process-directed: the kernel may hand it to another
thread to start the group stop while the calling thread runs on. In a Dramatiq worker
process (several threads) that let a holder frozen "at after_effect" commit first (seen in
tests/fault/test_crash_matrix.py: DONE under token 1 although ``after_effect=stop`` fired).
``dedupe.failpoints`` therefore sends a thread-directed ``signal.pthread_kill`` instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
CHILD = r"""
import os, threading, time
from dedupe.failpoints import arm, failpoint
arm("after_effect=stop")
def spin():  # the other threads of a worker process
    while True:
        time.sleep(0.001)
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
def work():
    failpoint("after_effect")
    for _ in range(100):  # what the holder does next: commit, ack...
        os.write(1, b"x")
        time.sleep(0.0005)
threading.Thread(target=work).start()
threading.Event().wait()
"""


def _bytes_written_past_the_stop() -> int:
    read, write = os.pipe()
    os.set_blocking(read, False)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=write, cwd=ROOT)
    os.close(write)
    try:
        proc = psutil.Process(child.pid)
        deadline = time.monotonic() + 15
        while proc.status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the failpoint never stopped the process"
            time.sleep(0.01)
        time.sleep(0.2)
        try:
            return len(os.read(read, 1 << 16))
        except BlockingIOError:
            return 0
    finally:
        child.kill()
        child.wait()
        os.close(read)


def test_stop_failpoint_freezes_the_calling_thread_at_the_point() -> None:
    # Several trials: the race is lost most of the time, not always.
    written = [_bytes_written_past_the_stop() for _ in range(5)]
    assert written == [0] * 5, f"bytes written after the stop failpoint fired: {written}"
