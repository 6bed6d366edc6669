"""Incident views and bulk tools: dead letters, the audit stream, the bulk re-check."""

from __future__ import annotations

from typing import Annotated

import typer
import typer.core

from ._app import app, emit, fail, line, table, words
from .params import (
    Actor,
    Cursor,
    Json,
    Limit,
    Reason,
    Since,
    ToolName,
    _clock,
    _install,
    _maybe_key,
    _more,
    _text,
    _tool,
)


@app.command()
def deadletters(
    since: Since = None,
    tool: ToolName = None,
    limit: Limit = 100,
    cursor: Cursor = None,
    as_json: Json = False,
) -> None:
    """The dead-letter stream, newest first: why each message was dead-lettered."""
    from .. import verbs

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
    from .. import verbs

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
    from .. import verbs

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
