"""Logging of every effectq process, set up in one place (``setup``), called where a
process starts: each Dramatiq worker process (``workers.entry``), and the ``worker``,
``reconciler`` and ``api`` verbs.

``EFFECTQ_LOG_FORMAT=json`` writes one JSON object per line (python-json-logger):
``time``, ``level``, ``process`` (pid), ``logger``, ``message`` and, where the line is
written on behalf of one effect, ``tool``, ``key`` (its first 12 hex digits: a key is a
hash, and the prefix is what every effectq message names), ``message_id`` and ``token``.
``text`` (the default) writes the same fields as words. ``EFFECTQ_LOG_LEVEL`` sets the level
(default INFO).

The effect fields come from ``effect(...)``, a context the worker path enters around one
message: every line logged inside it, by effectq or by the tool body, carries them. The
lines Dramatiq's middleware writes about that message once it has run (a retry, retries
exceeded, a dead letter) carry them too: the worker thread keeps its last message's fields
and a line naming that message id takes them. (A Dramatiq line naming a message object gets
its fields where ``workers.runtime`` shows the message by actor and id only.) Nothing else
is added to a line: arguments, receipts and recipients are never logged here.

Every line of an effectq process goes through ``setup``: a Dramatiq main process too
(``dramatiq_main_args``: Dramatiq's own logging setup is skipped), and uvicorn's
(``effectq api`` runs it without a logging config of its own), whose ANSI-coloured copy of
each message (``color_message``) is dropped.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pythonjsonlogger.json import JsonFormatter

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "FIELDS",
    "KEY_PREFIX",
    "annotate",
    "dramatiq_main_args",
    "effect",
    "key_prefix",
    "setup",
]

#: The per-effect fields a line may carry, in the order the text format prints them.
FIELDS = ("tool", "key", "message_id", "token")
#: How much of an effect key a log line, a span or an error shows.
KEY_PREFIX = 12

_effect: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "effectq_log_effect", default=None
)
# The fields of the last message this thread ran: Dramatiq's middleware logs about it
# (retrying, dead-lettered) after the effect's context is left.
_last = threading.local()


def key_prefix(key: str) -> str:
    return key[:KEY_PREFIX]


class _Effect:
    """The context of ``effect``: a class, not a generator, as it runs once per message."""

    __slots__ = ("_fields", "_reset")

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields
        self._reset: contextvars.Token[dict[str, Any] | None] | None = None

    def __enter__(self) -> None:
        self._reset = _effect.set(self._fields)

    def __exit__(self, *exc: object) -> None:
        if self._reset is not None:
            _effect.reset(self._reset)
        _last.fields = self._fields


def effect(*, tool: str, key: str | None = None, message_id: str | None = None) -> _Effect:
    """Every line logged inside carries these fields (the key as its prefix only)."""
    fields: dict[str, Any] = {"tool": tool}
    if key is not None:
        fields["key"] = key_prefix(key)
    if message_id is not None:
        fields["message_id"] = message_id
    return _Effect(fields)


def annotate(*, key: str | None = None, token: int | None = None) -> None:
    """Add the key (once the message is read) or the claim's fencing token to the current
    effect's fields."""
    fields = _effect.get()
    if fields is not None:
        if key is not None:
            fields["key"] = key_prefix(key)
        if token is not None:
            fields["token"] = token


# Dramatiq's actor logs every message's arguments at DEBUG (an envelope: key, recipients).
_DRAMATIQ_ARGS = "Received args=%r kwargs=%r."


def _about_message(record: logging.LogRecord) -> Mapping[str, Any]:
    """The effect fields of a line about the message this thread ran last, written after
    its context was left (Dramatiq's retry middleware, the dead-letter line): the line
    names that message's id."""
    last: Mapping[str, Any] = getattr(_last, "fields", None) or {}
    if isinstance(record.args, tuple) and last.get("message_id") in record.args:
        return last
    return {}


class _EffectFields(logging.Filter):
    """Copies the current effect's fields onto each record (a field the caller passed in
    ``extra`` wins), shortens a ``key`` passed in ``extra`` to its prefix, drops the
    arguments from Dramatiq's debug line about them and uvicorn's ANSI copy of a line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _DRAMATIQ_ARGS:
            record.args = ("(redacted)", "(redacted)")
        fields: Mapping[str, Any] | None = _effect.get()
        if fields is None and record.name.startswith(("dramatiq", "workers.broker")):
            fields = _about_message(record)
        for name, value in (fields or {}).items():
            if not hasattr(record, name):
                setattr(record, name, value)
        key = getattr(record, "key", None)
        if isinstance(key, str):
            record.key = key_prefix(key)
        if hasattr(record, "color_message"):
            del record.color_message
        return True


class _Text(logging.Formatter):
    """``time level pid logger message [tool=… key=… message_id=… token=…]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(process)d %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        values = {n: getattr(record, n, None) for n in FIELDS}
        known = [f"{n}={v}" for n, v in values.items() if v is not None]
        return f"{line} [{' '.join(known)}]" if known else line


def _json() -> logging.Formatter:
    return JsonFormatter(
        ["levelname", "process", "name", "message"],
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
    )


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at each line (a test runner swaps it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        return None


_FILTER = _EffectFields()


def setup(settings: Settings) -> None:
    """Format every line of this process as ``settings.log_format`` at
    ``settings.log_level``. Handlers already on the root logger keep their streams and take
    the format (a Dramatiq worker process's handler writes to its logging pipe); without
    one, lines go to stderr."""
    root = logging.getLogger()
    root.setLevel(settings.log_level)
    if not root.handlers:
        root.addHandler(_Stderr())
    formatter = _json() if settings.log_format == "json" else _Text()
    for handler in root.handlers:
        handler.setFormatter(formatter)
        if _FILTER not in handler.filters:
            # On the handler, not the logger: records of every logger pass through it.
            handler.addFilter(_FILTER)


def dramatiq_main_args() -> list[str]:
    """For a Dramatiq main process (``workers.lifeline``): its lines in this process's format
    too (set up here from the environment's settings), and the argument that keeps
    Dramatiq's CLI from configuring logging in its own format over it. Its worker
    processes inherit the handler, which writes to whatever ``sys.stderr`` is: Dramatiq's
    logging pipe there."""
    from .settings import Settings

    setup(Settings())
    return ["--skip-logging"]
