"""The one door of effectq's faces — the ``effectq`` CLI, the HTTP API and the console: every
read and every action they offer, written once.

Each returns a record or the JSON document that ``effectq … --json`` prints and the API
answers (DESIGN §8), or raises from effectq's error tree; the CLI maps the error to an exit
code, the API to a status code. Reads take an ``Operator`` built by ``reader`` (just the
ledger: no tools, no Dramatiq, so a CLI read starts quickly); actions run on ``operator()``,
which needs the tools (``EFFECTQ_TOOLS``) loaded. Nothing here imports the web framework.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dedupe import MessageError, OperatorError, State, Write
from dedupe.identity import EFFECT_KEY

if TYPE_CHECKING:
    from dedupe import EffectRecord
    from reconciler import Operator

    from .campaigns import CampaignFile, CampaignReport, CampaignSource
    from .producer import Handle
    from .runtime import Runtime
    from .settings import Settings

__all__ = [
    "MAX_PAGE",
    "audit_page",
    "audit_trail",
    "await_receipt",
    "campaign_job",
    "campaign_status",
    "controls",
    "dead_letters",
    "dead_queue",
    "effects",
    "effects_page",
    "expired_claims",
    "find_keys",
    "inspect",
    "list_effects",
    "open_campaign_file",
    "operator",
    "page_cursor",
    "parse_since",
    "pause",
    "reader",
    "recheck",
    "replay",
    "resolve",
    "resume",
    "revoke",
    "scheduled",
    "stream_cursor",
    "submit_call",
    "submit_campaign_file",
    "submit_campaign_source",
    "supersede",
    "write_document",
]

# producer.submit takes these as its own parameters: a tool argument by one of these names
# could not be passed through (and would be a TypeError deep in a request).
_RESERVED = frozenset({"tool", "scope", "action"})


# -- reads ------------------------------------------------------------------------------------


def reader(cfg: Settings) -> Operator:
    """The operator's reads: just the ledger of ``cfg`` (no tools, no broker)."""
    from reconciler.operator import Operator

    from .settings import ledger_from_settings

    return Operator(ledger_from_settings(cfg))


def adopt_namespace(cfg: Settings, *, actor: str, reason: str) -> dict[str, Any]:
    """``effectq ledger adopt``: register ``cfg.namespace`` in the ledger's version record
    on an operator's word (the upgrade of a ledger written before versions existed, whose
    records no namespace check can attribute), audited with actor and reason."""
    from dedupe import Ledger
    from reconciler.operator import check_words

    check_words(actor, reason)
    ledger = Ledger.from_url(
        cfg.redis_url, namespace=cfg.namespace, allow_volatile=cfg.allow_volatile_ledger
    )
    return ledger.adopt_namespace(actor=actor, reason=reason)


def inspect(ops: Operator, key: str) -> EffectRecord:
    """One effect's record; NotFoundError when no effect has this key."""
    return ops.inspect(key)


# A page is bounded (the stream and index reads go on by cursor, never by a bigger page).
MAX_PAGE = 1000
_YEAR_S = 366 * 86400
_STREAM_ID = re.compile(r"[0-9]{1,16}-[0-9]{1,16}")
_PREFIX = re.compile(r"[0-9a-f]{12,64}")
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
    if not _PREFIX.fullmatch(text):
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
    from .campaigns.status import campaign_status as status

    return status(campaign_id, cursor=cursor, page_size=page_size, ledger=ops.ledger)


def campaign_job(
    ops: Operator, campaign_id: str, job_id: str, *, lost_after_ms: int | None = None
) -> dict[str, Any]:
    """A campaign job (``GET /v1/campaigns/{id}/jobs/{job}``): its state (queued, planning,
    sending, done, failed, lost), progress, the report or the error, and once its plan is
    approved the campaign's own status; read where the job is written
    (``workers.campaigns.jobs``). CampaignNotFoundError when there is no such job."""
    from .campaigns.jobs import read_job

    return read_job(ops.ledger, campaign_id, job_id, lost_after_ms=lost_after_ms)


# -- actions ----------------------------------------------------------------------------------


def operator(rt: Runtime | None = None) -> Operator:
    """The operator of ``rt`` (default: the current runtime) for the tools declared here."""
    from reconciler.operator import Operator

    from . import registry
    from .runtime import current

    return Operator((rt or current()).ledger(), registry.specs())


def submit_call(
    tool: str, *, scope: str, action: str | None = None, args: Mapping[str, Any] | None = None
) -> Handle:
    """Submit one call (deduplicated before the broker); ``Handle.as_dict()`` is the
    ``submit --json`` document."""
    from .producer import submit

    args = dict(args or {})
    reserved = sorted(_RESERVED & args.keys())
    if reserved:
        raise MessageError(f"argument names {reserved} are reserved (tool, scope, action)")
    return submit(tool, scope=scope, action=action, **args)


def await_receipt(handle: Handle, timeout: float) -> Handle:
    """``submit --wait``: block until the receipt while the call is in progress (enqueued
    or pending); raises WaitTimeout, whose details carry the state, if not DONE in time."""
    from .producer import Status

    if handle.status in (Status.ENQUEUED, Status.PENDING):
        handle.wait(timeout)
    return handle


def submit_campaign_file(
    spec: CampaignFile,
    progress: Callable[[int], None] | None = None,
    planning: Callable[[int], None] | None = None,
) -> CampaignReport:
    """Freeze and fan out a campaign given as ``POST /v1/campaigns`` takes it."""
    from .campaigns.submit import submit_campaign

    return submit_campaign(
        spec.campaign_id, spec.tool, spec.recipients, spec.args, action=spec.action,
        plan_version=spec.plan_version, progress=progress, planning=planning,
    )  # fmt: skip


def open_campaign_file(path: str) -> CampaignSource:
    """``effectq campaign submit FILE``: the file checked (JSON, its header, 1 to 1,000,000
    recipients) and counted, not loaded. Raises OSError, pydantic's ValidationError,
    MessageError."""
    from .campaigns.file import CampaignSource

    return CampaignSource.open(path)


def submit_campaign_source(
    source: CampaignSource,
    progress: Callable[[int], None] | None = None,
    planning: Callable[[int], None] | None = None,
) -> CampaignReport:
    """Freeze and fan out a campaign file, streamed (``effectq campaign submit FILE``)."""
    from .campaigns.submit import submit_campaign

    spec = source.header
    return submit_campaign(
        spec.campaign_id, spec.tool, source.recipients(), spec.args, action=spec.action,
        plan_version=spec.plan_version, progress=progress, planning=planning,
    )  # fmt: skip


def write_document(key: str, write: Write) -> dict[str, Any]:
    """``resolve`` / ``revoke`` / ``supersede --json``."""
    return {"key": key, "state": write.state, "token": write.token}


def resolve(
    key: str,
    *,
    executed: bool,
    actor: str,
    reason: str,
    receipt: Mapping[str, Any] | None = None,
    override_evidence: bool = False,
) -> dict[str, Any]:
    write = operator().resolve(
        key, executed=executed, actor=actor, reason=reason, receipt=receipt,
        override_evidence=override_evidence,
    )  # fmt: skip
    return write_document(key, write)


def revoke(key: str, *, actor: str, reason: str) -> dict[str, Any]:
    return write_document(key, operator().revoke(key, actor=actor, reason=reason))


def supersede(key: str, *, actor: str, reason: str) -> dict[str, Any]:
    return write_document(key, operator().supersede(key, actor=actor, reason=reason))


def recheck(
    tool: str,
    *,
    since_ms: int | None,
    until_ms: int | None,
    actor: str,
    reason: str,
    dry_run: bool = False,
) -> dict[str, Any]:
    """``recheck --json``: UNKNOWN effects of ``tool`` (became UNKNOWN in the range) back to
    the reconciler, which asks the provider again; ``dry_run`` counts and changes nothing."""
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        raise MessageError("since is after until: the range is empty")
    return operator().recheck(
        tool, since_ms=since_ms, until_ms=until_ms, actor=actor, reason=reason,
        dry_run=dry_run,
    )  # fmt: skip


def replay(key: str, *, actor: str, reason: str) -> dict[str, Any]:
    """Submit the stored request of a FAILED / REVOKED / SUPERSEDED effect again."""
    from .producer import submit
    from .tool import get_tool

    def enqueue(record: EffectRecord) -> str:
        request = record.request or {}
        scope, args = request.get("scope"), request.get("args")
        if not isinstance(scope, str) or not isinstance(args, dict):
            raise OperatorError("replay refused: the stored request is incomplete", key=key)
        tool = get_tool(record.tool)
        # The stored request must still name this effect: a tool whose declaration changed
        # since would replay under another key, a fresh effect nobody approved.
        if tool.derive(scope, args, request.get("action")).key != key:
            raise OperatorError(
                "replay refused: the stored request no longer derives this key (the tool's "
                "declaration changed); submit the call anew",
                key=key,
            )
        return submit(tool, scope=scope, action=request.get("action"), **args).status.value

    status = operator().replay(key, actor=actor, reason=reason, enqueue=enqueue)
    return {"key": key, "status": status}


# -- the broker's queues: dead letters and delayed messages --------------------------------

_MESSAGE_ID = re.compile(r"[0-9a-f-]{36}")
# What one scheduled page reads at most: a retry storm's delay queues can hold far more.
MAX_SCHEDULED_READ = 10_000
_SCHEDULED_CURSOR = re.compile(r"[0-9]{1,16}\.[0-9a-f-]{36}")
SCHEDULED_KINDS = ("retrying", "delayed")


def _redis_queues(what: str, rabbitmq: str) -> tuple[Any, list[str]]:
    """The Redis broker of the current runtime and every declared tool's queue; on another
    broker a MessageError saying why (``rabbitmq``)."""
    from .broker.redis import EffectqRedisBroker
    from .registry import tools
    from .runtime import current

    rt = current()
    if not isinstance(rt.broker, EffectqRedisBroker):
        raise MessageError(f"{what} needs the Redis broker: on RabbitMQ {rabbitmq}")
    # current() bound every declared tool: each has its queue.
    bound = {t.queue_name for t in tools()}
    return rt.broker, sorted({q for q in bound if q is not None} | {rt.settings.queue})


def scheduled(
    *,
    kind: str | None = None,
    tool: str | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> dict[str, Any]:
    """``scheduled --json``: the messages waiting in the delay queues (Sidekiq's Scheduled
    and Retries tabs) by next attempt, each with its tool, key prefix, message id, next
    attempt, retries so far and why it waits; ``kind`` ``retrying`` (failed at least once)
    or ``delayed`` (never ran). ``total`` counts every delayed message; a page sorts the
    first ``MAX_SCHEDULED_READ`` read (``read``). The Redis broker only."""
    from .broker.dead_queue import Delayed, DelayQueue

    limit = _page_size(limit)
    if kind is not None and kind not in SCHEDULED_KINDS:
        raise MessageError(f"scheduled: the kind is one of {', '.join(SCHEDULED_KINDS)}")
    if cursor is not None and not _SCHEDULED_CURSOR.fullmatch(cursor):
        raise MessageError("not a cursor of this listing (pass the one a page handed out)")
    broker, names = _redis_queues(
        "scheduled", "delayed messages sit in <queue>.DQ queues, which cannot be listed "
        "without consuming them",
    )  # fmt: skip
    total = 0
    read: list[Delayed] = []
    for queue in names:
        delay_queue = DelayQueue(broker.client, queue, broker.namespace)
        total += delay_queue.size()
        read += delay_queue.messages(limit=MAX_SCHEDULED_READ - len(read))
    rows = sorted(
        (m for m in read if (tool is None or m.tool == tool)
         and (kind is None or (m.retries > 0) == (kind == "retrying"))),
        key=lambda m: (m.eta_ms or 0, m.message_id),
    )  # fmt: skip
    if cursor is not None:
        eta, _, after = cursor.partition(".")
        rows = [m for m in rows if (m.eta_ms or 0, m.message_id) > (int(eta), after)]
    page = rows[:limit]
    following = f"{page[-1].eta_ms or 0}.{page[-1].message_id}" if len(rows) > limit else None
    return {
        "scheduled": [
            {"queue": m.queue, "tool": m.tool, "key_prefix": m.key[:12],
             "message_id": m.message_id, "next_attempt_ms": m.eta_ms,
             "next_attempt": None if m.eta_ms is None else _iso(m.eta_ms),
             "retries": m.retries, "why": m.why, "error": m.error}
            for m in page
        ],
        "next_cursor": following, "total": total, "read": len(read),
    }  # fmt: skip


def _iso(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds")


def dead_queue(
    action: str,
    *,
    message_ids: list[str],
    everything: bool = False,
    tool: str | None = None,
    queues: list[str] | None = None,
    actor: str,
    reason: str,
    dry_run: bool = False,
    limit: int = MAX_PAGE,
) -> dict[str, Any]:
    """``requeue --json`` / ``purge --json`` and ``POST /v1/deadletters/{requeue,purge}``:
    dead messages (``message_ids`` — as ``deadletters`` shows them — or all of them with
    ``everything``, those of ``tool`` only) moved back onto their queue with a fresh retry
    budget, or dropped, from ``queues`` (default: every declared tool's queue); at most
    ``limit`` per call, oldest first (``more``: others match, call again). Each one is
    audited on its effect's trail, and the run once more; ``dry_run`` only counts. The
    Redis broker only: RabbitMQ's dead letters are its queue ``<queue>.XQ``."""
    from .broker.dead_queue import DeadLetterQueue
    from .runtime import current

    if action not in ("requeue", "purge"):
        raise MessageError("a dead-letter action is requeue or purge")
    if bool(message_ids) == everything:
        raise MessageError(f"{action}: name the messages, or --all (one or the other)")
    if any(not _MESSAGE_ID.fullmatch(m) for m in message_ids):
        raise MessageError(f"{action}: a message id is 36 characters of hex and dashes")
    if not 1 <= limit <= MAX_PAGE or len(message_ids) > MAX_PAGE:
        raise MessageError(f"{action}: at most {MAX_PAGE} messages per call")
    if not dry_run:
        for name, value in (("actor", actor), ("reason", reason)):
            if not value.strip() or len(value) > 1000:
                raise OperatorError(f"{action}: {name} must be 1 to 1000 characters")
    broker, names = _redis_queues(action, "its dead letters are the queue <queue>.XQ")
    rt = current()
    wanted = set(message_ids) or None
    # Named messages are bounded by their count; a filter by ``limit``.
    bound = len(message_ids) or limit
    letters: list[tuple[Any, Any]] = []  # (its queue, the letter), at most bound + 1
    for queue in queues or names:
        dead = DeadLetterQueue(broker.client, queue, broker.namespace)
        found = dead.letters(tool=tool, ids=wanted, limit=bound + 1 - len(letters))
        letters += [(dead, letter) for letter in found]
        if len(letters) > bound:
            break
    more, letters = len(letters) > bound, letters[:bound]
    done: list[str] = []
    refused: list[str] = []
    seen = {i for _, letter in letters for i in (letter.message_id, letter.redis_id)}
    for dead, letter in [] if dry_run else letters:
        if action == "requeue" and not letter.tool:
            outcome = "refused: undecodable (purge it)"
        elif (dead.requeue if action == "requeue" else dead.purge)(letter.redis_id):
            where = "back on" if action == "requeue" else "dropped from"
            outcome = f"ok: {where} {dead.queue}"
        else:
            outcome = "refused: no longer dead"
        (done if outcome.startswith("ok") else refused).append(letter.message_id)
        rt.ledger().audit(
            action=f"deadletter_{action}", key=letter.key, actor=actor, reason=reason,
            outcome=f"{outcome} (message {letter.message_id})",
        )  # fmt: skip
    if not dry_run:
        rt.ledger().audit(
            action=f"deadletter_{action}", key="", actor=actor, reason=reason,
            outcome=f"ok: {len(done)} of {len(letters)}",
        )  # fmt: skip
    return {
        "matched": len(letters), f"{action}d": done, "refused": refused,
        "not_found": sorted((wanted or set()) - seen), "dry_run": dry_run, "more": more,
    }  # fmt: skip


# -- pause and resume, limits (workers.broker.gate) ---------------------------------------


def pause(kind: str, name: str, *, actor: str, reason: str) -> dict[str, Any]:
    """``pause --json``: hold back every message of a tool (``kind`` "tool") or a queue —
    none claimed, none run, none dead-lettered — until ``resume``; audited."""
    return _set_paused(kind, name, pause=True, actor=actor, reason=reason)


def resume(kind: str, name: str, *, actor: str, reason: str) -> dict[str, Any]:
    """``resume --json``: let a paused tool's or queue's messages run again; audited."""
    return _set_paused(kind, name, pause=False, actor=actor, reason=reason)


def _set_paused(kind: str, name: str, *, pause: bool, actor: str, reason: str) -> dict[str, Any]:
    from reconciler.operator import check_words

    from .broker.gate import check_target, set_paused
    from .runtime import current

    check_target(kind, name)
    check_words(actor, reason)
    rt = current()
    # A typo must not answer "paused" while the tool it meant runs on.
    if name not in _declared(rt)[kind]:
        raise OperatorError(f"{'pause' if pause else 'resume'} refused: no {kind} of that name "
                            "is declared here")  # fmt: skip
    return set_paused(rt.ledger(), kind, name, pause=pause, actor=actor, reason=reason)


def _declared(rt: Runtime) -> dict[str, set[str]]:
    """The declared tools and their queues (bound to ``rt``: each has its queue)."""
    from .registry import tools
    from .tool import EffectTool

    declared = [t for t in tools() if isinstance(t, EffectTool)]
    queues = {t.actor.queue_name for t in declared} | {rt.settings.queue}
    return {"tool": {t.name for t in declared}, "queue": queues}


def controls() -> dict[str, Any]:
    """``controls --json``: what is paused (by whom, why, since when) and, per declared
    tool, its queue, whether it is held back and its declared limits."""
    from .broker.gate import LIMITS_OPTION, Limits, paused
    from .registry import tools
    from .runtime import current
    from .tool import EffectTool

    rt = current()
    held = paused(rt.ledger())
    rows = []
    for tool in sorted((t for t in tools() if isinstance(t, EffectTool)), key=lambda t: t.name):
        queue = tool.actor.queue_name
        limits = tool.actor.options.get(LIMITS_OPTION)
        rows.append({
            "tool": tool.name, "queue": queue,
            "paused": ("tool", tool.name) in held or ("queue", queue) in held,
            **(limits.as_dict() if isinstance(limits, Limits) else Limits().as_dict()),
        })  # fmt: skip
    return {
        "paused": [
            {"kind": kind, "name": name, **_note(note)}
            for (kind, name), note in sorted(held.items())
        ],
        "tools": rows,
    }


def _note(note: Mapping[str, Any]) -> dict[str, Any]:
    at_ms = note.get("at_ms")
    at = datetime.fromtimestamp(at_ms / 1000, UTC).isoformat() if isinstance(at_ms, int) else None
    return {"actor": note.get("actor"), "reason": note.get("reason"), "at_ms": at_ms, "at": at}
