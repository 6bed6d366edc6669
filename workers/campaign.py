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
    MessageError,
    SubmitStatus,
    campaign_tag,
    canonical_bytes,
)

from . import runtime
from .fanout import enqueue_many
from .settings import settings
from .tool import EffectTool, Envelope, get_tool

__all__ = ["CampaignFile", "CampaignReport", "campaign_status", "submit_campaign"]

BATCH = 1000
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
    version; invalid recipients are rejected one by one (index and reason), never dropped.
    """
    target = get_tool(tool) if isinstance(tool, str) else tool
    args = dict(args or {})
    recipient = _recipient_field(target, args)
    report = CampaignReport(campaign_id, plan_version or 1, 0)
    # Free content (the template) is the same for every recipient and enters neither key nor
    # fingerprint: derive each recipient without it, check and normalize it once.
    template = {k: v for k, v in args.items() if k in target.spec.free}
    shared = {k: v for k, v in args.items() if k not in template}
    effects: dict[str, Effect] = {}
    for index, value in enumerate(recipients):
        try:
            effect = target.derive(campaign_id, {**shared, recipient: value}, action)
        except IdentityError as exc:
            report.rejected.append({"index": index, "reason": exc.message})
            continue
        if effect.key in effects:
            report.collapsed += 1
        effects.setdefault(effect.key, effect)  # the first spelling is the one mailed
    if not effects:
        raise MessageError(f"campaign {campaign_id!r}: no valid recipient")
    report.recipients = len(effects)
    sample = next(iter(effects.values()))
    full = target.derive(campaign_id, {**sample.args, **template}, action).args
    content = {k: full[k] for k in template}
    effects = {k: replace(e, args={**e.args, **content}) for k, e in effects.items()}
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
    store = CampaignStore(runtime.ledger())
    approved = store.meta(campaign_id)
    if approved is not None:
        plan = _check_against(approved, plan, plan_version, store, set(effects), report)
    store.freeze(plan, {key: str(e.normalized[recipient]) for key, e in effects.items()})
    report.plan_version = plan.version
    _fan_out(target, campaign_id, plan.version, list(effects.values()), store, report, progress)
    return report


def _check_against(
    approved: CampaignPlan,
    plan: CampaignPlan,
    plan_version: int | None,
    store: CampaignStore,
    keys: set[str],
    report: CampaignReport,
) -> CampaignPlan:
    if (approved.tool, approved.action) != (plan.tool, plan.action):
        raise ConflictError(
            f"campaign {plan.campaign_id!r} was approved for {approved.tool}/{approved.action}"
        )
    version = plan_version or approved.version
    if version < approved.version:
        raise ConflictError(
            f"campaign {plan.campaign_id!r} is at plan version {approved.version}, not {version}"
        )
    old = store.plan_keys(plan.campaign_id, approved.version)
    added, removed = len(keys - old), len(old - keys)
    same = (plan.plan_fingerprint, plan.args_fingerprint) == (
        approved.plan_fingerprint, approved.args_fingerprint,
    )  # fmt: skip
    if version == approved.version and not same:
        what = "bound arguments" if not added and not removed else "recipient list"
        raise ConflictError(
            f"campaign {plan.campaign_id!r}: changed {what} under plan version {version} "
            f"(+{added} -{removed} recipients); submit it as plan_version={version + 1}",
            added=added,
            removed=removed,
        )
    if version > approved.version:
        report.added, report.removed = added, removed
    return CampaignPlan(**{**asdict(plan), "version": version})


def _fan_out(
    tool: EffectTool,
    campaign_id: str,
    version: int,
    effects: list[Effect],
    store: CampaignStore,
    report: CampaignReport,
    progress: Callable[[int], None] | None,
) -> None:
    ledger = runtime.ledger()
    tag = campaign_tag(campaign_id)
    skipped: Counter[str] = Counter()
    for lo in range(0, len(effects), BATCH):
        batch = effects[lo : lo + BATCH]
        messages = {
            e.key: tool.actor.message(Envelope.of(e, campaign=tag).model_dump()) for e in batch
        }
        # force: a pending marker may stand for a message a crash lost; a second message
        # for one effect is harmless, the claim decides.
        answers = ledger.submit_many(
            [(e, messages[e.key].message_id) for e in batch],
            pending_s=settings().pending_ttl_s,
            force=True,
        )
        send = [a.key for a in answers if a.status is SubmitStatus.ENQUEUE]
        for effect, answer in zip(batch, answers, strict=True):
            if answer.status is not SubmitStatus.ENQUEUE:
                skipped[answer.status.value] += 1
            elif answer.generation:  # same message id, carrying the generation it is for
                envelope = Envelope.of(effect, campaign=tag, generation=answer.generation)
                messages[effect.key] = messages[effect.key].copy(args=(envelope.model_dump(),))
        enqueue_many(tool.actor.broker, [messages[key] for key in send])
        store.mark_sent(campaign_id, version, send)
        report.sent += len(send)
        if progress is not None:
            progress(len(batch))
    report.skipped = dict(skipped)


def campaign_status(campaign_id: str, *, cursor: int = 0, page_size: int = 100) -> dict[str, Any]:
    """Counts per recipient state (from counters, no scan), the plan's never-sent count,
    and one page of recipients (``next_cursor`` 0 when the page is the last)."""
    ledger = runtime.ledger()
    store = CampaignStore(ledger)
    plan = store.meta(campaign_id)
    if plan is None:
        raise MessageError(f"no campaign {campaign_id!r}")
    states = store.state_counts(campaign_id)
    sent = store.sent_count(campaign_id, plan.version)
    counts = dict.fromkeys(("pending", "done", "failed", "unknown", "revoked"), 0)
    for state, n in states.items():
        counts[RECIPIENT_STATE[state]] += n
    settled = sum(n for s, n in counts.items() if s != "pending")
    counts["pending"] = max(plan.count - settled, 0)
    next_cursor, rows = store.rows(campaign_id, plan.version, cursor=cursor, count=page_size)
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
        "campaign_id": campaign_id,
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
