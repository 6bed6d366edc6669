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
import itertools
import pickle
import secrets
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import IO, Annotated, Any

from dramatiq import Message
from dramatiq.message import generate_unique_id
from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints

from dedupe import (
    CampaignNotFoundError,
    CampaignPlan,
    CampaignStore,
    ConflictError,
    Effect,
    IdentityError,
    Ledger,
    MessageError,
    RecordTooLargeError,
    State,
    SubmitStatus,
    campaign_tag,
    canonical_bytes,
)
from dedupe.campaigns import PlanDigest, normalize_campaign_id
from dedupe.failpoints import failpoint
from dedupe.identity import Deriver
from dedupe.ledger import Confirming
from dedupe.states import RECIPIENT_STATE, RecipientState

from . import tracing
from .broker.fanout import Sending, send_many
from .producer import finish_confirm, pending_ttl_s, start_confirm
from .runtime import current
from .tool import SUBMITTED_MS, EffectTool, Envelope, get_tool

__all__ = ["CampaignFile", "CampaignReport", "JobState", "campaign_status", "submit_campaign"]

BATCH = 1000
# The rejections a report lists (all are counted): a list of a million bad rows stays small.
MAX_REJECTED = 1000
# Approval rounds against concurrent submissions of one campaign before giving up.
_APPROVALS = 3
_HAD_A_MESSAGE = frozenset({SubmitStatus.DONE, SubmitStatus.PENDING, SubmitStatus.BLOCKED})


class JobState(StrEnum):
    """A campaign job's phase: ``POST /v1/campaigns`` runs a large campaign as a job of an
    API process, and any replica answers ``GET /v1/campaigns/{id}/jobs/{job}`` with it."""

    #: Waiting for its turn in its API process, however long.
    QUEUED = "queued"
    #: Reading the recipients into the plan.
    PLANNING = "planning"
    #: The plan approved: fanning the messages out.
    SENDING = "sending"
    #: Every recipient fanned out (the report says how).
    DONE = "done"
    #: Stopped with an error (the job's ``error`` says which).
    FAILED = "failed"
    #: Its process stopped beating (read only, never written): submit the campaign again.
    LOST = "lost"


MAX_RECIPIENTS = 1_000_000


class CampaignHeader(BaseModel):
    """A campaign file without its recipients."""

    model_config = ConfigDict(strict=True, extra="forbid")

    campaign_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    tool: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    action: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    args: dict[str, JsonValue] = {}
    plan_version: Annotated[int, Field(ge=1)] | None = None


class CampaignFile(CampaignHeader):
    """``effectq campaign submit FILE`` and ``POST /v1/campaigns``: the strict shape."""

    recipients: Annotated[list[JsonValue], Field(min_length=1, max_length=MAX_RECIPIENTS)]


class _RecipientCount(BaseModel):
    recipients: Annotated[int, Field(ge=1, le=MAX_RECIPIENTS)]


class CampaignSource:
    """A campaign file read without loading it whole: ``open`` parses it once with ijson
    (the whole file checked as JSON, the header validated, the recipients counted, never
    held), ``recipients()`` streams them from a second read. Numbers parse as ``json``
    parses them (an int, or a float)."""

    def __init__(self, path: str, header: CampaignHeader, count: int) -> None:
        self.path, self.header, self.count = path, header, count

    @classmethod
    def open(cls, path: str) -> CampaignSource:
        """Raises OSError; pydantic's ValidationError (the header, or ``recipients`` not a
        list of 1 to ``MAX_RECIPIENTS``); MessageError (not JSON in UTF-8, a field given
        twice)."""
        import ijson  # type: ignore[import-untyped]

        try:
            with open(path, "rb") as f:
                header, count = _header(ijson.parse(f, use_float=True))
        except ijson.JSONError:  # its message quotes the text: never echoed
            raise MessageError("the campaign file is not JSON in UTF-8") from None
        return cls(path, header, count)

    def recipients(self) -> Iterator[Any]:
        import ijson

        try:
            with open(self.path, "rb") as f:
                yield from ijson.items(f, "recipients.item", use_float=True)
        except ijson.JSONError:  # changed since it was checked
            raise MessageError("the campaign file is not JSON in UTF-8") from None


def _header(events: Iterator[tuple[str, str, Any]]) -> tuple[CampaignHeader, int]:
    fields: dict[str, Any] = {}
    count: int | None = None
    first = next(events, None)
    if first is None or first[1] != "start_map":
        CampaignHeader.model_validate(None)  # raises: not an object
    for prefix, event, name in events:
        if prefix == "" and event == "end_map":
            break
        if name in fields or (name == "recipients" and count is not None):
            raise MessageError("campaign file: a field is given twice")
        if name != "recipients":
            fields[name] = _value(events)
            continue
        head = next(events)
        if head[1] != "start_array":  # the model's error for what it is instead
            value = _value(itertools.chain([head], events))
            CampaignFile.model_validate({**fields, "recipients": value})
        count = _items(events)
    if count is None:
        CampaignFile.model_validate(fields)  # raises: recipients missing
    header = CampaignHeader.model_validate(fields)
    _RecipientCount.model_validate({"recipients": count})
    return header, count or 0


def _value(events: Iterator[tuple[str, str, Any]]) -> Any:
    """The next JSON value of ``events``, built."""
    import ijson

    builder = ijson.ObjectBuilder()
    depth = 0
    for _, event, value in events:
        builder.event(event, value)
        depth += event in ("start_map", "start_array")
        depth -= event in ("end_map", "end_array")
        if depth == 0:
            return builder.value
    raise MessageError("campaign file: truncated")


def _items(events: Iterator[tuple[str, str, Any]]) -> int:
    """Count the items of the list whose start ``events`` just gave, skipping to its end."""
    count = depth = 0
    for _, event, _ in events:
        if depth == 0:
            if event == "end_array":
                return count
            count += 1
        depth += event in ("start_map", "start_array")
        depth -= event in ("end_map", "end_array")
    raise MessageError("campaign file: truncated")


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
    recipients: Iterable[Any],
    args: dict[str, Any] | None = None,
    *,
    action: str | None = None,
    plan_version: int | None = None,
    progress: Callable[[int], None] | None = None,
    planning: Callable[[int], None] | None = None,
) -> CampaignReport:
    """Freeze the plan for ``recipients`` and fan it out; see the module docstring.

    Streams in two passes, in memory bounded by a batch whatever the list's length:
    ``recipients`` is read once (any iterable: a list, a generator over a file) into plan
    rows staged in Redis and a spool of the derived effects on local disk; the plan is
    approved once complete, and only then is the spool fanned out. ``planning`` is called
    with the recipients read so far per batch, ``progress`` with the recipients fanned out.

    Raises ConflictError for a changed list or changed bound arguments under the same plan
    version, or a plan another submission approved meanwhile; invalid recipients (a value
    the normalizer refuses, a request over the bound a worker enforces) are rejected one
    by one (index and reason; the first ``MAX_REJECTED`` listed, all counted), never dropped
    and never enqueued.
    """
    target = get_tool(tool) if isinstance(tool, str) else tool
    # One campaign whatever the spelling: the id as derive() treats the scope of every key.
    campaign_id = normalize_campaign_id(campaign_id)
    args = dict(args or {})
    recipient = _recipient_field(target, args)
    report = CampaignReport(campaign_id, plan_version or 1, 0)
    store = CampaignStore(target.runtime.ledger())
    ttl_s = _plan_ttl_s(target)
    with tempfile.TemporaryFile(prefix="effectq-campaign-") as spool:
        planner = _Planner(target, campaign_id, args, recipient, action, store, ttl_s, spool)
        plan = planner.run(recipients, plan_version or 1, report, planning)
        try:
            plan = _approve(store, plan, plan_version, ttl_s, report)
        except BaseException:
            store.discard(plan)  # the staged rows: no approval names them
            raise
        store.touch(plan, ttl_s)
        report.plan_version = plan.version
        report.recipients = plan.count
        spool.seek(0)
        with tracing.span("fan_out", tool=target.name, producer=True):
            _fan_out(target, plan, planner.spooled(), store, report, progress, ttl_s)
    return report


class _Planner:
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


def _plan_ttl_s(tool: EffectTool) -> float:
    """How long a plan is kept after its last submission: as long as its records may be
    (a message older than the provider window never runs; a settled record lives for the
    retention)."""
    return tool.spec.retention_s + tool.spec.provider_window_s


def _approve(
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


def _fan_out(
    tool: EffectTool,
    plan: CampaignPlan,
    batches: Iterable[list[Effect]],
    store: CampaignStore,
    report: CampaignReport,
    progress: Callable[[int], None] | None,
    ttl_s: float,
) -> None:
    """Pass 2, a batch at a time in stages that overlap: batch i+1 is built and marked in
    the ledger while the broker takes batch i, and batch i's confirms are read only once
    batch i+2 is built."""
    ledger = tool.runtime.ledger()
    cfg = tool.runtime.settings
    actor = tool.actor
    marker_ttl_s = pending_ttl_s(tool)
    tag = campaign_tag(plan.campaign_id)
    skipped: Counter[str] = Counter()
    # Every message continues the fan-out's trace (workers.tracing; none when it is off).
    carried = tracing.traceparent()
    options: dict[str, Any] = {tracing.TRACEPARENT: carried} if carried is not None else {}

    confirming: tuple[Confirming | None, int] = (None, 0)  # the last batch's, and its size

    def sent(batch: list[Effect], messages: list[Message[Any]], had: list[str]) -> None:
        nonlocal confirming
        keys = [m.args[0]["key"] for m in messages]
        effects = {e.key: e for e in batch}
        # On the wire, read after the next batch is built (as confirm_pending otherwise);
        # one batch of confirms unread at a time.
        finish_confirm(*confirming)
        pairs = [(effects[k], m.message_id) for k, m in zip(keys, messages, strict=True)]
        confirming = (start_confirm(ledger, pairs, marker_ttl_s), len(pairs))
        # Sent: a message exists for it, now or from an earlier submission (done, held by a
        # worker, awaiting reconciliation). A conflict was never sent under this plan.
        store.mark_sent(plan.campaign_id, plan.version, [*keys, *had], ttl_s=ttl_s)
        report.sent += len(messages)
        if progress is not None:
            progress(len(batch))

    # The broker takes batch i while the next one is built and marked (send_many: on the
    # wire, its replies read later); at most one batch is in flight, and one confirm batch.
    sending: Sending | None = None
    previous: tuple[list[Effect], list[Message[Any]], list[str]] = ([], [], [])
    try:
        for batch in batches:
            ids = {e.key: generate_unique_id() for e in batch}
            # force: a pending marker may stand for a message a crash lost; a second
            # message for one effect is harmless, the claim decides. The markers are
            # reservations until the broker holds the batch. The messages are built while
            # the ledger decides (their ids are the markers').
            submitting = ledger.start_submit(
                [(e, ids[e.key]) for e in batch],
                pending_s=cfg.pending_reservation_s,
                force=True,
                bounded=True,  # each request was bounded in pass 1 (_Planner._derive)
            )
            try:
                messages: dict[str, Message[Any]] = {
                    e.key: Message(queue_name=actor.queue_name, actor_name=actor.actor_name,
                                   args=(Envelope.of(e, campaign=tag).model_dump(),),
                                   kwargs={}, options=dict(options), message_id=ids[e.key])
                    for e in batch
                }  # fmt: skip
            except BaseException:
                submitting.abandon()
                raise
            finish_confirm(*confirming)
            confirming = (None, 0)
            answers = submitting.answers()
            for effect, answer in zip(batch, answers, strict=True):
                if answer.status is not SubmitStatus.ENQUEUE:
                    skipped[answer.status.value] += 1
                    continue
                # The ledger's time of this submission: the message's age is judged on it
                # (each message has an options dict of its own, built above).
                messages[effect.key].options[SUBMITTED_MS] = answer.submitted_ms
                if answer.generation:  # same message id, carrying the generation it is for
                    envelope = Envelope.of(effect, campaign=tag, generation=answer.generation)
                    messages[effect.key] = messages[effect.key].copy(args=(envelope.model_dump(),))
            failpoint("after_submit_mark")
            out = [messages[a.key] for a in answers if a.status is SubmitStatus.ENQUEUE]
            had = [a.key for a in answers if a.status in _HAD_A_MESSAGE]
            if sending is not None:
                sending.wait()
                sent(*previous)
            sending, previous = send_many(tool.actor.broker, out), (batch, out, had)
        if sending is not None:
            sending.wait()
            sent(*previous)
            sending = None
        finish_confirm(*confirming)
        confirming = (None, 0)
    finally:
        if sending is not None:  # a failure meanwhile: that batch's replies go unread
            sending.abandon()
        if confirming[0] is not None:  # unread: its reservations lapse, the messages run
            confirming[0].abandon()
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
        raise CampaignNotFoundError(f"no campaign {campaign_id!r}")
    # Counts over the approved plan's recipients only (dropped ones are subtracted).
    states = store.state_counts(campaign_id, plan)
    sent = store.sent_count(campaign_id, plan.version)
    counts = dict.fromkeys((s.value for s in RecipientState), 0)
    for state, n in states.items():
        counts[RECIPIENT_STATE[State(state)]] += n
    settled = sum(n for s, n in counts.items() if s != RecipientState.PENDING)
    counts[RecipientState.PENDING] = max(plan.count - settled, 0)
    next_cursor, rows = store.rows(plan, cursor=cursor, count=page_size)
    records = ledger.get_many(key for key, _, _ in rows)
    recipients = []
    for key, who, was_sent in rows:
        record = records[key]
        state = RECIPIENT_STATE[record.state if record else None]
        entry: dict[str, Any] = {
            "recipient": who, "key": key, "state": state.value, "sent": was_sent
        }  # fmt: skip
        if state in (RecipientState.UNKNOWN, RecipientState.FAILED) and record is not None:
            entry["reason"] = record.reason
        recipients.append(entry)
    return {
        "campaign_id": plan.campaign_id,
        "tool": plan.tool,
        "plan_version": plan.version,
        "recipients_total": plan.count,
        "counts": counts,
        "approved_but_never_sent": plan.count - sent,
        "blocked_for_operator": counts[RecipientState.UNKNOWN],
        "recipients": recipients,
        "next_cursor": next_cursor,
        "message": None
        if sent == plan.count
        else "some approved recipients were never sent: submit the campaign again to send them",
    }
