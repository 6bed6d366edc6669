"""The one door of effectq's faces — the ``effectq`` CLI, the HTTP API and the console: every
read and every action they offer, written once.

Each returns a record or the JSON document that ``effectq … --json`` prints and the API
answers (DESIGN §8), or raises from effectq's error tree; the CLI maps the error to an exit
code, the API to a status code. Reads take an ``Operator`` built by ``reader`` (just the
ledger: no tools, no Dramatiq, so a CLI read starts quickly); actions run on ``operator()``,
which needs the tools (``EFFECTQ_TOOLS``) loaded. Nothing here imports the web framework.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dedupe import MessageError, OperatorError, State, Write

if TYPE_CHECKING:
    from dedupe import EffectRecord
    from reconciler import Operator

    from .campaign import CampaignFile, CampaignReport, CampaignSource
    from .producer import Handle
    from .runtime import Runtime
    from .settings import Settings

__all__ = [
    "WorkQueue",
    "audit_trail",
    "await_receipt",
    "campaign_job",
    "campaign_status",
    "inspect",
    "list_effects",
    "operator",
    "reader",
    "replay",
    "resolve",
    "revoke",
    "submit_call",
    "submit_campaign_file",
    "submit_campaign_source",
    "supersede",
    "work_queue",
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


def inspect(ops: Operator, key: str) -> EffectRecord:
    """One effect's record; NotFoundError when no effect has this key."""
    return ops.inspect(key)


def list_effects(
    ops: Operator, *, state: State | None = None, tool: str | None = None, limit: int = 100
) -> list[EffectRecord]:
    return ops.list(state=state, tool=tool, limit=limit)


@dataclass(frozen=True)
class WorkQueue:
    """What awaits someone: UNKNOWN effects (an operator) and expired claims (a
    reconciler), with the ledger's clock to age them by."""

    unknown: list[EffectRecord]
    blocked: list[EffectRecord]
    now_ms: int


def work_queue(ops: Operator, *, limit: int = 200) -> WorkQueue:
    unknown = ops.list(state=State.UNKNOWN, limit=limit)
    expired = ops.ledger.expired(limit=8)[:limit]
    blocked = [r for r in ops.ledger.get_many(expired).values() if r is not None]
    return WorkQueue(unknown, blocked, ops.ledger.server_time_ms())


def audit_trail(ops: Operator, key: str, *, scan: int = 1000) -> list[dict[str, Any]]:
    """The audit entries of one effect among the last ``scan`` of the audit stream."""
    return [e for e in ops.ledger.audit_log(scan) if e.get("key") == key]


def campaign_status(
    ops: Operator, campaign_id: str, *, cursor: int = 0, page_size: int = 100
) -> dict[str, Any]:
    """``campaign status --json``; MessageError when there is no such campaign."""
    from .campaign import campaign_status as status

    return status(campaign_id, cursor=cursor, page_size=page_size, ledger=ops.ledger)


# A job not updated for this long was lost with its process (it writes at every batch).
_JOB_LOST_MS = 60_000
_JOB_INTS = ("recipients", "planned", "sent", "updated_ms")


def campaign_job(ops: Operator, campaign_id: str, job_id: str) -> dict[str, Any]:
    """A campaign job (``GET /v1/campaigns/{id}/jobs/{job}``): its state (accepted, planning,
    sending, done, failed, lost), progress, the report or the error, and once its plan is
    approved the campaign's own status (counts, never-sent diff, a first page of
    recipients). MessageError when there is no such job."""
    import contextlib
    import json
    import time

    from dedupe import CampaignStore
    from dedupe.campaigns import normalize_campaign_id

    campaign_id = normalize_campaign_id(campaign_id)
    found = CampaignStore(ops.ledger).job(campaign_id, job_id)
    if found is None:
        raise MessageError(f"no job {job_id!r} of campaign {campaign_id!r}")
    document: dict[str, Any] = {"job_id": job_id, "campaign_id": campaign_id}
    document.update({k: int(found.get(k, 0)) for k in _JOB_INTS})
    state = found["state"]
    idle_ms = time.time() * 1000 - document["updated_ms"]
    if state not in ("done", "failed") and idle_ms > _JOB_LOST_MS:
        state = "lost"
        document["error"] = {"error": "lost", "message": "the process running this job "
                             "stopped; submit the campaign again: only recipients not yet "
                             "done are sent"}  # fmt: skip
    document["state"] = state
    if "error" in found:
        document["error"] = {"error": found["error"], "message": found.get("message", "")}
    document["report"] = json.loads(found["report"]) if "report" in found else None
    document["campaign"] = None
    if state in ("sending", "done", "lost"):
        with contextlib.suppress(MessageError):  # its plan expired since
            document["campaign"] = campaign_status(ops, campaign_id, page_size=10)
    return document


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
    from .campaign import submit_campaign

    return submit_campaign(
        spec.campaign_id, spec.tool, spec.recipients, spec.args, action=spec.action,
        plan_version=spec.plan_version, progress=progress, planning=planning,
    )  # fmt: skip


def submit_campaign_source(
    source: CampaignSource,
    progress: Callable[[int], None] | None = None,
    planning: Callable[[int], None] | None = None,
) -> CampaignReport:
    """Freeze and fan out a campaign file, streamed (``effectq campaign submit FILE``)."""
    from .campaign import submit_campaign

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


def replay(key: str, *, actor: str, reason: str) -> dict[str, Any]:
    """Submit the stored request of a FAILED / REVOKED / SUPERSEDED effect again."""
    from .producer import submit
    from .registry import get_tool

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
