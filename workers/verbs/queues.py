"""The faces' controls of the broker's queues: the delayed messages (scheduled and
retrying work), the dead letters requeued or purged, and pause/resume with the declared limits
(``workers.broker.gate``). The Redis broker's queues can be read and moved; on RabbitMQ these
answer why not."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dedupe import MessageError, OperatorError

from .reads import MAX_PAGE, _page_size

if TYPE_CHECKING:
    from ..runtime import Runtime

_MESSAGE_ID = re.compile(r"[0-9a-f-]{36}")
# What one scheduled page reads at most: a retry storm's delay queues can hold far more.
MAX_SCHEDULED_READ = 10_000
_SCHEDULED_CURSOR = re.compile(r"[0-9]{1,16}\.[0-9a-f-]{36}")
SCHEDULED_KINDS = ("retrying", "delayed")


def _redis_queues(what: str, rabbitmq: str) -> tuple[Any, list[str]]:
    """The Redis broker of the current runtime and every declared tool's queue; on another
    broker a MessageError saying why (``rabbitmq``)."""
    from ..broker.redis import EffectqRedisBroker
    from ..registry import tools
    from ..runtime import current

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
    from ..broker.dead_queue import Delayed, DelayQueue

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
    from ..broker.dead_queue import DeadLetterQueue
    from ..runtime import current

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

    from ..broker.gate import check_target, set_paused
    from ..runtime import current

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
    from ..registry import tools
    from ..tool import EffectTool

    declared = [t for t in tools() if isinstance(t, EffectTool)]
    queues = {t.actor.queue_name for t in declared} | {rt.settings.queue}
    return {"tool": {t.name for t in declared}, "queue": queues}


def controls() -> dict[str, Any]:
    """``controls --json``: what is paused (by whom, why, since when) and, per declared
    tool, its queue, whether it is held back and its declared limits."""
    from ..broker.gate import LIMITS_OPTION, Limits, paused
    from ..registry import tools
    from ..runtime import current
    from ..tool import EffectTool

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
