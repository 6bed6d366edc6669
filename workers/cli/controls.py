"""The on-call's controls: pause and resume a tool or a queue, and what is paused and
limited (``workers.broker.gate``)."""

from __future__ import annotations

from typing import Annotated

import typer

from ._app import _Refused, app, emit, fail, line, table
from .params import Actor, Json, Reason, _install, _tool


def _queue(value: str | None) -> str | None:
    from ..broker.gate import QUEUE_NAME

    if value is not None and not QUEUE_NAME.fullmatch(value):
        raise _Refused("must be a queue's name (a letter or _, then letters, digits, _ . -; "
                       "at most 64)")  # fmt: skip
    return value


def _maybe_tool(value: str | None) -> str | None:
    return None if value is None else _tool(value)


_Tool = Annotated[
    str | None,
    typer.Option(metavar="TOOL", callback=_maybe_tool, help="the tool (one of --tool, --queue)"),
]
_Queue = Annotated[
    str | None,
    typer.Option(metavar="QUEUE", callback=_queue, help="the queue (one of --tool, --queue)"),
]


def _target(tool: str | None, queue: str | None) -> tuple[str, str]:
    if (tool is None) == (queue is None):
        fail(2, "name one tool (--tool) or one queue (--queue)")
    return ("tool", tool) if tool is not None else ("queue", queue or "")


def _set(pause: bool, tool: str | None, queue: str | None, actor: str, reason: str,
         as_json: bool) -> None:  # fmt: skip
    from .. import verbs

    kind, name = _target(tool, queue)
    _install()
    act = verbs.pause if pause else verbs.resume
    document = act(kind, name, actor=actor, reason=reason)
    if as_json:
        emit(document)
        return
    state = "paused" if pause else "resumed"
    line(f"{kind} {name} {state}" + ("" if document["changed"] else f" (was {state} already)"))


@app.command()
def pause(
    actor: Actor,
    reason: Reason,
    tool: _Tool = None,
    queue: _Queue = None,
    as_json: Json = False,
) -> None:
    """Hold back a tool's (or a queue's) messages: none is claimed, run or dead-lettered, no
    retry is spent; they wait and run after resume (audited). Takes effect on every worker
    within a second."""
    _set(True, tool, queue, actor, reason, as_json)


@app.command()
def resume(
    actor: Actor,
    reason: Reason,
    tool: _Tool = None,
    queue: _Queue = None,
    as_json: Json = False,
) -> None:
    """Let a paused tool's (or queue's) messages run again (audited); those held back run
    within 5 to 36 seconds (the longer they were held, the later)."""
    _set(False, tool, queue, actor, reason, as_json)


@app.command()
def controls(as_json: Json = False) -> None:
    """What is paused (by whom, why, since when), and each tool's queue and declared
    rate and concurrency limits."""
    from .. import verbs

    _install()
    document = verbs.controls()
    if as_json:
        emit(document)
        return
    for entry in document["paused"]:
        line(f"paused: {entry['kind']} {entry['name']} by {entry['actor']} since {entry['at']}: "
             f"{entry['reason']}")  # fmt: skip
    if not document["paused"]:
        line("nothing paused")
    table(
        ("tool", "queue", "held back", "rate", "concurrency"),
        [
            (t["tool"], t["queue"], "paused" if t["paused"] else "-", t["rate"] or "-",
             str(t["concurrency"] or "-"))
            for t in document["tools"]
        ],
    )  # fmt: skip
