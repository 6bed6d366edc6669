"""One effect at a time: submit, inspect, list, and the operator actions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
import typer.core

from ._app import app, emit, fail, line, table
from .params import (
    _INSPECT_FIELDS,
    Actor,
    Cursor,
    Json,
    Key,
    Reason,
    Since,
    _clock,
    _install,
    _json,
    _more,
    _parse_args,
    _prefix,
    _reader,
    _text,
)


@app.command()
def inspect(
    key: Annotated[
        str,
        typer.Argument(
            metavar="KEY",
            callback=_prefix,
            help="the effect's key, or its first 12+ hex digits (as log lines print it)",
        ),
    ],
    as_json: Json = False,
) -> None:
    """Show one effect: state, token, receipt, raw response, late receipts, decisions."""
    from .. import verbs

    ops = _reader()
    if len(key) < 64:
        found = verbs.find_keys(ops, key, limit=2)
        if not found:
            fail(6, "no effect's key starts with these digits")
        if len(found) > 1:
            fail(2, "more than one effect's key starts with these digits: give more of them")
        key = found[0].key
    record = verbs.inspect(ops, key)
    document = record.as_dict()
    if as_json:
        emit(document)
        return
    rows = [(name, _text(document[name])) for name in _INSPECT_FIELDS]
    rows.append(("receipt", json.dumps(document["receipt"])))
    rows += [
        ("late", f"token {r['token']} {json.dumps(r['receipt'])}") for r in record.late_receipts
    ]
    rows += [("history", f"{_iso(h.at_ms)} {h.state} t{h.token} {h.note}") for h in record.history]
    for label, text in rows:
        line(f"{label:>11}: {text}")


def _iso(at_ms: int) -> str:
    """A ledger time (server ms) as an on-call reads it: ISO 8601, UTC, to the millisecond."""
    return datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds")


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
    pending: Annotated[
        bool,
        typer.Option(
            "--pending",
            help="keys only a broker message stands for (a pending marker, no held record)",
        ),
    ] = False,
    as_json: Json = False,
) -> None:
    """List effects by state (default: everything not yet settled); --since / --cursor page
    through the indexed states (a JSON object with next_cursor), --key searches, --pending
    shows the keys that hold only a pending marker."""
    from dedupe import State
    from dedupe.states import INDEXED

    if pending:
        if state or key or since is not None or cursor is not None:
            fail(2, "--pending lists markers alone (drop --state / --key / --since / --cursor)")
        from .. import verbs as door

        ops_of, _ = _clock()
        markers = door.pending_markers(ops_of(), limit=limit)
        markers = [m for m in markers if tool is None or m["tool"] in (None, tool)]
        if as_json:
            emit(markers)
            return
        table(
            ("key", "state", "message", "confirmed", "ttl_s"),
            (
                (m["key"], m["state"], m["message_id"], "yes" if m["confirmed"] else "reserved",
                 "" if m["ttl_ms"] is None else f"{m['ttl_ms'] / 1000:.0f}")
                for m in markers
            ),
        )  # fmt: skip
        return

    try:
        wanted = State(state.upper()) if state else None
    except ValueError:
        fail(2, f"--state: not a state (one of {', '.join(s.value for s in State)})")
    from .. import verbs

    ops, now_ms = _clock()
    if since is not None or cursor is not None:
        if key is not None:
            fail(2, "--key searches by key: it does not page (drop --since / --cursor)")
        if limit > verbs.MAX_PAGE:
            fail(2, f"--limit: a page holds at most {verbs.MAX_PAGE} (go on with --cursor)")
        if wanted is not None and wanted not in INDEXED:
            fail(2, f"--since / --cursor page through {', '.join(INDEXED)} only")
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
    from .. import verbs

    _install()
    document = verbs.resolve(
        key, executed=executed, actor=actor, reason=reason, receipt=parsed,
        override_evidence=override_evidence,
    )  # fmt: skip
    _done(document, as_json)


@app.command()
def revoke(key: Key, actor: Actor, reason: Reason, as_json: Json = False) -> None:
    """Void a DONE effect; the next submission opens generation n+1."""
    from .. import verbs

    _install()
    _done(verbs.revoke(key, actor=actor, reason=reason), as_json)


@app.command()
def supersede(key: Key, actor: Actor, reason: Reason, as_json: Json = False) -> None:
    """Replace a DONE effect; the next submission opens generation n+1."""
    from .. import verbs

    _install()
    _done(verbs.supersede(key, actor=actor, reason=reason), as_json)


@app.command()
def replay(
    key: Key,
    actor: Actor,
    reason: Reason,
    scope: Annotated[
        str | None,
        typer.Option(metavar="ID", help="the original call's scope (a DONE record keeps none)"),
    ] = None,
    action: Annotated[str | None, typer.Option(metavar="NAME")] = None,
    arg: Annotated[
        list[str] | None,
        typer.Option("--arg", metavar="NAME=VALUE", help="repeat; NAME:=JSON for a JSON value"),
    ] = None,
    as_json: Json = False,
) -> None:
    """Send a FAILED / REVOKED / SUPERSEDED effect again: its stored request, or the original
    call given as submit takes it (--scope, --action, --arg), which must derive this key
    with the recorded bound values. A record that settled DONE keeps no request: replay
    from REVOKED / SUPERSEDED needs the call."""
    from .. import verbs

    args = _parse_args(arg) if arg is not None else None
    _install()
    document = verbs.replay(key, actor=actor, reason=reason, scope=scope, action=action, args=args)
    if as_json:
        emit(document)
    else:
        line(f"{document['status']}  {key}")


def _done(document: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(document)
    else:
        line(f"{document['state']}  {document['key']}  token {document['token']}")
