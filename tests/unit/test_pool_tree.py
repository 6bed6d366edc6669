"""``LocalStack.worker_processes``: the Dramatiq worker processes of a pool are the processes
its Dramatiq main process started through multiprocessing (forked, or spawned); anything
else in the tree (a tool's subprocess, a helper a library ran while booting) is not one — a
fault test that freezes or kills "the worker" must not be handed a passing ``ldconfig``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.support.stack import wait_for
from workers.dev.local import LocalStack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux tree")

# The "main process": forks one worker process, starts one as multiprocessing's spawn does
# (macOS's default), and runs a helper beside them.
MAIN = textwrap.dedent(
    """
    import os, subprocess, sys, time
    helper = subprocess.Popen(["sleep", "60"])
    spawned = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--multiprocessing-fork"]
    )
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    print(pid, spawned.pid, helper.pid, flush=True)
    time.sleep(60)
    """
)
# The "supervisor": starts the main process and passes on what it printed.
SUPERVISOR = textwrap.dedent(
    """
    import subprocess, sys, time
    main = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE)
    sys.stdout.write(main.stdout.readline().decode())
    sys.stdout.flush()
    time.sleep(60)
    """
)


def test_only_processes_multiprocessing_started_are_worker_processes() -> None:
    pool = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, MAIN],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert pool.stdout is not None
        forked, spawned, helper = map(int, pool.stdout.readline().split())
        stack = LocalStack()
        want = sorted([forked, spawned])
        wait_for(lambda: sorted(stack.worker_processes(pool)) == want, what="the two workers")
        assert helper not in stack.worker_processes(pool)
    finally:
        os.killpg(pool.pid, signal.SIGKILL)
        pool.wait()


def test_a_finished_pool_has_no_worker_processes() -> None:
    """A pool already reaped has no pid of its own any more (Linux may hand it to another
    process): its tree is not looked up."""
    pool = subprocess.Popen([sys.executable, "-c", "pass"])
    pool.wait()
    assert LocalStack().worker_processes(pool) == []
