"""A metrics endpoint with its health probes, and a worker pool's multiprocess directory.

One port serves ``/metrics`` and, where the process gives them, ``/healthz`` (liveness) and
``/readyz`` (readiness): 200 with ``ok``, or 503 with the reasons, one line each (they name
workers and seconds, never a key or an address)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from .build import BuildInfo
from .collector import LedgerCollector

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

    from dedupe import Ledger

__all__ = [
    "ENV_DIR",
    "Check",
    "MetricsServer",
    "Probe",
    "exposition",
    "ledger_answers",
    "prepare_dir",
    "reap",
    "remove_dir",
    "serve",
]

log = logging.getLogger("effectq.metrics")

ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"


class _Union:
    def __init__(self, *sources: Collector) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        for source in self._sources:
            yield from source.collect()


def exposition(
    ledger: Callable[[], Ledger],
    *,
    multiprocess_dir: str | None = None,
    broker_url: str = "",
    queues: Sequence[str] = (),
) -> Collector:
    """What an endpoint serves: the process-local metrics (the sum over a multiprocess
    directory, else this process's registry), the build's version and the scrape-time ledger
    and broker series."""
    path = multiprocess_dir if multiprocess_dir is not None else os.environ.get(ENV_DIR)
    local: Collector = (
        MultiProcessCollector(None, path=path)  # type: ignore[no-untyped-call]
        if path
        else REGISTRY
    )
    return _Union(local, BuildInfo(), LedgerCollector(ledger, broker_url=broker_url, queues=queues))


@dataclass(frozen=True)
class Check:
    """A probe's answer: ``ok``, and why not (one reason a line)."""

    ok: bool
    reasons: tuple[str, ...] = ()

    @classmethod
    def of(cls, reasons: Iterable[str]) -> Check:
        found = tuple(reasons)
        return cls(not found, found)


Probe = Callable[[], Check]


def ledger_answers(ledger: Callable[[], Ledger]) -> Check:
    """Whether the ledger answers one round trip now (its error by kind only: its text may
    name an address with credentials)."""
    try:
        ledger().server_time_ms()
    except Exception as exc:
        return Check(False, (f"ledger unavailable ({type(exc).__name__})",))
    return Check(True)


def _app(source: Collector, probes: Mapping[str, Probe]) -> Callable[..., Iterable[bytes]]:
    metrics_app = make_wsgi_app(source)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        try:
            check = probe()
        except Exception as exc:  # a probe that cannot answer says not ok, and why
            check = Check(False, (f"probe failed ({type(exc).__name__})",))
        status = "200 OK" if check.ok else "503 Service Unavailable"
        body = "\n".join(check.reasons or ("ok",)) + "\n"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [body.encode()]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None  # scrapes and probes every few seconds: no access log


@dataclass
class MetricsServer:
    """A running exposition endpoint (a daemon thread)."""

    host: str
    port: int
    _server: WSGIServer = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(
    port: int,
    host: str,
    ledger: Callable[[], Ledger],
    *,
    multiprocess_dir: str | None = None,
    broker_url: str = "",
    queues: Sequence[str] = (),
    extra: Collector | None = None,
    health: Probe | None = None,
    ready: Probe | None = None,
) -> MetricsServer | None:
    """Serve ``exposition(...)`` (and ``extra``'s series) on ``host:port`` from a daemon
    thread, with ``health`` on /healthz and ``ready`` on /readyz; None when the port is 0 or
    cannot be bound (logged: a busy metrics port must not stop a worker pool or a
    reconciler)."""
    if port <= 0:
        return None
    source = exposition(
        ledger, multiprocess_dir=multiprocess_dir, broker_url=broker_url, queues=queues
    )
    if extra is not None:
        source = _Union(source, extra)
    probes = {path: p for path, p in (("/healthz", health), ("/readyz", ready)) if p is not None}
    server_class = type("_Bound", (_Server,), {"address_family": _family(host)})
    try:
        server: WSGIServer = make_server(
            host, port, _app(source, probes), server_class, handler_class=_Quiet
        )
    except OSError as exc:
        log.error("metrics: cannot listen on %s:%d: %s", host, port, exc.strerror)
        return None
    thread = threading.Thread(target=server.serve_forever, name="effectq-metrics", daemon=True)
    thread.start()
    log.info("metrics on http://%s:%d/metrics", host, port)
    return MetricsServer(host, port, server, thread)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# -- the multiprocess directory of a worker pool --------------------------------------------

_DB = re.compile(r"^(?:counter|histogram|summary|gauge_[a-z]+)_(\d+)\.db$")
_LIVE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")


def prepare_dir(configured: str = "") -> tuple[Path, bool]:
    """The pool's multiprocess directory, emptied of every earlier run's files: the
    configured one (EFFECTQ_METRICS_DIR, then an inherited PROMETHEUS_MULTIPROC_DIR), else a
    fresh temporary one. Returns (path, whether it was created here, to remove at exit)."""
    chosen = configured or os.environ.get(ENV_DIR, "")
    if not chosen:
        return Path(tempfile.mkdtemp(prefix="effectq-metrics-")), True
    path = Path(chosen)
    path.mkdir(parents=True, exist_ok=True)
    for entry in path.iterdir():
        if _DB.match(entry.name):
            entry.unlink(missing_ok=True)
    return path, False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(path: Path) -> list[int]:
    """``mark_process_dead`` for every gone process that left live-gauge files in ``path``
    (the only files it concerns); the pids reaped. A pool's metrics are written by
    Dramatiq's forked worker processes, whose pids the supervisor never sees, hence the
    directory is the list. Counters and histograms of a dead process stay in the sum: its
    work is still done."""
    pids = {int(m.group(1)) for e in path.iterdir() if (m := _LIVE.match(e.name))}
    dead = sorted(pid for pid in pids if not _alive(pid))
    for pid in dead:
        mark_process_dead(pid, str(path))  # type: ignore[no-untyped-call]
    return dead


def remove_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(path)
