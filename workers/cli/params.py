"""The verbs' shared parameter types, validators and wiring (settings, tools, runtime)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.core

if TYPE_CHECKING:
    from reconciler import Operator

    from ..settings import Settings


from ._app import _Refused, fail, line

# -- parameters ----------------------------------------------------------------------------


def _key(value: str) -> str:
    """An effect key as the ledger writes it: 64 lowercase hex digits (DESIGN §2)."""
    # Imported here, not above: ``--help`` loads no dedupe module but the lazy helper.
    from dedupe.identity import EFFECT_KEY

    if not EFFECT_KEY.fullmatch(value):
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


def _tool(value: str) -> str:
    """A tool's name as a declaration allows it (``dedupe.spec.TOOL_NAME``): checked here so
    that an unknown one, named back in the refusal, is short and printable."""
    from dedupe.spec import TOOL_NAME

    if not TOOL_NAME.fullmatch(value):
        raise _Refused(
            "must be a tool's name (a lowercase letter, then lowercase letters, digits, _ . -; "
            "at most 64)"
        )
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
    from ..settings import Settings

    return Settings()


def _extra(name: str, *modules: str) -> None:
    """Exit 2, naming the install that brings them, when a verb's optional packages are
    missing (the core install runs workers, reconcilers and the operator verbs only)."""
    from importlib.util import find_spec

    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        fail(2, f"this verb needs the [{name}] extra ({', '.join(missing)} missing): "
                f"python -m pip install 'effectq[{name}]'")  # fmt: skip


def load_tools(cfg: Settings) -> None:
    """Import EFFECTQ_TOOLS (exit 2 with the reason when it cannot be imported)."""
    from .. import registry

    try:
        registry.load(cfg.tools)
    except registry.ToolsModuleError as exc:
        fail(2, exc.message)


def _install(cfg: Settings | None = None) -> None:
    """This invocation's runtime (broker and ledger from ``cfg``, default the environment),
    its tools bound."""
    from ..runtime import Runtime, install

    cfg = cfg if cfg is not None else _settings()
    install(Runtime.from_settings(cfg))
    load_tools(cfg)


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
    from ..verbs import reader

    return reader(_settings())


_INSPECT_FIELDS = ("key", "state", "tool", "token", "generation", "attempts", "reason", "holder")


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _maybe_key(value: str | None) -> str | None:
    return None if value is None else _key(value)


def _prefix(value: str | None) -> str | None:
    from dedupe.identity import KEY_OR_PREFIX

    if value is not None and not KEY_OR_PREFIX.fullmatch(value):
        raise _Refused("must be an effect key or its first 12 or more lowercase hex digits")
    return value


def _maybe_tool(value: str | None) -> str | None:
    return None if value is None else _tool(value)


_DURATION = re.compile(r"(?:[0-9]{1,9}(?:\.[0-9]{1,6})?[smhdw])+")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _time(value: str | None) -> str | None:
    """A time as an on-call types it: ISO 8601, seconds ago, or a duration ago (``15m``,
    ``1h``, ``1h30m``, ``2d``), the last turned into seconds for ``verbs.parse_since``."""
    if value is None or not _DURATION.fullmatch(value.strip()):
        return value
    parts = re.findall(r"([0-9.]+)([smhdw])", value)
    return f"{sum(float(n) * _UNIT_S[unit] for n, unit in parts):g}"


_TIME_HELP = "ISO 8601 (UTC unless it says otherwise), seconds ago, or a duration ago: 15m, 1h, 2d"
Since = Annotated[
    str | None,
    typer.Option(metavar="TIME", callback=_time, help=f"from this time on: {_TIME_HELP}"),
]
Until = Annotated[
    str | None,
    typer.Option(metavar="TIME", callback=_time, help=f"up to this time: {_TIME_HELP}"),
]
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
