"""Campaign batches: one logical send to many recipients, one message per recipient.

On approval the plan (recipient → effect key) is frozen in Redis before the first message
is sent; the campaign id is the scope of every key, so no clock enters one. Re-submitting
sends only what is not DONE (nor held by a live claim). A different recipient list or
changed bound arguments under the same campaign id is a conflict, unless it comes as an
explicit new ``plan_version``, whose diff is reported: added recipients are sent, removed
ones are listed, never "un-sent".
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints

from dedupe import (
    CampaignPlan,
    CampaignStore,
    ConflictError,
    Effect,
    IdentityError,
    Ledger,
    MessageError,
    RecordTooLargeError,
    SubmitStatus,
    campaign_tag,
    canonical_bytes,
)
from dedupe.campaigns import normalize_campaign_id
from dedupe.failpoints import failpoint

from . import tracing
from .broker.fanout import enqueue_many
from .producer import confirm_pending
from .registry import get_tool
from .runtime import current
from .tool import EffectTool, Envelope

__all__ = ["CampaignFile", "CampaignReport", "campaign_status", "submit_campaign"]

BATCH = 1000
# Approval rounds against concurrent submissions of one campaign before giving up.
_APPROVALS = 3
_HAD_A_MESSAGE = frozenset({SubmitStatus.DONE, SubmitStatus.PENDING, SubmitStatus.BLOCKED})
# The per-recipient state a producer sees, from the ledger's.
RECIPIENT_STATE = {
    None: "pending", "CLAIMED": "pending", "RECONCILING": "pending", "DONE": "done",
    "FAILED": "failed", "UNKNOWN": "unknown", "REVOKED": "revoked", "SUPERSEDED": "revoked",
}  # fmt: skip


class CampaignFile(BaseModel):
    """``effectq campaign submit FILE``: the file's strict shape."""

    model_config = ConfigDict(strict=True, extra="forbid")

    campaign_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    tool: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    action: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    args: dict[str, JsonValue] = {}
    recipients: Annotated[list[JsonValue], Field(min_length=1, max_length=1_000_000)]
    plan_version: Annotated[int, Field(ge=1)] | None = None


@dataclass
class CampaignReport:
    campaign_id: str
    plan_version: int
    recipients: int
    collapsed: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    sent: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    added: int = 0
    removed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _recipient_field(tool: EffectTool, args: dict[str, Any]) -> str:
    free = [f for f in tool.spec.identity if f not in args]
    if len(free) != 1:
        raise MessageError(
            f"{tool.name}: a campaign varies exactly one identity field per recipient; "
            f"{tool.spec.identity} leaves {free or 'none'} open"
        )
    return free[0]


def _sha(value: Any) -> str:
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def submit_campaign(
    campaign_id: str,
    tool: str | EffectTool,
    recipients: Sequence[Any],
    args: dict[str, Any] | None = None,
    *,
    action: str | None = None,
    plan_version: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> CampaignReport:
    """Freeze the plan for ``recipients`` and fan it out; see the module docstring.

    Raises ConflictError for a changed list or changed bound arguments under the same plan
    version, or a plan another submission approved meanwhile; invalid recipients (a value
    the normalizer refuses, a request over the bound a worker enforces) are rejected one
    by one (index and reason), never dropped and never enqueued.
    """
    target = get_tool(tool) if isinstance(tool, str) else tool
    # One campaign whatever the spelling: the id as derive() treats the scope of every key.
    campaign_id = normalize_campaign_id(campaign_id)
    args = dict(args or {})
    recipient = _recipient_field(target, args)
    report = CampaignReport(campaign_id, plan_version or 1, 0)
    # Free content (the template) is the same for every recipient and enters neither key nor
    # fingerprint: derive each recipient without it, check and normalize it once.
    template = {k: v for k, v in args.items() if k in target.spec.free}
    shared = {k: v for k, v in args.items() if k not in template}
    effects: dict[str, Effect] = {}
    index_of: dict[str, int] = {}
    for index, value in enumerate(recipients):
        try:
            effect = target.derive(campaign_id, {**shared, recipient: value}, action)
        except IdentityError as exc:
            report.rejected.append({"index": index, "reason": exc.message})
            continue
        if effect.key in effects:
            report.collapsed += 1
        effects.setdefault(effect.key, effect)  # the first spelling is the one mailed
        index_of.setdefault(effect.key, index)
    if effects:
        sample = next(iter(effects.values()))
        full = target.derive(campaign_id, {**sample.args, **template}, action).args
        content = {k: full[k] for k in template}
        effects = {k: replace(e, args={**e.args, **content}) for k, e in effects.items()}
        _reject_oversized(target.runtime.ledger(), effects, index_of, report)
    if not effects:
        raise MessageError(f"campaign {campaign_id!r}: no valid recipient")
    report.rejected.sort(key=lambda r: int(r["index"]))
    report.recipients = len(effects)
    sample = next(iter(effects.values()))
    bound = {f: sample.normalized[f] for f in target.spec.bound if f != recipient}
    plan = CampaignPlan(
        campaign_id=campaign_id,
        tool=target.name,
        action=sample.action,
        version=plan_version or 1,
        count=len(effects),
        args_fingerprint=_sha({"tool": target.name, "action": sample.action, "bound": bound}),
        plan_fingerprint=hashlib.sha256("\n".join(sorted(effects)).encode()).hexdigest(),
    )
    store = CampaignStore(target.runtime.ledger())
    ttl_s = _plan_ttl_s(target)
    rows = {key: str(e.normalized[recipient]) for key, e in effects.items()}
    plan = _approve(store, plan, plan_version, rows, ttl_s, report)
    report.plan_version = plan.version
    with tracing.span("fan_out", tool=target.name, producer=True):
        _fan_out(target, plan, list(effects.values()), store, report, progress, ttl_s)
    return report


def _plan_ttl_s(tool: EffectTool) -> float:
    """How long a plan is kept after its last submission: as long as its records may be
    (a message older than the provider window never runs; a settled record lives for the
    retention)."""
    return tool.spec.retention_s + tool.spec.provider_window_s


def _reject_oversized(
    ledger: Ledger,
    effects: dict[str, Effect],
    index_of: dict[str, int],
    report: CampaignReport,
) -> None:
    """A request no worker could claim (over the ledger's bound) is refused per recipient
    here; Ledger.submit_many would refuse the whole batch."""
    for key, effect in list(effects.items()):
        try:
            ledger.request_text(effect)
        except RecordTooLargeError as exc:
            del effects[key]
            report.rejected.append({"index": index_of[key], "reason": exc.message})


def _approve(
    store: CampaignStore,
    plan: CampaignPlan,
    plan_version: int | None,
    rows: dict[str, str],
    ttl_s: float,
    report: CampaignReport,
) -> CampaignPlan:
    """Check ``plan`` against the approved one and approve it, atomically against a
    concurrent submission: one that approved first is checked against in turn (an
    identical plan proceeds, another is a conflict)."""
    for _ in range(_APPROVALS):
        approved = store.meta(plan.campaign_id)
        removed: dict[str, str] | None = None
        if approved is not None:
            plan, removed = _check_against(approved, plan, plan_version, store, rows, report)
        if store.freeze(plan, rows, approved=approved, removed=removed, ttl_s=ttl_s):
            store.touch(plan, ttl_s)
            return plan
    raise ConflictError(
        f"campaign {plan.campaign_id!r}: other submissions keep approving plans; submit again"
    )


def _check_against(
    approved: CampaignPlan,
    plan: CampaignPlan,
    plan_version: int | None,
    store: CampaignStore,
    rows: dict[str, str],
    report: CampaignReport,
) -> tuple[CampaignPlan, dict[str, str] | None]:
    """The plan to approve, and for a new version the earlier recipients it drops."""
    if (approved.tool, approved.action) != (plan.tool, plan.action):
        raise ConflictError(
            f"campaign {plan.campaign_id!r} was approved for {approved.tool}/{approved.action}"
        )
    version = plan_version or approved.version
    if version < approved.version:
        raise ConflictError(
            f"campaign {plan.campaign_id!r} is at plan version {approved.version}, not {version}"
        )
    same = (plan.plan_fingerprint, plan.args_fingerprint) == (
        approved.plan_fingerprint, approved.args_fingerprint,
    )  # fmt: skip
    plan = CampaignPlan(**{**asdict(plan), "version": version})
    if version == approved.version and same:
        return plan, None
    old = store.plan_rows(approved)
    added, removed = len(rows.keys() - old.keys()), len(old.keys() - rows.keys())
    if version == approved.version:
        what = "bound arguments" if not added and not removed else "recipient list"
        raise ConflictError(
            f"campaign {plan.campaign_id!r}: changed {what} under plan version {version} "
            f"(+{added} -{removed} recipients); submit it as plan_version={version + 1}",
            added=added,
            removed=removed,
        )
    report.added, report.removed = added, removed
    # Every recipient an earlier plan held and this one does not: its records are no part
    # of this plan's counts.
    dropped = {**store.removed_rows(approved), **old}
    return plan, {k: v for k, v in dropped.items() if k not in rows}


def _fan_out(
    tool: EffectTool,
    plan: CampaignPlan,
    effects: list[Effect],
    store: CampaignStore,
    report: CampaignReport,
    progress: Callable[[int], None] | None,
    ttl_s: float,
) -> None:
    ledger = tool.runtime.ledger()
    cfg = tool.runtime.settings
    tag = campaign_tag(plan.campaign_id)
    skipped: Counter[str] = Counter()
    # Every message continues the fan-out's trace (workers.tracing; none when it is off).
    carried = tracing.traceparent()
    options: dict[str, Any] = {tracing.TRACEPARENT: carried} if carried is not None else {}
    for lo in range(0, len(effects), BATCH):
        batch = effects[lo : lo + BATCH]
        messages = {
            e.key: tool.actor.message_with_options(
                args=(Envelope.of(e, campaign=tag).model_dump(),), **options
            )
            for e in batch
        }
        # force: a pending marker may stand for a message a crash lost; a second message
        # for one effect is harmless, the claim decides. The markers are reservations until
        # the broker holds the batch.
        answers = ledger.submit_many(
            [(e, messages[e.key].message_id) for e in batch],
            pending_s=cfg.pending_reservation_s,
            force=True,
        )
        send = [a.key for a in answers if a.status is SubmitStatus.ENQUEUE]
        for effect, answer in zip(batch, answers, strict=True):
            if answer.status is not SubmitStatus.ENQUEUE:
                skipped[answer.status.value] += 1
            elif answer.generation:  # same message id, carrying the generation it is for
                envelope = Envelope.of(effect, campaign=tag, generation=answer.generation)
                messages[effect.key] = messages[effect.key].copy(args=(envelope.model_dump(),))
        failpoint("after_submit_mark")
        enqueue_many(tool.actor.broker, [messages[key] for key in send])
        confirm_pending(ledger, send, cfg.pending_ttl_s)
        # Sent: a message exists for it, now or from an earlier submission (done, held by a
        # worker, awaiting reconciliation). A conflict was never sent under this plan.
        had = [a.key for a in answers if a.status in _HAD_A_MESSAGE]
        store.mark_sent(plan.campaign_id, plan.version, [*send, *had], ttl_s=ttl_s)
        report.sent += len(send)
        if progress is not None:
            progress(len(batch))
    report.skipped = dict(skipped)


def campaign_status(
    campaign_id: str, *, cursor: int = 0, page_size: int = 100, ledger: Ledger | None = None
) -> dict[str, Any]:
    """Counts per recipient state (from counters, no scan), the plan's never-sent count,
    and one page of recipients (``next_cursor`` 0 when the page is the last), read from
    ``ledger`` (default: the current runtime's)."""
    ledger = ledger if ledger is not None else current().ledger()
    store = CampaignStore(ledger)
    plan = store.meta(campaign_id)
    if plan is None:
        raise MessageError(f"no campaign {campaign_id!r}")
    # Counts over the approved plan's recipients only (dropped ones are subtracted).
    states = store.state_counts(campaign_id, plan)
    sent = store.sent_count(campaign_id, plan.version)
    counts = dict.fromkeys(("pending", "done", "failed", "unknown", "revoked"), 0)
    for state, n in states.items():
        counts[RECIPIENT_STATE[state]] += n
    settled = sum(n for s, n in counts.items() if s != "pending")
    counts["pending"] = max(plan.count - settled, 0)
    next_cursor, rows = store.rows(plan, cursor=cursor, count=page_size)
    records = ledger.get_many(key for key, _, _ in rows)
    recipients = []
    for key, who, was_sent in rows:
        record = records[key]
        state = RECIPIENT_STATE[record.state.value if record else None]
        entry: dict[str, Any] = {"recipient": who, "key": key, "state": state, "sent": was_sent}
        if state in ("unknown", "failed") and record is not None:
            entry["reason"] = record.reason
        recipients.append(entry)
    return {
        "campaign_id": plan.campaign_id,
        "tool": plan.tool,
        "plan_version": plan.version,
        "recipients_total": plan.count,
        "counts": counts,
        "approved_but_never_sent": plan.count - sent,
        "blocked_for_operator": counts.get("unknown", 0),
        "recipients": recipients,
        "next_cursor": next_cursor,
        "message": None
        if sent == plan.count
        else "some approved recipients were never sent: submit the campaign again to send them",
    }
