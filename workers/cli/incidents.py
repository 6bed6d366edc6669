"""Incident views and bulk tools: dead letters, the audit stream, the bulk re-check."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Annotated, Any

import typer
import typer.core

from ._app import _Refused, app, emit, fail, line, table, words
from .params import (
    Cursor,
    Json,
    Limit,
    Since,
    ToolName,
    Until,
    _clock,
    _install,
    _maybe_key,
    _more,
    _text,
    _tool,
)


def _kind(value: str | None) -> str | None:
    from ..metrics import DEAD_LETTER_REASONS

    if value is not None and value not in DEAD_LETTER_REASONS:
        raise _Refused(f"must be one of {', '.join(DEAD_LETTER_REASONS)}")
    return value


def _kind_of(entry: dict[str, Any]) -> str:
    """The bounded reason of a dead-letter entry (``effectq_dead_letters_total``'s label),
    read back from the text the worker recorded: "unknown tool ...", "<ExceptionType>:
    ...", or "rejected" (``broker.middleware``), the exception's type classified as
    ``dead_letter_kind`` classifies the exception itself."""
    from ..broker.dead_letters import UNDECODABLE

    reason = str(entry.get("reason", ""))
    if entry.get("tool") == UNDECODABLE:
        return "undecodable"
    if reason.startswith("unknown tool "):
        return "unknown_tool"
    if reason == "rejected":
        return "other"
    return _kinds().get(reason.partition(":")[0], "retries_exhausted")


@cache
def _kinds() -> dict[str, str]:
    """effectq's exception types by name → their dead-letter reason."""
    from dedupe import EffectqError

    from ..broker.middleware import dead_letter_kind

    def tree(cls: type[BaseException]) -> Iterator[type[BaseException]]:
        yield cls
        for sub in cls.__subclasses__():
            yield from tree(sub)

    # An instance without __init__ is enough: the classifier reads only its type.
    return {cls.__name__: dead_letter_kind(cls.__new__(cls)) for cls in tree(EffectqError)}


@app.command()
def deadletters(
    since: Since = None,
    tool: ToolName = None,
    reason: Annotated[
        str | None,
        typer.Option(
            metavar="REASON",
            callback=_kind,
            help="only this reason: conflict, invalid_message, unknown_tool, stale, rejected, "
            "retries_exhausted, undecodable, other",
        ),
    ] = None,
    limit: Limit = 100,
    cursor: Cursor = None,
    as_json: Json = False,
) -> None:
    """The dead-letter stream, newest first: why each message was dead-lettered."""
    from .. import verbs

    verbs.stream_cursor(cursor)
    ops, now_ms = _clock()
    since_ms = verbs.parse_since(since, now_ms=now_ms, what="--since")
    if reason is None:
        page = verbs.dead_letters(ops(), since_ms=since_ms, tool=tool, cursor=cursor, limit=limit)
    else:
        page = _of_kind(ops(), reason, since_ms=since_ms, tool=tool, cursor=cursor, limit=limit)
    if as_json:
        emit(page)
        return
    table(
        ("at", "tool", "reason", "message id", "key"),
        ((e["at"], e.get("tool", ""), e.get("reason", ""), e.get("message_id", ""),
          _text(e.get("key"))) for e in page["dead_letters"]),
    )  # fmt: skip
    _more(page["next_cursor"])


def _of_kind(
    ops: Any,
    kind: str,
    *,
    since_ms: int | None,
    tool: str | None,
    cursor: str | None,
    limit: int,
) -> dict[str, Any]:
    """A page of the dead letters of one reason: the stream's pages read on until ``limit``
    match (or it ends); the cursor goes on after the last one shown."""
    from .. import verbs

    found: list[dict[str, Any]] = []
    while True:
        page = verbs.dead_letters(
            ops, since_ms=since_ms, tool=tool, cursor=cursor, limit=verbs.MAX_PAGE
        )
        for entry in page["dead_letters"]:
            if _kind_of(entry) == kind:
                found.append(entry)
                if len(found) == limit:
                    return {"dead_letters": found, "next_cursor": entry["id"]}
        cursor = page["next_cursor"]
        if cursor is None:
            return {"dead_letters": found, "next_cursor": None}


@app.command()
def audit(
    key: Annotated[
        str | None,
        typer.Argument(metavar="KEY", callback=_maybe_key, help="one effect's whole trail"),
    ] = None,
    key_option: Annotated[
        str | None,
        typer.Option("--key", metavar="KEY", callback=_maybe_key, help="the same as KEY"),
    ] = None,
    since: Since = None,
    actor: Annotated[str | None, typer.Option(metavar="NAME", help="this actor's only")] = None,
    limit: Limit = 100,
    cursor: Cursor = None,
    as_json: Json = False,
) -> None:
    """The audit stream, newest first: operator actions and refusals (or one effect's)."""
    from .. import verbs

    if key is not None and key_option is not None and key != key_option:
        fail(2, "KEY and --key name two effects: give one")
    key = key or key_option
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


_OptionalActor = Annotated[
    str | None, typer.Option(metavar="NAME", help="who acts (audited); not needed with --dry-run")
]
_OptionalReason = Annotated[
    str | None, typer.Option(metavar="TEXT", help="why (audited); not needed with --dry-run")
]


@app.command()
def recheck(
    tool: Annotated[str, typer.Option(metavar="TOOL", callback=_tool, help="the tool's effects")],
    actor: _OptionalActor = None,
    reason: _OptionalReason = None,
    since: Since = None,
    until: Until = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count them; change nothing")] = False,
    as_json: Json = False,
) -> None:
    """Send UNKNOWN effects of a tool back to the reconciler (which asks the provider again);
    --since / --until: became UNKNOWN in that range."""
    from .. import verbs

    if not dry_run and (actor is None or reason is None):
        fail(2, "--actor and --reason are required (they go to the audit stream) unless --dry-run")
    _, now_ms = _clock()
    since_ms = verbs.parse_since(since, now_ms=now_ms, what="--since")
    until_ms = verbs.parse_since(until, now_ms=now_ms, what="--until")
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        fail(2, "--since is after --until: the range is empty")
    _install()
    document = verbs.recheck(
        tool, since_ms=since_ms, until_ms=until_ms, actor=actor or "-", reason=reason or "-",
        dry_run=dry_run,
    )  # fmt: skip
    if as_json:
        emit(document)
    elif dry_run:
        line(f"dry run: {document['matched']} UNKNOWN {tool} effects would go back to the "
             "reconciler; nothing changed")  # fmt: skip
    else:
        refused = f"; refused (resolved meanwhile): {words(document['refused'])}"
        line(f"rechecked {document['rechecked']} of {document['matched']} UNKNOWN {tool} "
             f"effects{refused if document['refused'] else ''}")  # fmt: skip


_MessageIds = Annotated[
    list[str] | None,
    typer.Argument(metavar="MESSAGE_ID", help="the messages (effectq deadletters shows them)"),
]
_All = Annotated[bool, typer.Option("--all", help="every dead message (of --tool, if given)")]
_Queues = Annotated[
    list[str] | None,
    typer.Option("--queue", metavar="QUEUE", help="this queue's (default: every tool's queue)"),
]
_DryRun = Annotated[bool, typer.Option("--dry-run", help="count them; change nothing")]
_AtMost = Annotated[
    int, typer.Option("--limit", metavar="N", min=1, max=1000, help="at most N, oldest first")
]


def _dead_queue(action: str, message_ids: list[str] | None, **options: Any) -> None:
    from .. import verbs

    as_json = options.pop("as_json")
    if not options["dry_run"] and (options["actor"] is None or options["reason"] is None):
        fail(2, "--actor and --reason are required (they go to the audit stream) unless --dry-run")
    options["actor"] = options["actor"] or "-"
    options["reason"] = options["reason"] or "-"
    _install()
    document = verbs.dead_queue(action, message_ids=message_ids or [], **options)
    if as_json:
        emit(document)
        return
    if document["dry_run"]:
        line(f"dry run: {document['matched']} dead messages would be {action}d; nothing changed")
        return
    refused, missing = document["refused"], document["not_found"]
    line(f"{action}d {len(document[action + 'd'])} of {document['matched']} dead messages"
         + (f"; refused: {len(refused)}" if refused else "")
         + (f"; not dead (any more): {len(missing)}" if missing else "")
         + ("; more match: run it again" if document["more"] else ""))  # fmt: skip


@app.command()
def requeue(
    message_ids: _MessageIds = None,
    everything: _All = False,
    tool: ToolName = None,
    queue: _Queues = None,
    actor: _OptionalActor = None,
    reason: _OptionalReason = None,
    dry_run: _DryRun = False,
    limit: _AtMost = 1000,
    as_json: Json = False,
) -> None:
    """Put dead-lettered messages back on their queue, with a fresh retry budget (audited)."""
    _dead_queue(
        "requeue", message_ids, everything=everything, tool=tool, queues=queue, actor=actor,
        reason=reason, dry_run=dry_run, limit=limit, as_json=as_json,
    )  # fmt: skip


@app.command()
def purge(
    message_ids: _MessageIds = None,
    everything: _All = False,
    tool: ToolName = None,
    queue: _Queues = None,
    actor: _OptionalActor = None,
    reason: _OptionalReason = None,
    dry_run: _DryRun = False,
    limit: _AtMost = 1000,
    as_json: Json = False,
) -> None:
    """Drop dead-lettered messages from the broker for good (audited)."""
    _dead_queue(
        "purge", message_ids, everything=everything, tool=tool, queues=queue, actor=actor,
        reason=reason, dry_run=dry_run, limit=limit, as_json=as_json,
    )  # fmt: skip


@app.command()
def scheduled(
    retrying: Annotated[
        bool, typer.Option("--retrying", help="only those that failed at least once")
    ] = False,
    delayed: Annotated[
        bool, typer.Option("--delayed", help="only those sent with a delay (never ran)")
    ] = False,
    tool: ToolName = None,
    limit: Limit = 100,
    cursor: Cursor = None,
    as_json: Json = False,
) -> None:
    """Messages waiting in the broker's delay queues, by next attempt: retries backing off
    and delayed sends (tool, key prefix, message id, next attempt, retries, why)."""
    from .. import verbs

    if retrying and delayed:
        fail(2, "--retrying and --delayed exclude each other: give one")
    _install()
    kind = "retrying" if retrying else "delayed" if delayed else None
    page = verbs.scheduled(kind=kind, tool=tool, cursor=cursor, limit=limit)
    if as_json:
        emit(page)
        return
    table(
        ("next attempt", "tool", "key", "message id", "retries", "why"),
        ((m["next_attempt"] or "—", m["tool"], m["key_prefix"], m["message_id"],
          str(m["retries"]), m["why"] + (f" ({m['error']})" if m["error"] else ""))
         for m in page["scheduled"]),
    )  # fmt: skip
    if page["read"] < page["total"]:
        line(f"(sorted the first {page['read']} of {page['total']} delayed messages)")
    _more(page["next_cursor"])
