"""The sandbox as a process of its own: its command line both ways (``argv_for`` writes
what ``main`` reads, ``python -m workers.dev.sandbox``) and ``SandboxProcess``, the handle a
test, a demo or a bench starts, reads, faults and kills it by."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import httpx

from .. import Started
from ..ports import free_port
from .service import SandboxConfig, serve

__all__ = ["SandboxProcess", "argv_for", "main"]

# The checkout (or site-packages) holding `workers`: a child started from anywhere imports
# the same code as its parent.
_SOURCE_ROOT = Path(__file__).resolve().parents[3]


def argv_for(config: SandboxConfig) -> list[str]:
    """The ``python -m workers.dev.sandbox`` flags that reproduce ``config``."""
    argv = [
        f"--fail-rate={config.fail_rate}",
        f"--drop-ack-rate={config.drop_ack_rate}",
        f"--latency-ms={config.latency_ms}",
        f"--lookup-latency-ms={config.lookup_latency_ms}",
        f"--lookup-lag-s={config.lookup_lag_s}",
    ]
    if not config.lookup_enabled:
        argv.append("--no-lookup")
    if not config.provider_idempotency:
        argv.append("--no-provider-idempotency")
    if config.seed is not None:
        argv.append(f"--seed={config.seed}")
    return argv


class SandboxProcess(Started):
    """A sandbox in a child process on a loopback port, for tests and demos.

    Switches changed with ``configure`` live in the process only; ``restart`` starts
    again from ``config`` (and the state file, which is what survives).
    """

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        state_file: Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        self.config = config or SandboxConfig()
        self.state_file = state_file
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.startup_timeout = startup_timeout
        self.url = f"http://{host}:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> SandboxProcess:
        argv = [sys.executable, "-m", "workers.dev.sandbox", f"--host={self.host}"]
        argv += [f"--port={self.port}", *argv_for(self.config)]
        if self.state_file is not None:
            argv.append(f"--state-file={self.state_file}")
        env = dict(os.environ)
        root = str(_SOURCE_ROOT)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        # A file, not a pipe: nobody drains the child's output while it runs.
        self._close_log()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child
        self._proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=self._log)
        self._wait_ready()
        return self

    def output(self) -> str:
        """What the child wrote to stdout and stderr (uvicorn logs warnings and errors)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                raise RuntimeError(f"sandbox exited with {code}:\n{self.output()}")
            try:
                self.stats()
                return
            except httpx.TransportError:
                time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"sandbox did not answer on {self.url} in {self.startup_timeout}s")

    def _call(self, method: str, path: str, payload: object = None) -> Any:
        with httpx.Client(base_url=self.url, timeout=5.0, trust_env=False) as client:
            response = client.request(method, path, json=payload)
            response.raise_for_status()
            return response.json()

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/stats")
        return result

    def executions(self) -> list[dict[str, Any]]:
        """The whole execution log, page by page (oldest first)."""
        entries: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            page: dict[str, Any] = self._call("GET", f"/v1/executions?after={after}&limit=5000")
            entries += page["executions"]
            after = page["next_after"]
        return entries

    def fail_next(self, key: str, count: int = 1) -> None:
        """The next ``count`` POSTs under idempotency key ``key`` answer 503."""
        self._call("POST", "/v1/admin/fail-next", {"key": key, "count": count})

    def configure(self, **switches: object) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/v1/admin/config", switches)
        return result

    def reset(self) -> None:
        self._call("POST", "/v1/admin/reset")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, as in a crash."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (uvicorn shuts down gracefully), then SIGKILL after ``timeout``."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> SandboxProcess:
        self.stop()
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        super().__exit__(*exc_info)
        self._close_log()  # output() stays readable after stop() and kill(), until here


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="workers.dev.sandbox", description="The sandbox provider."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--fail-rate", type=float, default=0.0)
    parser.add_argument("--drop-ack-rate", type=float, default=0.0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--lookup-latency-ms", type=float, default=0.0)
    parser.add_argument("--lookup-lag-s", type=float, default=0.0)
    parser.add_argument("--no-lookup", action="store_true")
    parser.add_argument("--no-provider-idempotency", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--state-file", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        config = SandboxConfig(
            fail_rate=args.fail_rate,
            drop_ack_rate=args.drop_ack_rate,
            latency_ms=args.latency_ms,
            lookup_latency_ms=args.lookup_latency_ms,
            lookup_lag_s=args.lookup_lag_s,
            lookup_enabled=not args.no_lookup,
            provider_idempotency=not args.no_provider_idempotency,
            seed=args.seed,
        )
    except ValueError as exc:
        parser.error(str(exc))
    serve(config, host=args.host, port=args.port, state_file=args.state_file)
