"""The application, its one error boundary, and the output helpers every verb uses."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
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

    from dedupe import EffectqError
    from dedupe.errors import code_of

    if isinstance(exc, EffectqError):  # its exit code: dedupe.errors.CODES
        return code_of(exc).exit, exc.message
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
