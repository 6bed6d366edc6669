"""The producer and operator routes under ``/v1`` (docs/api.md, docs/openapi.json).

Bodies are the CLI's ``--json`` documents, built by the same verbs (``workers.verbs``).
Handlers are plain functions: FastAPI runs them in its thread pool, where the blocking
ledger and broker clients belong.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dedupe import CampaignNotFoundError, State
from dedupe.identity import KEY_OR_PREFIX
from dedupe.states import IndexedState

from .. import verbs
from ..campaigns.file import CampaignFile
from ..campaigns.jobs import CampaignJobs
from ..producer import Status, WaitTimeout
from ..runtime import current
from . import models
from .auth import ApiToken, Tokens
from .problems import ApiProblem

if TYPE_CHECKING:
    from reconciler import Operator

__all__ = ["router"]

_bearer = HTTPBearer(
    auto_error=False,
    description="A token from EFFECTQ_API_TOKENS; its scopes (submit, read, operate) decide "
    "what it may call.",
)


def _problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    described = {
        400: "the body is not UTF-8 text, or Content-Length is malformed",
        401: "no token, or an unknown one",
        403: "the token lacks this route's scope",
        404: "no such effect, campaign or campaign job",
        409: "refused by the state table, or a conflicting campaign",
        413: "request body over its bound",
        422: "invalid request: field errors, or arguments that name no effect",
        503: "the ledger is unavailable; nothing was done",
    }
    return {c: {"model": models.Problem, "description": described[c]} for c in codes}


def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> ApiToken:
    tokens: Tokens = request.app.state.tokens
    challenge = {"WWW-Authenticate": 'Bearer realm="effectq"'}
    if credentials is None:
        raise ApiProblem(401, "unauthorized", "a bearer token is required", headers=challenge)
    token = tokens.match(credentials.credentials)
    if token is None:
        raise ApiProblem(401, "unauthorized", "unknown token", headers=challenge)
    return token


def _needs(scope: str) -> Callable[[ApiToken], ApiToken]:
    def check(token: Annotated[ApiToken, Depends(_caller)]) -> ApiToken:
        if not token.allows(scope):
            raise ApiProblem(403, "forbidden", f"this token lacks the {scope!r} scope")
        return token

    return check


Submitter = Annotated[ApiToken, Depends(_needs("submit"))]
Reader = Annotated[ApiToken, Depends(_needs("read"))]
Operating = Annotated[ApiToken, Depends(_needs("operate"))]
Key = Annotated[str, Path(pattern=models.KEY_PATTERN, description="the effect key")]
CampaignId = Annotated[str, Path(min_length=1, max_length=256, examples=["spring-2027"])]
_CALL_EXAMPLES: dict[str, Any] = {
    "email": {
        "summary": "an e-mail receipt",
        "value": {
            "tool": "send_email",
            "scope": "order-1042",
            "args": {"recipient": "ana@example.com", "subject": "Your receipt", "body": "Thanks!"},
        },
    },
    "charge": {
        "summary": "a charge",
        "value": {
            "tool": "charge",
            "scope": "order-1042",
            "args": {"customer": "cus_7", "amount": "10.50", "currency": "usd"},
        },
    },
}
_CAMPAIGN_EXAMPLES: dict[str, Any] = {
    "spring": {
        "summary": "a notice to three recipients",
        "value": {
            "campaign_id": "spring-2027",
            "tool": "send_email",
            "action": "notice",
            "args": {"subject": "Spring sale", "body": "Hello!"},
            "recipients": ["ana@example.com", "bo@example.com", "cy@example.com"],
        },
    },
}
_AUTH = (400, 401, 403, 413, 422, 503)


def _known_query(request: Request) -> None:
    """Strict about the query too: a parameter the route does not take is an error, not
    silently ignored (a misspelt ``?wiat=`` would otherwise not wait)."""
    route = request.scope["route"]
    known = {param.alias for param in route.dependant.query_params}
    unknown = [name for name in request.query_params if name not in known]
    if unknown:
        raise RequestValidationError(
            [{"type": "extra_forbidden", "loc": ("query", name), "msg": "Extra inputs are not "
              "permitted", "input": None} for name in unknown]
        )  # fmt: skip


router = APIRouter(prefix="/v1", dependencies=[Depends(_known_query)])


# -- producers --------------------------------------------------------------------------


@router.post(
    "/tool-calls",
    summary="Submit one tool call",
    responses={
        200: {"model": models.SubmitResult, "description": "done: the receipt is included"},
        202: {"model": models.SubmitResult, "description": "enqueued or pending (a live "
              "message exists); with ?wait=, not DONE in time (state and message say where)"},
        409: {"model": models.SubmitResult, "description": "conflict: other bound fields "
              "were recorded for this effect"},
        423: {"model": models.SubmitResult, "description": "blocked: awaiting reconciliation "
              "or an operator"},
        **_problems(*_AUTH),
    },
)  # fmt: skip
def submit_tool_call(
    caller: Submitter,
    call: Annotated[models.ToolCall, Body(openapi_examples=_CALL_EXAMPLES)],
    wait: Annotated[
        float | None,
        Query(ge=0, le=models.MAX_WAIT_S, description="seconds to wait for the receipt"),
    ] = None,
) -> JSONResponse:
    handle = verbs.submit_call(call.tool, scope=call.scope, action=call.action, args=call.args)
    if wait is not None:
        try:
            verbs.await_receipt(handle, wait)
        except WaitTimeout as exc:
            document = {**handle.as_dict(), "state": exc.details["state"], "message": exc.message}
            return JSONResponse(document, status_code=202)
    return JSONResponse(handle.as_dict(), status_code=_SUBMIT_STATUS[handle.status])


_SUBMIT_STATUS = {
    Status.DONE: 200, Status.ENQUEUED: 202, Status.PENDING: 202, Status.CONFLICT: 409,
    Status.BLOCKED: 423,
}  # fmt: skip


# A campaign of at most this many recipients is planned and fanned out in the request (its
# report is the answer); a larger one runs as a job. One batch of the fan-out: a second.
INLINE_RECIPIENTS = 1000
_jobs_lock = threading.Lock()


def _jobs(request: Request) -> CampaignJobs:
    with _jobs_lock:  # one per app, made on first use
        jobs: CampaignJobs | None = getattr(request.app.state, "campaign_jobs", None)
        if jobs is None:
            jobs = request.app.state.campaign_jobs = CampaignJobs(current())
    return jobs


@router.post(
    "/campaigns",
    summary="Freeze and fan out a campaign (a large one as a job)",
    status_code=202,
    responses={
        202: {
            "model": models.CampaignReport | models.CampaignJobAccepted,
            "description": f"up to {INLINE_RECIPIENTS} recipients: frozen and fanned out, the "
            "report; more: accepted as a job, its URL in Location and status_url",
        },
        **_problems(409, *_AUTH),
    },
)
def submit_campaign(
    request: Request,
    caller: Submitter,
    spec: Annotated[CampaignFile, Body(openapi_examples=_CAMPAIGN_EXAMPLES)],
) -> JSONResponse:
    if len(spec.recipients) <= INLINE_RECIPIENTS:
        return JSONResponse(verbs.submit_campaign_file(spec).as_dict(), status_code=202)
    campaign_id, job_id = _jobs(request).start(spec)
    url = f"/v1/campaigns/{quote(campaign_id, safe='')}/jobs/{job_id}"
    body = {"job_id": job_id, "campaign_id": campaign_id, "state": "accepted",
            "recipients": len(spec.recipients), "status_url": url}  # fmt: skip
    return JSONResponse(body, status_code=202, headers={"Location": url})


@router.get(
    "/campaigns/{campaign_id}/jobs/{job_id}",
    summary="A campaign job: its phase and progress, then the campaign's status",
    responses={200: {"model": models.CampaignJob}, **_problems(404, *_AUTH)},
)
def get_campaign_job(
    caller: Reader,
    campaign_id: CampaignId,
    job_id: Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="from status_url")],
) -> JSONResponse:
    try:
        document = verbs.campaign_job(verbs.operator(), campaign_id, job_id)
    except CampaignNotFoundError:
        raise ApiProblem(404, "not_found", "no such campaign job") from None
    return JSONResponse(document)


@router.get(
    "/campaigns/{campaign_id}",
    summary="A campaign's counts, never-sent diff and a page of recipients",
    responses={200: {"model": models.CampaignStatus}, **_problems(404, *_AUTH)},
)
def get_campaign(
    caller: Reader,
    campaign_id: CampaignId,
    cursor: Annotated[
        int,
        Query(ge=0, le=models.MAX_CURSOR, description="from the previous page's next_cursor"),
    ] = 0,
    page_size: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    document = verbs.campaign_status(
        verbs.operator(), campaign_id, cursor=cursor, page_size=page_size
    )  # no such campaign: 404 (dedupe.errors.CODES)
    return JSONResponse(document)


_SINCE = "from this time on: ISO 8601 (UTC unless it says otherwise), or seconds ago"
Since = Annotated[str | None, Query(min_length=1, max_length=40, description=_SINCE)]
PageCursor = Annotated[
    str | None,
    Query(min_length=1, max_length=100, description="from the previous page's next_cursor"),
]
PageLimit = Annotated[int, Query(ge=1, le=verbs.MAX_PAGE)]
ToolQuery = Annotated[str | None, Query(pattern=models.TOOL_PATTERN)]


def _since(ops: Operator, text: str | None, what: str = "since") -> int | None:
    return verbs.parse_since(text, now_ms=ops.ledger.server_time_ms, what=what)


@router.get(
    "/pending",
    summary="Keys only a broker message stands for (a pending marker, no record held)",
    responses={200: {"model": models.PendingMarkers}, **_problems(*_AUTH)},
)
def list_pending(caller: Reader, limit: PageLimit = 100) -> JSONResponse:
    return JSONResponse({"pending": verbs.pending_markers(verbs.operator(), limit=limit)})


@router.get(
    "/effects",
    summary="A page of the unsettled effects (the state indexes), or a key search",
    responses={200: {"model": models.EffectsPage}, **_problems(*_AUTH)},
)
def list_effects(
    caller: Reader,
    state: Annotated[
        IndexedState | None,
        Query(description="default: UNKNOWN, then CLAIMED and RECONCILING"),
    ] = None,
    tool: ToolQuery = None,
    since: Since = None,
    cursor: PageCursor = None,
    limit: PageLimit = 100,
    key: Annotated[
        str | None,
        Query(
            pattern=f"^{KEY_OR_PREFIX.pattern}$",
            description="an effect key or its first 12+ digits",
        ),
    ] = None,
) -> JSONResponse:
    ops = verbs.operator()
    if key is not None:
        if since is not None or cursor is not None:
            raise ApiProblem(422, "invalid", "key searches by key: it does not page")
        found = verbs.find_keys(ops, key, limit=limit)
        return JSONResponse({"effects": [r.as_dict() for r in found], "next_cursor": None})
    page = verbs.effects_page(
        ops, state=State(state) if state else None, tool=tool, since_ms=_since(ops, since),
        cursor=cursor, limit=limit,
    )  # fmt: skip
    return JSONResponse(page)


@router.get(
    "/deadletters",
    summary="The dead-letter stream, newest first",
    responses={200: {"model": models.DeadLetterPage}, **_problems(*_AUTH)},
)
def dead_letters(
    caller: Reader,
    since: Since = None,
    tool: ToolQuery = None,
    cursor: PageCursor = None,
    limit: PageLimit = 100,
) -> JSONResponse:
    ops = verbs.operator()
    page = verbs.dead_letters(
        ops, since_ms=_since(ops, since), tool=tool, cursor=cursor, limit=limit
    )
    return JSONResponse(page)


@router.get(
    "/scheduled",
    summary="Messages waiting in the delay queues (retries backing off, delayed sends), by "
    "next attempt; 422 on RabbitMQ, whose delay queues cannot be listed",
    responses={200: {"model": models.ScheduledPage}, **_problems(*_AUTH)},
)
def scheduled(
    caller: Reader,
    kind: Annotated[
        Literal["retrying", "delayed"] | None,
        Query(description="retrying: failed at least once; delayed: sent with a delay"),
    ] = None,
    tool: ToolQuery = None,
    cursor: Annotated[
        str | None,
        Query(pattern=r"^[0-9]{1,16}\.[0-9a-f-]{36}$", description="the previous next_cursor"),
    ] = None,
    limit: PageLimit = 100,
) -> JSONResponse:
    return JSONResponse(verbs.scheduled(kind=kind, tool=tool, cursor=cursor, limit=limit))


@router.get(
    "/audit",
    summary="The audit stream (operator actions and refusals), newest first",
    responses={200: {"model": models.AuditPage}, **_problems(*_AUTH)},
)
def audit(
    caller: Reader,
    key: Annotated[
        str | None, Query(pattern=models.KEY_PATTERN, description="one effect's whole trail")
    ] = None,
    since: Since = None,
    actor: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    cursor: PageCursor = None,
    limit: PageLimit = 100,
) -> JSONResponse:
    ops = verbs.operator()
    page = verbs.audit_page(
        ops, key=key, since_ms=_since(ops, since), actor=actor, cursor=cursor, limit=limit
    )
    return JSONResponse(page)


@router.get(
    "/effects/{key}",
    summary="One effect: state, receipts, raw response, history",
    responses={200: {"model": models.EffectDocument}, **_problems(404, *_AUTH)},
)
def get_effect(caller: Reader, key: Key) -> JSONResponse:
    return JSONResponse(verbs.inspect(verbs.operator(), key).as_dict())


# -- operators: the actor is the token's name --------------------------------------------

_WRITE = {200: {"model": models.WriteResult}, **_problems(404, 409, *_AUTH)}


@router.post(
    "/effects/{key}/resolve", summary="Settle an UNKNOWN effect with evidence", responses=_WRITE
)
def resolve(caller: Operating, key: Key, body: models.Resolve) -> JSONResponse:
    document = verbs.resolve(
        key, executed=body.executed, actor=caller.name, reason=body.reason,
        receipt=body.receipt, override_evidence=body.override_evidence,
    )  # fmt: skip
    return JSONResponse(document)


@router.post("/effects/{key}/revoke", summary="Void a DONE effect", responses=_WRITE)
def revoke(caller: Operating, key: Key, body: models.Action) -> JSONResponse:
    return JSONResponse(verbs.revoke(key, actor=caller.name, reason=body.reason))


@router.post("/effects/{key}/supersede", summary="Replace a DONE effect", responses=_WRITE)
def supersede(caller: Operating, key: Key, body: models.Action) -> JSONResponse:
    return JSONResponse(verbs.supersede(key, actor=caller.name, reason=body.reason))


@router.post(
    "/effects/{key}/replay",
    summary="Submit a FAILED / REVOKED / SUPERSEDED effect again: its stored request, or "
    "the original call given (scope, action, args)",
    responses={200: {"model": models.ReplayResult}, **_problems(404, 409, *_AUTH)},
)
def replay(caller: Operating, key: Key, body: models.Replay) -> JSONResponse:
    document = verbs.replay(
        key, actor=caller.name, reason=body.reason, scope=body.scope, action=body.action,
        args=body.args,
    )  # fmt: skip
    return JSONResponse(document)


@router.post(
    "/recheck",
    summary="Send UNKNOWN effects of a tool back to the reconciler (dry_run: count them)",
    responses={200: {"model": models.RecheckResult}, **_problems(*_AUTH)},
)
def recheck(caller: Operating, body: models.Recheck) -> JSONResponse:
    ops = verbs.operator()
    document = verbs.recheck(
        body.tool, since_ms=_since(ops, body.since), until_ms=_since(ops, body.until, "until"),
        actor=caller.name, reason=body.reason, dry_run=body.dry_run,
    )  # fmt: skip
    return JSONResponse(document)


@router.post(
    "/deadletters/{action}",
    summary="Requeue (fresh retry budget) or purge dead messages, named or by tool, at most "
    "limit per call (dry_run: count them); 422 on RabbitMQ",
    responses={200: {"model": models.DeadLetterResult}, **_problems(*_AUTH)},
)
def dead_letter_action(
    caller: Operating,
    action: Annotated[Literal["requeue", "purge"], Path()],
    body: models.DeadLetterAction,
) -> JSONResponse:
    document = verbs.dead_queue(
        action, message_ids=body.message_ids, everything=body.all, tool=body.tool,
        actor=caller.name, reason=body.reason, dry_run=body.dry_run, limit=body.limit,
    )  # fmt: skip
    return JSONResponse(document)


# -- pause and resume (workers.broker.gate) ---------------------------------------------


@router.get(
    "/controls",
    summary="What is paused (by whom, why, since when), and each tool's declared limits",
    responses={200: {"model": models.Controls}, **_problems(*_AUTH)},
)
def controls(caller: Reader) -> JSONResponse:
    return JSONResponse(verbs.controls())


@router.post(
    "/pause",
    summary="Hold back a tool's or a queue's messages until resumed: none claimed, run or "
    "dead-lettered, no retry spent",
    responses={200: {"model": models.PauseResult}, **_problems(*_AUTH)},
)
def pause(caller: Operating, body: models.PauseTarget) -> JSONResponse:
    kind, name = body.target
    return JSONResponse(verbs.pause(kind, name, actor=caller.name, reason=body.reason))


@router.post(
    "/resume",
    summary="Let a paused tool's or queue's messages run again",
    responses={200: {"model": models.PauseResult}, **_problems(*_AUTH)},
)
def resume(caller: Operating, body: models.PauseTarget) -> JSONResponse:
    kind, name = body.target
    return JSONResponse(verbs.resume(kind, name, actor=caller.name, reason=body.reason))
