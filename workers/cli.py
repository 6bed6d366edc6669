"""The ``effectq`` command line (DESIGN §8).

``--json`` prints one JSON document on stdout. Exit status 0 on success; otherwise
non-zero with a one-line reason on stderr (2 bad input, 3 conflict, 4 blocked, 5 timeout,
6 not found, 7 ledger or broker unavailable).
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from dedupe import EffectqError, IdentityError, LedgerUnavailableError, MessageError

from .settings import settings

app = typer.Typer(
    name="effectq",
    help="At-most-once side effects from a Dramatiq queue.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def fail(code: int, reason: str) -> NoReturn:
    err.print(f"effectq: {reason}", markup=False)
    raise typer.Exit(code)


def emit(document: Any) -> None:
    sys.stdout.write(json.dumps(document, sort_keys=True, default=str) + "\n")


def load_tools() -> None:
    module = settings().tools
    try:
        importlib.import_module(module)
    except ImportError as exc:
        fail(2, f"cannot import EFFECTQ_TOOLS={module!r}: {exc}")


def _parse_args(pairs: list[str]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            fail(2, f"--arg {pair!r}: expected NAME=VALUE (or NAME:=JSON)")
        if name.endswith(":"):
            try:
                args[name[:-1]] = json.loads(value)
            except json.JSONDecodeError as exc:
                fail(2, f"--arg {name[:-1]}: not JSON ({exc.msg})")
        else:
            args[name] = value
    return args


@app.command()
def sandbox(
    host: str = "127.0.0.1",
    port: int = 8765,
    fail_rate: float = 0.0,
    drop_ack_rate: float = 0.0,
    latency_ms: float = 0.0,
    lookup_lag_s: float = 0.0,
    no_lookup: bool = False,
    no_provider_idempotency: bool = False,
    seed: int | None = None,
    state_file: str | None = None,
) -> None:
    """Run the sandbox provider (DESIGN §5)."""
    from pathlib import Path

    from .sandbox import SandboxConfig, serve

    try:
        config = SandboxConfig(
            fail_rate=fail_rate,
            drop_ack_rate=drop_ack_rate,
            latency_ms=latency_ms,
            lookup_lag_s=lookup_lag_s,
            lookup_enabled=not no_lookup,
            provider_idempotency=not no_provider_idempotency,
            seed=seed,
        )
    except ValueError as exc:
        fail(2, str(exc))
    serve(config, host=host, port=port, state_file=Path(state_file) if state_file else None)


@app.command()
def worker(
    processes: Annotated[int, typer.Option("--processes", "-p")] = 2,
    threads: Annotated[int, typer.Option("--threads", "-t")] = 8,
    queues: Annotated[list[str] | None, typer.Option("--queues", "-Q")] = None,
    shutdown_timeout_ms: int = 600_000,
) -> None:
    """Run a supervised pool of Dramatiq worker processes for the tools in EFFECTQ_TOOLS."""
    import logging

    from .supervisor import Supervisor

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    pool = Supervisor(
        settings().tools,
        processes=processes,
        threads=threads,
        queues=queues or (),
        shutdown_timeout_ms=shutdown_timeout_ms,
    )
    raise typer.Exit(pool.run())


@app.command()
def submit(
    tool: str,
    scope: Annotated[str, typer.Option(help="the trigger: event, order or campaign id")],
    arg: Annotated[list[str] | None, typer.Option("--arg", help="NAME=VALUE or NAME:=JSON")] = None,
    action: str | None = None,
    wait: Annotated[float | None, typer.Option(help="seconds to wait for the receipt")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Submit one tool call (deduplicated before the broker)."""
    from .producer import Status, WaitTimeout
    from .producer import submit as do_submit

    load_tools()
    try:
        handle = do_submit(tool, scope=scope, action=action, **_parse_args(arg or []))
        if wait is not None and handle.status in (Status.ENQUEUED, Status.PENDING):
            handle.wait(wait)
    except WaitTimeout as exc:
        fail(5, exc.message)
    except LedgerUnavailableError as exc:
        fail(7, exc.message)
    except (IdentityError, MessageError) as exc:
        fail(2, exc.message)
    except EffectqError as exc:
        fail(2, exc.message)
    document = handle.as_dict()
    if as_json:
        emit(document)
    else:
        out.print(f"{handle.status.value}  {handle.tool}  {handle.key}", markup=False)
    if handle.status is Status.CONFLICT:
        fail(3, f"conflict: {handle.key} was recorded with other bound fields")
    if handle.status is Status.BLOCKED:
        fail(4, f"blocked: {handle.key} is {handle.state}, awaiting reconciliation or an operator")


@app.command()
def reconciler(
    once: Annotated[bool, typer.Option(help="one pass over the lease indexes, then exit")] = False,
    interval: Annotated[float, typer.Option(help="seconds between passes")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Resolve expired claims against the providers' lookups (never enqueues work)."""
    import logging
    import signal
    import threading

    from reconciler import Reconciler

    from . import runtime
    from .tool import TOOLS

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    load_tools()
    try:
        pool = Reconciler(runtime.ledger(), {name: t.spec for name, t in TOOLS.items()})
        if once:
            outcomes = pool.run_once()
            if as_json:
                emit(dict(outcomes))
            return
    except LedgerUnavailableError as exc:
        fail(7, exc.message)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pool.run(interval_s=interval, stop=stop)


@app.command()
def inspect(key: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show one effect's record: state, token, receipt, late receipts, history."""
    from . import runtime

    try:
        record = runtime.ledger().get(key)
    except LedgerUnavailableError as exc:
        fail(7, exc.message)
    if record is None:
        fail(6, f"no effect with key {key}")
    document = record.as_dict()
    if as_json:
        emit(document)
        return
    for name in ("key", "state", "tool", "token", "generation", "attempts", "reason", "holder"):
        out.print(f"{name:>11}: {document[name]}", markup=False)
    out.print(f"{'receipt':>11}: {json.dumps(document['receipt'])}", markup=False)
    for late in record.late_receipts:
        out.print(
            f"{'late':>11}: token {late['token']} {json.dumps(late['receipt'])}", markup=False
        )
    for step in record.history:
        out.print(
            f"{'history':>11}: {step.at_ms} {step.state} t{step.token} {step.note}", markup=False
        )


@app.command()
def demo(
    calls: int = 300,
    duplicate_rate: float = 0.3,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The whole pipeline locally: Redis, sandbox, a worker pool, a SIGKILL, a summary."""
    from .demo import run_demo

    summary = run_demo(calls=calls, duplicate_rate=duplicate_rate, console=err)
    if as_json:
        emit(summary)
    if summary["violations"]:
        fail(1, "invariant violated: " + "; ".join(summary["violations"]))
