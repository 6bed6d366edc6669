"""The faces' reads: records, pages of the state indexes and streams, key search, the
campaign and campaign-job documents. Each takes an ``Operator`` built by ``reader`` (just the
ledger), checks its bounds and cursors before anything is contacted, and answers a record or
the ``--json`` document."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dedupe import MessageError, State
from dedupe.identity import EFFECT_KEY, KEY_OR_PREFIX

if TYPE_CHECKING:
    from dedupe import EffectRecord
    from reconciler import Operator

    from ..settings import Settings


def reader(cfg: Settings) -> Operator:
    """The operator's reads: just the ledger of ``cfg`` (no tools, no broker)."""
    from reconciler.operator import Operator

    from ..settings import ledger_from_settings

    return Operator(ledger_from_settings(cfg))


def inspect(ops: Operator, key: str) -> EffectRecord:
    """One effect's record; NotFoundError when no effect has this key."""
    return ops.inspect(key)


# A page is bounded (the stream and index reads go on by cursor, never by a bigger page).
MAX_PAGE = 1000
_YEAR_S = 366 * 86400
_STREAM_ID = re.compile(r"[0-9]{1,16}-[0-9]{1,16}")
_PAGE_CURSOR = re.compile(rf"[ul][0-9]{{1,16}}\.{EFFECT_KEY.pattern}")


def parse_since(text: str | None, *, now_ms: Callable[[], int], what: str = "since") -> int | None:
    """A time bound as the faces take it: an ISO 8601 time (UTC unless it names its
    offset) or a number of seconds ago (up to a year), as ledger ms; MessageError else."""
    if text is None:
        return None
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not (math.isfinite(seconds) and 0 <= seconds <= _YEAR_S):
            raise MessageError(f"{what}: seconds ago must be between 0 and {_YEAR_S}")
        return now_ms() - int(seconds * 1000)
    if len(text) > 40:
        raise MessageError(f"{what}: not a time (ISO 8601, or seconds ago)")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise MessageError(f"{what}: not a time (ISO 8601, or seconds ago)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if not 2000 <= moment.year <= 9999:
        raise MessageError(f"{what}: the year must be between 2000 and 9999")
    return int(moment.timestamp() * 1000)


def _page_size(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise MessageError(f"limit must be between 1 and {MAX_PAGE}")
    return limit


def stream_cursor(cursor: str | None) -> str | None:
    """A stream page's cursor (an entry id), checked before anything is contacted."""
    if cursor is not None and not _STREAM_ID.fullmatch(cursor):
        raise MessageError("not a cursor of this stream (pass the one a page handed out)")
    return cursor


def page_cursor(cursor: str | None) -> str | None:
    """A state-index page's cursor, checked before anything is contacted."""
    if cursor is not None and not _PAGE_CURSOR.fullmatch(cursor):
        raise MessageError("not a cursor of this listing (pass the one a page handed out)")
    return cursor


def effects(
    ops: Operator,
    *,
    state: State | None = None,
    tool: str | None = None,
    since_ms: int | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> tuple[list[EffectRecord], str | None]:
    """A page of the state indexes (UNKNOWN by when it became so, then the leases) and the
    cursor of the next one, None at the end."""
    return ops.page(
        state=state, tool=tool, since_ms=since_ms, cursor=page_cursor(cursor),
        limit=_page_size(limit),
    )  # fmt: skip


def effects_page(
    ops: Operator,
    *,
    state: State | None = None,
    tool: str | None = None,
    since_ms: int | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> dict[str, Any]:
    """``list --since/--cursor --json``: ``effects`` as a document."""
    records, following = effects(
        ops, state=state, tool=tool, since_ms=since_ms, cursor=cursor, limit=limit
    )
    return {"effects": [r.as_dict() for r in records], "next_cursor": following}


def find_keys(ops: Operator, text: str, *, limit: int = 100) -> list[EffectRecord]:
    """Key search: the record of an exact key, or of keys starting with ``text`` (at least
    12 hex digits, as a log line shows a key; the ledger scans for them)."""
    text = text.strip().lower()
    if not KEY_OR_PREFIX.fullmatch(text):
        raise MessageError("a key search needs an effect key or its first 12+ hex digits")
    keys = [text] if len(text) == 64 else ops.ledger.keys_with_prefix(text, limit=limit)
    return [r for r in ops.ledger.get_many(keys).values() if r is not None]


def dead_letters(
    ops: Operator,
    *,
    since_ms: int | None = None,
    tool: str | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> dict[str, Any]:
    """``deadletters --json``: the dead-letter stream newest first (reason, tool, message
    id, key) and the cursor of the next page."""
    entries, following = ops.stream(
        "deadletters", before=stream_cursor(cursor), since_ms=since_ms,
        limit=_page_size(limit), where={"tool": tool} if tool else None,
    )  # fmt: skip
    return {"dead_letters": [_entry(e) for e in entries], "next_cursor": following}


def audit_page(
    ops: Operator,
    *,
    key: str | None = None,
    since_ms: int | None = None,
    actor: str | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> dict[str, Any]:
    """``audit --json``: the audit stream (operator actions and refusals) newest first, or
    one effect's whole trail with ``key``; the cursor of the next page."""
    entries, following = ops.stream(
        "audit", before=stream_cursor(cursor), since_ms=since_ms, key=key,
        limit=_page_size(limit), where={"actor": actor} if actor else None,
    )  # fmt: skip
    return {"audit": [_entry(e) for e in entries], "next_cursor": following}


def _entry(entry: Mapping[str, str]) -> dict[str, Any]:
    """A stream entry with the time its id carries (server ms) spelt out."""
    at_ms = int(entry["id"].partition("-")[0])
    return {**entry, "at_ms": at_ms, "at": datetime.fromtimestamp(at_ms / 1000, UTC).isoformat()}


def list_effects(
    ops: Operator, *, state: State | None = None, tool: str | None = None, limit: int = 100
) -> list[EffectRecord]:
    return ops.list(state=state, tool=tool, limit=limit)


def pending_markers(ops: Operator, *, limit: int = 100) -> list[dict[str, Any]]:
    """Keys that only a broker message stands for (a pending marker, no record a worker
    holds): what ``list --pending`` and the API show, so that an effect whose message the
    broker lost is not invisible."""
    return [m.as_dict() for m in ops.ledger.markers(limit=limit)]


def expired_claims(ops: Operator, *, limit: int = 200) -> list[EffectRecord]:
    """Claims whose lease ran out, awaiting the reconciler (at most 8 per bucket)."""
    expired = ops.ledger.expired(limit=8)[:limit]
    return [r for r in ops.ledger.get_many(expired).values() if r is not None]


def audit_trail(ops: Operator, key: str) -> list[dict[str, Any]]:
    """One effect's whole audit trail, newest first (its own index: no stream scan)."""
    trail: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = audit_page(ops, key=key, cursor=cursor, limit=MAX_PAGE)
        trail += page["audit"]
        cursor = page["next_cursor"]
        if cursor is None:
            return trail


def campaign_status(
    ops: Operator, campaign_id: str, *, cursor: int = 0, page_size: int = 100
) -> dict[str, Any]:
    """``campaign status --json``; CampaignNotFoundError when there is no such campaign."""
    from ..campaigns.status import campaign_status as status

    return status(campaign_id, cursor=cursor, page_size=page_size, ledger=ops.ledger)


def campaign_job(
    ops: Operator, campaign_id: str, job_id: str, *, lost_after_ms: int | None = None
) -> dict[str, Any]:
    """A campaign job (``GET /v1/campaigns/{id}/jobs/{job}``): its state (queued, planning,
    sending, done, failed, lost), progress, the report or the error, and once its plan is
    approved the campaign's own status; read where the job is written
    (``workers.campaigns.jobs``). CampaignNotFoundError when there is no such job."""
    from ..campaigns.jobs import read_job

    return read_job(ops.ledger, campaign_id, job_id, lost_after_ms=lost_after_ms)
