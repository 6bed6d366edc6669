"""``workers.lifeline``: a process armed against its parent gets SIGTERM when that parent is
SIGKILLed, and one whose expected parent is already gone leaves before doing anything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.stack import wait_for
from workers import lifeline

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

# A parent that starts an armed child, prints its pid, and waits to be killed.
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    print(child.pid, flush=True)
    time.sleep(600)
    """
)
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from workers.lifeline import die_with_parent
    signal.signal(signal.SIGTERM, lambda *_: (Path(sys.argv[1]).write_text("SIGTERM"), sys.exit(0)))
    assert die_with_parent(os.getppid())
    Path(sys.argv[1] + ".armed").touch()
    time.sleep(600)
    """
)


def test_a_child_gets_sigterm_when_its_parent_is_sigkilled(tmp_path: Path) -> None:
    got = tmp_path / "got"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(got)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        wait_for(lambda: Path(f"{got}.armed").exists(), what="the child armed", timeout=20)
        parent.kill()
        parent.wait()
        wait_for(got.exists, what="the child's SIGTERM", timeout=10)
        assert got.read_text() == "SIGTERM"
    finally:
        if not got.exists():
            os.kill(child, signal.SIGKILL)


def test_a_parent_already_gone_is_told_after_arming() -> None:
    # In a process of its own: armed, this one would die with pytest's parent.
    code = (
        "import os; from workers.lifeline import die_with_parent as d; "
        "print(d(os.getppid()), d(os.getppid() + 1))"  # another parent: as if re-parented
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "False"], done.stderr


def test_a_dramatiq_main_process_whose_supervisor_died_starts_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers.lifeline", "workers.entry", "-p", "1"],
        env={**os.environ, lifeline.SUPERVISOR_PID_ENV: str(os.getpid() + 1)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
    assert done.stderr == "effectq: the supervisor died before this pool started; exiting\n"


def test_arming_starts_no_process() -> None:
    """Arming runs in every Dramatiq main and worker process as it boots: a helper process it
    started (``ctypes.util.find_library`` runs ``ldconfig -p``) would sit in the pool's tree
    beside the worker processes, where a pool's observers (``LocalStack.worker_processes``,
    an operator's ``ps``) take it for one."""
    probe = textwrap.dedent(
        """
        import signal, subprocess
        started = []
        real = subprocess.Popen.__init__
        def spy(self, *args, **kwargs):
            started.append(args[0] if args else kwargs.get("args"))
            real(self, *args, **kwargs)
        subprocess.Popen.__init__ = spy
        from workers import lifeline
        assert lifeline._arm(signal.SIGTERM)
        print(started)
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
