"""Processes under ``effectq worker`` die with their parent.

A Dramatiq worker process whose main process was SIGKILLed is re-parented (to PID 1 or a
subreaper) and goes on consuming beside the replacement its supervisor starts; a Dramatiq
main process whose supervisor died goes on too, unsupervised. Each of them asks Linux for
a signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``): SIGTERM, a shutdown like any
other, so it drains — it stops consuming, finishes the calls it runs and never acks an
unfinished one (DESIGN §3: a shutdown signal however delivered drains; it never kills a
call).

Run as ``python -m workers.lifeline <dramatiq arguments>``, this module is the Dramatiq main
process the supervisor starts: it arms the signal against the supervisor
(``EFFECTQ_SUPERVISOR_PID``), then runs Dramatiq's CLI. ``workers.entry`` arms it in each
worker process against the main process that forked it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys

__all__ = ["SUPERVISOR_PID_ENV", "die_with_parent"]

log = logging.getLogger("effectq.worker")

#: The supervisor's pid, in each Dramatiq main process's environment.
SUPERVISOR_PID_ENV = "EFFECTQ_SUPERVISOR_PID"

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _arm(signum: int) -> bool:
    """Ask Linux for ``signum`` when the parent dies; False where that cannot be asked."""
    if not sys.platform.startswith("linux"):
        # No parent-death signal elsewhere (macOS, the BSDs: a developer's machine): the
        # process outlives a SIGKILLed parent until a signal to its group reaches it.
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
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
    sys.exit(dramatiq_main())


if __name__ == "__main__":
    main()
