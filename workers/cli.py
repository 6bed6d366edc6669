"""The ``effectq`` command line (DESIGN §8).

``--json`` prints one JSON document on stdout. Exit status 0 on success; otherwise
non-zero with a one-line reason on stderr: 2 bad input, 3 conflict, 4 blocked, 5 timeout,
6 not found, 7 ledger or broker unavailable, 8 refused by the state table.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from dedupe import (
    ConflictError,
    EffectqError,
    LedgerUnavailableError,
    OperatorError,
    State,
    TransitionRefusedError,
)

from .settings import settings

if TYPE_CHECKING:
    from reconciler import Operator

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


@contextmanager
def errors() -> Iterator[None]:
    """One mapping from effectq's error tree to exit codes, for every command."""
    from .producer import WaitTimeout

    try:
        yield
    except WaitTimeout as exc:
        fail(5, exc.message)
    except LedgerUnavailableError as exc:
        fail(7, exc.message)
    except TransitionRefusedError as exc:
        fail(8, exc.message)
    except OperatorError as exc:
        fail(6 if exc.message.startswith("no effect") else 2, exc.message)
    except ConflictError as exc:  # a campaign re-submitted with a changed list or arguments
        fail(3, exc.message)
    except EffectqError as exc:
        fail(2, exc.message)


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
            except (ValueError, RecursionError) as exc:
                fail(2, f"--arg {name[:-1]}: not JSON ({str(exc)[:80]})")
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

    from . import runtime
    from .supervisor import Supervisor

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with errors():
        runtime.ledger()  # refuse to start on a ledger that cannot be trusted (no AOF)
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
    from .api.verbs import await_receipt, submit_call
    from .producer import Status

    load_tools()
    with errors():
        handle = submit_call(tool, scope=scope, action=action, args=_parse_args(arg or []))
        if wait is not None:
            await_receipt(handle, wait)
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
    with errors():
        cfg = settings()
        pool = Reconciler(
            runtime.ledger(),
            {name: t.spec for name, t in TOOLS.items()},
            lease_s=cfg.reconciler_lease_s,
            budget=cfg.reconciler_budget,
            backoff_s=cfg.reconciler_backoff_s,
        )
        if once:
            outcomes = pool.run_once()
            if as_json:
                emit(dict(outcomes))
            return
    from . import metrics

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = metrics.serve()  # EFFECTQ_METRICS_HOST:EFFECTQ_METRICS_PORT; port 0 = none
    try:
        pool.run(interval_s=interval, stop=stop)
    finally:
        if server is not None:
            server.close()


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="default EFFECTQ_API_HOST")] = None,
    port: Annotated[int | None, typer.Option(help="default EFFECTQ_API_PORT")] = None,
    openapi: Annotated[
        bool, typer.Option("--openapi", help="print the OpenAPI document and exit")
    ] = False,
) -> None:
    """Serve the producer HTTP API and the operator console (docs/api.md)."""
    import logging

    from . import runtime
    from .api.app import create_app, openapi_document, serve

    if openapi:
        sys.stdout.write(json.dumps(openapi_document(), indent=2) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    load_tools()
    try:
        application = create_app()
    except ValueError as exc:
        fail(2, str(exc))
    with errors():
        runtime.ledger()  # refuse to start on a ledger that cannot be trusted (no AOF)
    cfg = settings()
    serve(application, host=host or cfg.api_host, port=port or cfg.api_port)


def _operator() -> Operator:
    from .api.verbs import operator

    load_tools()
    return operator()


Actor = Annotated[str, typer.Option(help="who acts (recorded in the audit stream)")]
Reason = Annotated[str, typer.Option(help="why (recorded in the audit stream)")]
Json = Annotated[bool, typer.Option("--json")]


@app.command()
def inspect(key: str, as_json: Json = False) -> None:
    """Show one effect: state, token, receipt, raw response, late receipts, decisions."""
    with errors():
        record = _operator().inspect(key)
    document = record.as_dict()
    if as_json:
        emit(document)
        return
    rows = [(name, str(document[name])) for name in _INSPECT_FIELDS]
    rows.append(("receipt", json.dumps(document["receipt"])))
    rows += [
        ("late", f"token {r['token']} {json.dumps(r['receipt'])}") for r in record.late_receipts
    ]
    rows += [("history", f"{h.at_ms} {h.state} t{h.token} {h.note}") for h in record.history]
    for label, text in rows:
        out.print(f"{label:>11}: {text}", markup=False)


_INSPECT_FIELDS = ("key", "state", "tool", "token", "generation", "attempts", "reason", "holder")


@app.command(name="list")
def list_(
    state: Annotated[
        str | None, typer.Option(help="UNKNOWN (the work queue), CLAIMED, ...")
    ] = None,
    tool: str | None = None,
    limit: int = 100,
    as_json: Json = False,
) -> None:
    """List effects by state (default: everything not yet settled)."""
    try:
        wanted = State(state.upper()) if state else None
    except ValueError:
        fail(2, f"unknown state {state!r} (one of {', '.join(s.value for s in State)})")
    with errors():
        records = _operator().list(state=wanted, tool=tool, limit=limit)
    if as_json:
        emit([r.as_dict() for r in records])
        return
    table = Table("key", "state", "tool", "token", "reason", box=None)
    for r in records:
        table.add_row(r.key, r.state.value, r.tool, str(r.token), r.reason)
    out.print(table)


@app.command()
def resolve(
    key: str,
    actor: Actor,
    reason: Reason,
    executed: Annotated[bool, typer.Option("--executed/--not-executed")] = ...,  # type: ignore[assignment]
    receipt: Annotated[str | None, typer.Option(help="the provider's receipt, JSON")] = None,
    override_evidence: bool = False,
    as_json: Json = False,
) -> None:
    """Settle an UNKNOWN effect with evidence: --executed --receipt JSON, or --not-executed."""
    parsed = None
    if receipt is not None:
        try:
            parsed = json.loads(receipt)
        except json.JSONDecodeError as exc:
            fail(2, f"--receipt is not JSON ({exc.msg})")
        if not isinstance(parsed, dict):
            fail(2, "--receipt must be a JSON object")
    from .api import verbs

    load_tools()
    with errors():
        document = verbs.resolve(
            key, executed=executed, actor=actor, reason=reason, receipt=parsed,
            override_evidence=override_evidence,
        )  # fmt: skip
    _done(document, as_json)


@app.command()
def revoke(key: str, actor: Actor, reason: Reason, as_json: Json = False) -> None:
    """Void a DONE effect; the next submission opens generation n+1."""
    from .api import verbs

    load_tools()
    with errors():
        _done(verbs.revoke(key, actor=actor, reason=reason), as_json)


@app.command()
def supersede(key: str, actor: Actor, reason: Reason, as_json: Json = False) -> None:
    """Replace a DONE effect; the next submission opens generation n+1."""
    from .api import verbs

    load_tools()
    with errors():
        _done(verbs.supersede(key, actor=actor, reason=reason), as_json)


@app.command()
def replay(key: str, actor: Actor, reason: Reason, as_json: Json = False) -> None:
    """Send a FAILED / REVOKED / SUPERSEDED effect's stored request again."""
    from .api import verbs

    load_tools()
    with errors():
        document = verbs.replay(key, actor=actor, reason=reason)
    if as_json:
        emit(document)
    else:
        out.print(f"{document['status']}  {key}", markup=False)


campaign_app = typer.Typer(help="Campaign batches: frozen plans, fan-out, status.")
app.add_typer(campaign_app, name="campaign")


@campaign_app.command("submit")
def campaign_submit(
    path: Annotated[str, typer.Argument(metavar="FILE")], as_json: Json = False
) -> None:
    """Freeze and fan out FILE: {campaign_id, tool, action?, args, recipients, plan_version?}."""
    from pydantic import ValidationError
    from rich.progress import Progress

    from .api.verbs import submit_campaign_file
    from .campaign import CampaignFile

    try:
        with open(path, "rb") as f:
            spec = CampaignFile.model_validate_json(f.read())
    except OSError as exc:
        fail(2, f"cannot read campaign file {path}: {exc.strerror}")
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(map(str, first["loc"])) or "file"
        fail(2, f"campaign file {path}: {where}: {first['msg']} ({exc.error_count()} errors)")
    load_tools()
    with errors(), Progress(console=err, transient=True, disable=as_json) as bar:
        task = bar.add_task("fan-out", total=len(spec.recipients))
        report = submit_campaign_file(spec, progress=lambda n: bar.advance(task, n))
    if as_json:
        emit(report.as_dict())
        return
    out.print(
        f"campaign {report.campaign_id} v{report.plan_version}: {report.recipients} recipients, "
        f"{report.sent} sent, skipped {report.skipped or 'none'}, {report.collapsed} duplicates "
        f"collapsed, {len(report.rejected)} rejected, +{report.added} -{report.removed}",
        markup=False,
    )
    for item in report.rejected[:20]:
        out.print(f"  rejected #{item['index']}: {item['reason']}", markup=False)


@campaign_app.command("status")
def campaign_status(
    campaign_id: Annotated[str, typer.Argument(metavar="ID")],
    cursor: int = 0,
    page_size: int = 100,
    as_json: Json = False,
) -> None:
    """Counts per recipient state, the never-sent diff, and a page of recipients."""
    from .campaign import campaign_status as status

    with errors():
        document = status(campaign_id, cursor=cursor, page_size=page_size)
    if as_json:
        emit(document)
        return
    out.print(
        f"campaign {campaign_id} v{document['plan_version']}: {document['counts']}; "
        f"approved but never sent: {document['approved_but_never_sent']}",
        markup=False,
    )
    table = Table("recipient", "state", "key", box=None)
    for row in document["recipients"]:
        table.add_row(row["recipient"], row["state"], row["key"])
    out.print(table)
    if document["next_cursor"]:
        out.print(f"more: --cursor {document['next_cursor']}", markup=False)


def _done(document: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(document)
    else:
        out.print(
            f"{document['state']}  {document['key']}  token {document['token']}", markup=False
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
