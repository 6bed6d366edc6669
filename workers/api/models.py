"""Request and response bodies of the HTTP API, for validation and the OpenAPI document.

Requests are strict (no coercion, no unknown fields). Responses are the CLI's ``--json``
documents (DESIGN §8), answered as the shared verbs build them; these models only describe
them, and schemathesis checks the answers against the description.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints, model_validator

from dedupe import State
from dedupe.identity import EFFECT_KEY
from dedupe.spec import TOOL_NAME
from dedupe.states import RecipientState
from reconciler.operator import MAX_TEXT

from ..broker.gate import QUEUE_NAME
from ..campaigns.jobs import JobState

# The schema's forms (anchored) of the effect key and the tool name.
KEY_PATTERN = f"^{EFFECT_KEY.pattern}$"
TOOL_PATTERN = f"^{TOOL_NAME.pattern}$"
QUEUE_PATTERN = f"^{QUEUE_NAME.pattern}$"
# The longest ?wait= a producer may hold a connection for; part of the published contract.
MAX_WAIT_S = 30.0
# A campaign page cursor is Redis's HSCAN cursor: an unsigned 64-bit integer.
MAX_CURSOR = 2**64 - 1

Reason = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TEXT, pattern=r"\S"),
    Field(description="why (recorded in the audit stream with the token's actor name)"),
]  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class ToolCall(_Strict):
    """One tool call, as ``effectq submit TOOL --scope S [--action A] [--arg k=v]...``."""

    tool: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    scope: Annotated[str, StringConstraints(min_length=1, max_length=256)] = Field(
        description="the trigger: event, order or campaign id (never a clock)"
    )
    action: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    args: dict[str, JsonValue] = Field(default_factory=dict)


class Resolve(_Strict):
    executed: bool = Field(description="true: the effect happened (give the receipt)")
    reason: Reason
    receipt: dict[str, JsonValue] | None = Field(
        default=None, description="the provider's receipt: the evidence for executed=true"
    )
    override_evidence: bool = Field(
        default=False, description="resolve as not executed despite late receipts"
    )


class Action(_Strict):
    reason: Reason


class Replay(_Strict):
    """``effectq replay``: the record's stored request, or the original call given here (a
    record that settled DONE keeps none), checked against the effect's key and fingerprint."""

    reason: Reason
    scope: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = Field(
        default=None, description="the original call's scope (needed where no request is stored)"
    )
    action: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    args: dict[str, JsonValue] | None = Field(
        default=None, description="the original call's arguments, as submit takes them"
    )


Since = Annotated[str, StringConstraints(min_length=1, max_length=40)]


class Recheck(_Strict):
    """``effectq recheck``: UNKNOWN effects of a tool back to the reconciler."""

    tool: Annotated[str, StringConstraints(pattern=TOOL_PATTERN)]
    since: Since | None = Field(
        default=None, description="became UNKNOWN at or after: ISO 8601, or seconds ago"
    )
    until: Since | None = Field(
        default=None, description="became UNKNOWN at or before: ISO 8601, or seconds ago"
    )
    reason: Reason
    dry_run: bool = Field(default=False, description="count them; change nothing")


MessageId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f-]{36}$")]


class DeadLetterAction(_Strict):
    """``effectq requeue`` / ``effectq purge``: the named dead messages, or with ``all``
    those of ``tool`` (every tool's without), oldest first, at most ``limit`` per call."""

    message_ids: list[MessageId] = Field(
        default_factory=list, max_length=1000,
        description="as GET /v1/deadletters shows them; or give all=true",
    )  # fmt: skip
    all: bool = Field(default=False, description="every dead message (of tool, if given)")
    tool: Annotated[str, StringConstraints(pattern=TOOL_PATTERN)] | None = None
    limit: int = Field(default=100, ge=1, le=1000, description="at most this many, oldest first")
    reason: Reason
    dry_run: bool = Field(default=False, description="count them; change nothing")


# -- responses --------------------------------------------------------------------------


class SubmitResult(BaseModel):
    key: str
    status: Literal["enqueued", "pending", "done", "conflict", "blocked"]
    tool: str
    state: str | None = None
    message_id: str | None = None
    receipt: dict[str, JsonValue] | None = None
    message: str | None = Field(default=None, description="why ?wait= ended without a receipt")


class LateReceipt(BaseModel):
    token: int
    receipt: JsonValue
    at_ms: int


class Transition(BaseModel):
    state: str
    token: int
    at_ms: int
    at: str = Field(description="at_ms as ISO 8601, UTC")
    note: str


class EffectDocument(BaseModel):
    """``effectq inspect KEY --json``."""

    key: str
    state: State
    token: int
    generation: int
    idempotency_key: str
    tool: str
    fingerprint: str
    attempts: int
    created_ms: int
    lease_deadline_ms: int | None
    holder: str | None
    request: dict[str, JsonValue] | None
    receipt: dict[str, JsonValue] | None
    raw_response: str | None
    late_receipts: list[LateReceipt]
    history: list[Transition]
    reason: str
    ttl_ms: int | None


class Rejected(BaseModel):
    index: int
    reason: str


class CampaignReport(BaseModel):
    """``effectq campaign submit FILE --json``."""

    campaign_id: str
    plan_version: int
    recipients: int
    collapsed: int
    rejected: list[Rejected]
    rejected_total: int = Field(description="all rejections; `rejected` lists the first 1000")
    sent: int
    skipped: dict[str, int]
    added: int
    removed: int


class CampaignJobAccepted(BaseModel):
    """``POST /v1/campaigns`` of a large campaign: the job that plans and fans it out."""

    job_id: str
    campaign_id: str
    state: Literal["accepted"]
    recipients: int
    status_url: str


class Recipient(BaseModel):
    recipient: str
    key: str
    state: RecipientState
    sent: bool
    reason: str | None = None


class CampaignStatus(BaseModel):
    """``effectq campaign status ID --json``: counts, the never-sent diff, a page of rows."""

    campaign_id: str
    tool: str
    plan_version: int
    recipients_total: int
    counts: dict[str, int]
    approved_but_never_sent: int
    blocked_for_operator: int
    recipients: list[Recipient]
    next_cursor: int = Field(description="pass as ?cursor= for the next page; 0 on the last")
    message: str | None


class JobError(BaseModel):
    error: str
    message: str


class CampaignJob(BaseModel):
    """``GET /v1/campaigns/{id}/jobs/{job}``: the job, then the campaign's own status."""

    job_id: str
    campaign_id: str
    state: JobState = Field(
        description="queued: waiting for its turn in its API process; lost: its process "
        "stopped (no heartbeat for 60 s by the ledger's clock: submit the campaign again)"
    )
    recipients: int = Field(description="in the submitted list, before collapsing")
    planned: int = Field(description="recipients read into the plan so far")
    sent: int = Field(description="recipients fanned out so far")
    updated_ms: int = Field(description="its last phase or progress change (ledger time, ms)")
    report: CampaignReport | None = Field(description="once done")
    error: JobError | None = None
    campaign: CampaignStatus | None = Field(description="once its plan is approved")


class WriteResult(BaseModel):
    """``effectq resolve | revoke | supersede --json``."""

    key: str
    state: str
    token: int


class ReplayResult(BaseModel):
    """``effectq replay --json``: the submit status of the replayed request."""

    key: str
    status: str


class EffectsPage(BaseModel):
    """``effectq list --since/--cursor --json``: a page of the state indexes."""

    effects: list[EffectDocument]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page")


class PendingMarker(BaseModel):
    """A key only a broker message stands for (``effectq list --pending --json``)."""

    key: str
    state: str = Field(description="the record's state, ABSENT without one")
    tool: str | None
    message_id: str = Field(description="the message the pending marker names")
    confirmed: bool = Field(description="the broker accepted it (else only a reservation)")
    ttl_ms: int | None = Field(description="ms before the marker lapses")


class PendingMarkers(BaseModel):
    pending: list[PendingMarker]


class DeadLetter(BaseModel):
    id: str = Field(description="the stream entry id (server ms-sequence)")
    at_ms: int
    at: str
    message_id: str
    tool: str
    key: str = Field(description="the effect key, empty when the message named none")
    reason: str


class DeadLetterPage(BaseModel):
    """``effectq deadletters --json``, newest first."""

    dead_letters: list[DeadLetter]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page")


class AuditEntry(BaseModel):
    id: str = Field(description="the stream entry id (server ms-sequence)")
    at_ms: int
    at: str
    action: str
    key: str = Field(description="the effect key, empty for an action on many (recheck)")
    actor: str
    reason: str
    outcome: str


class AuditPage(BaseModel):
    """``effectq audit --json``, newest first."""

    audit: list[AuditEntry]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page")


class RecheckResult(BaseModel):
    """``effectq recheck --json``."""

    tool: str
    since_ms: int | None
    until_ms: int | None
    dry_run: bool
    matched: int = Field(description="UNKNOWN effects of the tool in the range")
    rechecked: int = Field(description="sent back to the reconciler (0 on a dry run)")
    refused: dict[str, int] = Field(description="state -> effects settled meanwhile")


class DeadLetterResult(BaseModel):
    """``effectq requeue --json`` / ``effectq purge --json`` (``requeued`` or ``purged``)."""

    matched: int = Field(description="dead messages this call took (at most limit)")
    requeued: list[str] | None = Field(default=None, description="message ids back on a queue")
    purged: list[str] | None = Field(default=None, description="message ids dropped")
    refused: list[str] = Field(description="undecodable (purge it) or no longer dead")
    not_found: list[str] = Field(description="named message ids that are not dead (any more)")
    dry_run: bool
    more: bool = Field(description="more dead messages match: call again")


Why = Literal["retry_after_failure", "retry_later", "held_back", "delay", "undecodable"]


class ScheduledMessage(BaseModel):
    """A message waiting in a delay queue: never its arguments, only its key's prefix."""

    queue: str
    tool: str = Field(description="empty for an undecodable body")
    key_prefix: str = Field(description="the effect key's first 12 hex digits, as logs print")
    message_id: str
    next_attempt_ms: int | None = Field(description="its eta: when it goes back on its queue")
    next_attempt: str | None = Field(description="next_attempt_ms as ISO 8601, UTC")
    retries: int = Field(description="failed deliveries so far")
    why: Why = Field(
        description="retry_after_failure: the call failed (not executed, outcome uncertain, "
        "or an exception); retry_later: effectq's own back-off (the claim is held "
        "elsewhere, the ledger could not answer, a commit waits); held_back: by a pause or "
        "a rate or concurrency limit (error says which; no attempt made); delay: sent "
        "with one"
    )
    error: str | None = Field(
        description="the cause in effectq's fixed words (not executed, effect is in_flight, "
        "paused, rate, …) or an exception's type name; never its message"
    )


class ScheduledPage(BaseModel):
    """``effectq scheduled --json``: the delay queues by next attempt."""

    scheduled: list[ScheduledMessage]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page")
    total: int = Field(description="messages in the delay queues")
    read: int = Field(description="how many were read and sorted (at most 10000)")


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class Problem(BaseModel):
    """Every error: a kind, a one-line reason; never a stack trace, a recipient or a key."""

    error: str
    message: str
    state: str | None = None
    errors: list[FieldError] | None = None


# -- pause and resume (workers.broker.gate) ---------------------------------------------


class PauseTarget(_Strict):
    """``effectq pause|resume``: one tool or one queue (exactly one of the two)."""

    tool: Annotated[str, StringConstraints(pattern=TOOL_PATTERN)] | None = None
    queue: Annotated[str, StringConstraints(pattern=QUEUE_PATTERN)] | None = None
    reason: Reason

    @model_validator(mode="after")
    def _one(self) -> PauseTarget:
        if (self.tool is None) == (self.queue is None):
            raise ValueError("name one tool or one queue")
        return self

    @property
    def target(self) -> tuple[str, str]:
        return ("tool", self.tool) if self.tool is not None else ("queue", self.queue or "")


class PauseResult(BaseModel):
    """``effectq pause|resume --json``."""

    kind: Literal["tool", "queue"]
    name: str
    paused: bool = Field(description="the state now")
    changed: bool = Field(description="false: it was in that state already")
    at_ms: int = Field(description="the ledger's time of the change")


class Paused(BaseModel):
    kind: Literal["tool", "queue"]
    name: str
    actor: str | None
    reason: str | None
    at_ms: int | None = Field(description="paused since (the ledger's ms)")
    at: str | None = Field(description="at_ms as ISO 8601, UTC")


class ToolControls(BaseModel):
    tool: str
    queue: str
    paused: bool = Field(description="held back: the tool or its queue is paused")
    rate: str | None = Field(description="the declared rate limit, e.g. 100/s")
    concurrency: int | None = Field(description="the declared concurrency limit")


class Controls(BaseModel):
    """``effectq controls --json``: what is paused, and each declared tool's limits."""

    paused: list[Paused]
    tools: list[ToolControls]
