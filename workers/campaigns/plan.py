"""Pass 1 of a campaign: recipients -> effects -> plan rows staged in Redis, then the plan
approved against the one approved before (the same plan adopted, a changed one a conflict
unless it comes as a new ``plan_version``, whose diff is reported)."""

from __future__ import annotations

import hashlib
import pickle
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import IO, Any

from dedupe import (
    CampaignPlan,
    CampaignStore,
    ConflictError,
    Effect,
    IdentityError,
    MessageError,
    RecordTooLargeError,
    canonical_bytes,
)
from dedupe.campaigns import PlanDigest
from dedupe.identity import Deriver

from ..tool import EffectTool

__all__ = ["CampaignReport", "Planner", "approve", "plan_ttl_s", "recipient_field"]

BATCH = 1000
# The rejections a report lists (all are counted): a list of a million bad rows stays small.
MAX_REJECTED = 1000
# Approval rounds against concurrent submissions of one campaign before giving up.
_APPROVALS = 3


@dataclass
class CampaignReport:
    campaign_id: str
    plan_version: int
    recipients: int
    collapsed: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    rejected_total: int = 0
    sent: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    added: int = 0
    removed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def reject(self, index: int, reason: str) -> None:
        self.rejected_total += 1
        if len(self.rejected) < MAX_REJECTED:
            self.rejected.append({"index": index, "reason": reason})


def recipient_field(tool: EffectTool, args: dict[str, Any]) -> str:
    free = [f for f in tool.spec.identity if f not in args]
    if len(free) != 1:
        raise MessageError(
            f"{tool.name}: a campaign varies exactly one identity field per recipient; "
            f"{tool.spec.identity} leaves {free or 'none'} open"
        )
    return free[0]


def _sha(value: Any) -> str:
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


class Planner:
    """Pass 1: recipients -> effects -> plan rows staged in Redis (new keys only: the first
    spelling of a recipient is the one mailed) and the plan digest, batch by batch; the
    effects of the staged rows are spooled to ``spool`` for pass 2."""

    def __init__(
        self,
        tool: EffectTool,
        campaign_id: str,
        args: dict[str, Any],
        recipient: str,
        action: str | None,
        store: CampaignStore,
        ttl_s: float,
        spool: IO[bytes],
    ) -> None:
        self.tool, self.campaign_id, self.recipient, self.action = (
            tool,
            campaign_id,
            recipient,
            action,
        )
        self.store, self.ttl_s, self.spool = store, ttl_s, spool
        self.ledger = tool.runtime.ledger()
        # Free content (the template) is the same for every recipient and enters neither key
        # nor fingerprint: derive each recipient without it, check and normalize it once.
        self.template = {k: v for k, v in args.items() if k in tool.spec.free}
        self.shared = {k: v for k, v in args.items() if k not in self.template}
        # The shared part normalized once; per recipient only its own field (derive's effect).
        self.deriver = Deriver(tool.spec, campaign_id, self.shared, recipient, action)
        self.content: dict[str, Any] | None = None
        self.sample: Effect | None = None
        self.digest = PlanDigest()

    def run(
        self,
        recipients: Iterable[Any],
        version: int,
        report: CampaignReport,
        planning: Callable[[int], None] | None,
    ) -> CampaignPlan:
        staged = CampaignPlan(self.campaign_id, self.tool.name, "", version, 0, "", "",
                              rows_id=secrets.token_hex(8))  # fmt: skip
        batch: dict[str, Effect] = {}
        read = 0
        try:
            for index, value in enumerate(recipients):
                read = index + 1
                effect = self._derive(index, value, report)
                if effect is None:
                    pass
                elif effect.key in batch:
                    report.collapsed += 1
                else:
                    batch[effect.key] = effect
                if len(batch) >= BATCH:
                    self._stage(staged, batch, report)
                if planning is not None and read % BATCH == 0:
                    planning(BATCH)
            self._stage(staged, batch, report)
            if planning is not None and read % BATCH:
                planning(read % BATCH)
        except BaseException:
            self.store.discard(staged)
            raise
        if self.sample is None:
            self.store.discard(staged)
            raise MessageError(f"campaign {self.campaign_id!r}: no valid recipient")
        sample = self.sample
        bound = {f: sample.normalized[f] for f in self.tool.spec.bound if f != self.recipient}
        return replace(
            staged,
            action=sample.action,
            count=self.digest.count,
            args_fingerprint=_sha(
                {"tool": self.tool.name, "action": sample.action, "bound": bound}
            ),
            plan_fingerprint=self.digest.hexdigest(),
        )

    def _derive(self, index: int, value: Any, report: CampaignReport) -> Effect | None:
        try:
            effect = self.deriver(value)
        except IdentityError as exc:
            report.reject(index, exc.message)
            return None
        if self.content is None:
            full = self.tool.derive(
                self.campaign_id, {**effect.args, **self.template}, self.action
            ).args
            self.content = {k: full[k] for k in self.template}
        try:
            # A request no worker could claim (over the ledger's bound) is refused per
            # recipient here; Ledger.submit_many would refuse the whole batch.
            self.ledger.request_text(self.with_content(effect))
        except RecordTooLargeError as exc:
            report.reject(index, exc.message)
            return None
        self.sample = self.sample or effect
        return effect

    def with_content(self, effect: Effect) -> Effect:
        # Constructed, not dataclasses.replace, which inspects the fields on every call
        # (twice per recipient: over twice the constructor's CPU).
        args = {**effect.args, **(self.content or {})}
        e = effect
        return Effect(e.tool, e.action, e.scope, e.key, e.fingerprint, args, e.normalized)

    def _stage(self, plan: CampaignPlan, batch: dict[str, Effect], report: CampaignReport) -> None:
        if not batch:
            return
        rows = {key: str(e.normalized[self.recipient]) for key, e in batch.items()}
        fresh = self.store.stage(plan, rows, self.ttl_s)
        kept = []
        for (key, effect), new in zip(batch.items(), fresh, strict=True):
            if new:
                self.digest.add(key)
                kept.append(effect)
            else:  # another spelling of a recipient an earlier batch staged
                report.collapsed += 1
        pickle.dump(kept, self.spool, protocol=pickle.HIGHEST_PROTOCOL)
        batch.clear()

    def spooled(self) -> Iterator[list[Effect]]:
        """Pass 2: the staged effects, batch by batch, with the template's content."""
        while True:
            try:
                batch: list[Effect] = pickle.load(self.spool)  # our own spool file
            except EOFError:
                return
            yield [self.with_content(e) for e in batch]


def plan_ttl_s(tool: EffectTool) -> float:
    """How long a plan is kept after its last submission: as long as its records may be
    (a message older than the provider window never runs; a settled record lives for the
    retention)."""
    return tool.spec.retention_s + tool.spec.provider_window_s


def approve(
    store: CampaignStore,
    plan: CampaignPlan,
    plan_version: int | None,
    ttl_s: float,
    report: CampaignReport,
) -> CampaignPlan:
    """Check the staged ``plan`` against the approved one and approve it, atomically
    against a concurrent submission: one that approved first is checked against in turn
    (an identical plan is adopted, another is a conflict). Returns the plan to fan out."""
    for _ in range(_APPROVALS):
        approved = store.meta(plan.campaign_id)
        if approved is not None:
            store.discard(plan, rows=False)  # removed rows of an earlier round's check
            plan = _check_against(approved, plan, plan_version, store, ttl_s, report)
            if plan is approved:
                return approved
        answer = store.approve(plan, approved=approved, ttl_s=ttl_s)
        if answer == "ok":
            return plan
        if answer == "same":  # an identical plan approved meanwhile: fan out under it
            current = store.meta(plan.campaign_id)
            if current is not None and current.token == plan.token:
                store.discard(plan)
                return current
    raise ConflictError(
        f"campaign {plan.campaign_id!r}: other submissions keep approving plans; submit again"
    )


def _check_against(
    approved: CampaignPlan,
    plan: CampaignPlan,
    plan_version: int | None,
    store: CampaignStore,
    ttl_s: float,
    report: CampaignReport,
) -> CampaignPlan:
    """The plan to approve (``approved`` itself when the staged rows are its rows: the
    staged ones are deleted); for a new version, the earlier recipients it drops are
    written as its removed rows. A conflict raises, the caller deletes what was staged."""
    if (approved.tool, approved.action) != (plan.tool, plan.action):
        raise ConflictError(
            f"campaign {plan.campaign_id!r} was approved for {approved.tool}/{approved.action}"
        )
    version = plan_version or approved.version
    if version < approved.version:
        raise ConflictError(
            f"campaign {plan.campaign_id!r} is at plan version {approved.version}, not {version}"
        )
    same_args = plan.args_fingerprint == approved.args_fingerprint
    same_rows = plan.plan_fingerprint == approved.plan_fingerprint
    if version == approved.version and same_args and same_rows:
        store.discard(plan)
        return approved
    plan = replace(plan, version=version)
    # A new version writes the rows it drops as it compares; a plan approved before the
    # streaming fingerprint (another scheme) is compared row by row too.
    kept, removed = store.diff(plan, approved, ttl_s=ttl_s if version > approved.version else None)
    added = plan.count - kept
    if version == approved.version:
        if not added and not removed and same_args:
            store.discard(plan)
            return approved
        what = "bound arguments" if not added and not removed else "recipient list"
        raise ConflictError(
            f"campaign {plan.campaign_id!r}: changed {what} under plan version {version} "
            f"(+{added} -{removed} recipients); submit it as plan_version={version + 1}",
            added=added,
            removed=removed,
        )
    report.added, report.removed = added, removed
    return plan
