"""The operator console: server-rendered pages under ``/console`` (no JavaScript at all).

The work queue (UNKNOWN effects, expired claims awaiting the reconciler), one effect's whole
story (history, receipts, raw response, late receipts, the audit trail) with the resolve /
revoke / supersede / replay forms, and campaign progress. Log in with an API token that has
the ``read`` scope; the actions need ``operate`` and are audited under the token's name.

Every POST must come from a page of this console: its ``Origin`` (which browsers send with
form posts) must name this host, and an authenticated form must carry the CSRF token that
``Tokens.csrf`` derives from the session (see ``workers.api.auth``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from dedupe import CampaignNotFoundError, EffectqError, EffectRecord, MessageError, State
from dedupe.identity import EFFECT_KEY
from dedupe.spec import TOOL_NAME
from dedupe.states import OPERATOR_ACTIONS, IndexedState

from .. import verbs
from .auth import ApiToken, Tokens
from .models import MAX_CURSOR
from .problems import problem_of

__all__ = ["COOKIE", "router"]

COOKIE = "effectq_session"
_ACTIONS = ("resolve", "revoke", "supersede", "replay")
_MAX_FIELDS = 20
_HEADERS = {
    # Styles from this console only, nothing else loads; forms post only here; no framing.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # Not "no-referrer": Chromium would then send "Origin: null" with our own form posts.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_CSS = resources.files(__package__).joinpath("static/console.css").read_text(encoding="utf-8")


def _when(ms: int | None) -> str:
    if not ms:
        return "—"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _raw(text: str | None) -> str:
    """The raw response as received; JSON is indented for reading, anything else verbatim."""
    if text is None:
        return ""
    try:
        return _pretty(json.loads(text))
    except ValueError:
        return text


_env = Environment(
    loader=PackageLoader("workers.api", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters.update(when=_when, pretty=_pretty, raw=_raw)

router = APIRouter(prefix="/console", include_in_schema=False)


# -- sessions and forms -----------------------------------------------------------------


class _Session:
    def __init__(self, tokens: Tokens, token: ApiToken, cookie: str) -> None:
        self.token = token
        self.csrf = tokens.csrf(token, cookie)
        self.can_operate = token.allows("operate")
        self._tokens, self._cookie = tokens, cookie

    def posted(self, form: dict[str, str] | None) -> bool:
        """The form is ours: posted from this console, with this session's CSRF token."""
        if form is None:
            return False
        return self._tokens.check_csrf(self.token, self._cookie, form.get("csrf", ""))


def _session(request: Request) -> _Session | None:
    tokens: Tokens = request.app.state.tokens
    cookie = request.cookies.get(COOKIE)
    token = tokens.from_session(cookie) if cookie else None
    if token is None or cookie is None or not token.allows("read"):
        return None
    return _Session(tokens, token, cookie)


def _page(request: Request, template: str, code: int = 200, **context: Any) -> HTMLResponse:
    html = _env.get_template(template).render(session=_session(request), **context)
    return HTMLResponse(html, status_code=code, headers=_HEADERS)


def _to_login() -> RedirectResponse:
    return RedirectResponse("/console/login", status_code=303)


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is None:  # not a browser form post (curl): the CSRF token still decides
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def _form(request: Request) -> dict[str, str] | None:
    """The posted fields (first value of each), or None when the post is not one of ours."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded" or not _same_origin(request):
        return None
    try:
        text = (await request.body()).decode("utf-8")
        fields = parse_qs(text, keep_blank_values=True, max_num_fields=_MAX_FIELDS)
    except (UnicodeDecodeError, ValueError):
        return None
    return {name: values[0] for name, values in fields.items()}


def _forbidden(request: Request, message: str) -> HTMLResponse:
    return _page(request, "error.html", 403, title="Refused", message=message)


async def _operator_form(request: Request) -> tuple[_Session, dict[str, str]] | Response:
    """An operator action's session and form, or the answer refusing it: the login page
    without a session, 403 for a form not posted from this session (CSRF) or a token
    without the 'operate' scope."""
    session = _session(request)
    if session is None:
        return _to_login()
    form = await _form(request)
    if form is None or not session.posted(form):
        return _forbidden(request, "the form's CSRF token does not match your session")
    if not session.can_operate:
        return _forbidden(request, "your token lacks the 'operate' scope")
    return session, form


# -- login ------------------------------------------------------------------------------


@router.get("/login")
def login_page(request: Request) -> Response:
    if _session(request) is not None:
        return RedirectResponse("/console", status_code=303)
    return _page(request, "login.html")


@router.post("/login")
async def login(request: Request) -> Response:
    form = await _form(request)
    if form is None:
        return _forbidden(request, "this form must be posted from the console itself")
    tokens: Tokens = request.app.state.tokens
    token = tokens.match(form.get("token", ""))
    if token is None:
        return _page(request, "login.html", 401, error="unknown token")
    if not token.allows("read"):
        return _page(request, "login.html", 403, error="this token lacks the 'read' scope")
    response = RedirectResponse("/console", status_code=303)
    response.set_cookie(
        COOKIE, tokens.session(token), max_age=int(tokens.session_s), path="/console",
        secure=request.app.state.cookie_secure, httponly=True, samesite="strict",
    )  # fmt: skip
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    session, form = _session(request), await _form(request)
    if session is None:
        return _to_login()
    if not session.posted(form):
        return _forbidden(request, "the form's CSRF token does not match your session")
    response = _to_login()
    response.delete_cookie(COOKIE, path="/console")
    return response


# -- pages ------------------------------------------------------------------------------


_STATES = tuple(s.value for s in IndexedState)
Text = Annotated[str, Query(max_length=100)]


@router.get("")
def queue(
    request: Request,
    state: Text = IndexedState.UNKNOWN.value,
    tool: Text = "",
    q: Text = "",
    cursor: Text = "",
) -> Response:
    """The work queue: a page of the state indexes with filters and a key search, and the
    expired claims awaiting the reconciler (both from bucket indexes: no scan)."""
    if _session(request) is None:
        return _to_login()
    filters = {"state": state, "tool": tool, "q": q}
    ops = verbs.operator()
    try:
        if tool and not TOOL_NAME.fullmatch(tool):
            raise MessageError("not a tool's name")
        if state not in (*_STATES, "ALL"):
            raise MessageError("not a state of the work queue")
        if q:
            rows, following = verbs.find_keys(ops, q), None
        else:
            rows, following = verbs.effects(
                ops, state=None if state == "ALL" else State(state), tool=tool or None,
                cursor=cursor or None,
            )  # fmt: skip
    except EffectqError as exc:
        problem = problem_of(exc)
        return _page(request, "queue.html", problem.status, rows=[], blocked=[], filters=filters,
                     states=_STATES, error=problem.message)  # fmt: skip
    # The expired claims on the first page only: they are not part of the paging.
    blocked = [] if cursor or q else verbs.expired_claims(ops)
    return _page(
        request, "queue.html", rows=rows, blocked=blocked, now_ms=ops.ledger.server_time_ms(),
        following=following, filters=filters, states=_STATES,
    )  # fmt: skip


@router.post("/recheck")
async def recheck(request: Request) -> Response:
    """The bulk re-check: UNKNOWN effects of a tool back to the reconciler (dry run first)."""
    posted = await _operator_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted

    def run() -> dict[str, Any]:
        ops = verbs.operator()
        now = ops.ledger.server_time_ms
        since = verbs.parse_since(form.get("since") or None, now_ms=now, what="since")
        until = verbs.parse_since(form.get("until") or None, now_ms=now, what="until")
        tool = form.get("tool", "")
        if not TOOL_NAME.fullmatch(tool):
            raise MessageError("not a tool's name")
        return verbs.recheck(
            tool, since_ms=since, until_ms=until, actor=session.token.name,
            reason=form.get("reason", ""), dry_run=form.get("dry_run") == "on",
        )  # fmt: skip

    try:
        result = await run_in_threadpool(run)
    except EffectqError as exc:
        problem = problem_of(exc)
        return _page(request, "recheck.html", problem.status, result=None, form=form,
                     error=problem.message)  # fmt: skip
    return _page(request, "recheck.html", result=result, form=form)


@router.get("/deadletters")
def dead_letters(request: Request, tool: Text = "", cursor: Text = "") -> Response:
    if _session(request) is None:
        return _to_login()
    return _dead_letters_page(request, tool, cursor)


def _dead_letters_page(
    request: Request, tool: str, cursor: str, status: int = 200, **context: Any
) -> Response:
    try:
        if tool and not TOOL_NAME.fullmatch(tool):
            raise MessageError("not a tool's name")
        page = verbs.dead_letters(verbs.operator(), tool=tool or None, cursor=cursor or None)
    except EffectqError as exc:
        problem = problem_of(exc)
        return _page(request, "deadletters.html", problem.status, page=None, tool=tool,
                     error=problem.message, **context)  # fmt: skip
    return _page(request, "deadletters.html", status, page=page, tool=tool, **context)


_DEAD_ACTIONS = ("requeue", "purge")


@router.post("/deadletters/{action}")
async def dead_letter_action(request: Request, action: str) -> Response:
    """Requeue or purge dead messages: one (its row's form) or by tool, bounded (the bulk
    form, dry run first); audited under the session's name."""
    posted = await _operator_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    if action not in _DEAD_ACTIONS:
        return _page(request, "error.html", 404, title="Not found", message="no such action")

    def run() -> dict[str, Any]:
        tool = form.get("tool", "")
        if tool and not TOOL_NAME.fullmatch(tool):
            raise MessageError("not a tool's name")
        limit = form.get("limit", "") or "100"
        if not limit.isdigit() or len(limit) > 4:
            raise MessageError("the limit is a number from 1 to 1000")
        message_id = form.get("message_id", "")
        return verbs.dead_queue(
            action, message_ids=[message_id] if message_id else [],
            everything=not message_id, tool=tool or None, actor=session.token.name,
            reason=form.get("reason", ""), dry_run=form.get("dry_run") == "on",
            limit=int(limit),
        )  # fmt: skip

    try:
        result = await run_in_threadpool(run)
    except EffectqError as exc:
        problem = problem_of(exc)
        return await run_in_threadpool(
            _dead_letters_page, request, "", "", problem.status, error=problem.message,
            form=form, action=action,
        )  # fmt: skip
    return await run_in_threadpool(
        _dead_letters_page, request, form.get("tool", ""), "", result=result, form=form,
        action=action,
    )  # fmt: skip


@router.get("/scheduled")
def scheduled(request: Request, kind: Text = "", tool: Text = "", cursor: Text = "") -> Response:
    """The delay queues by next attempt: retries backing off and delayed sends."""
    if _session(request) is None:
        return _to_login()
    filters = {"kind": kind, "tool": tool}
    try:
        if tool and not TOOL_NAME.fullmatch(tool):
            raise MessageError("not a tool's name")
        page = verbs.scheduled(kind=kind or None, tool=tool or None, cursor=cursor or None)
    except EffectqError as exc:
        problem = problem_of(exc)
        return _page(request, "scheduled.html", problem.status, page=None, filters=filters,
                     error=problem.message)  # fmt: skip
    return _page(request, "scheduled.html", page=page, filters=filters)


@router.get("/pending")
def pending(request: Request) -> Response:
    """Keys only a broker message stands for: a SCAN of the keyspace, so a page of its own
    (never on the work queue's first page)."""
    if _session(request) is None:
        return _to_login()
    try:
        markers = verbs.pending_markers(verbs.operator())
    except EffectqError as exc:
        problem = problem_of(exc)
        return _page(request, "pending.html", problem.status, markers=None, error=problem.message)
    return _page(request, "pending.html", markers=markers)


@router.get("/audit")
def audit(request: Request, actor: Text = "", cursor: Text = "") -> Response:
    if _session(request) is None:
        return _to_login()
    try:
        page = verbs.audit_page(verbs.operator(), actor=actor or None, cursor=cursor or None)
    except EffectqError as exc:
        problem = problem_of(exc)
        return _page(request, "audit.html", problem.status, page=None, actor=actor,
                     error=problem.message)  # fmt: skip
    return _page(request, "audit.html", page=page, actor=actor)


def _story(request: Request, key: str, status: int = 200, **context: Any) -> Response:
    ops = verbs.operator()
    try:
        record = verbs.inspect(ops, key)
    except EffectqError as exc:
        problem = problem_of(exc)
        return _page(
            request, "error.html", problem.status, title="Not found", message=problem.message
        )
    audit = verbs.audit_trail(ops, key)
    return _page(
        request, "effect.html", status, record=record, audit=audit, actions=_offered(record),
        **context,
    )  # fmt: skip


def _offered(record: EffectRecord) -> list[str]:
    """The actions the state table allows from here (the ledger decides again on submit)."""
    # Replay is offered without a stored request too: its form then asks for the call.
    return list(OPERATOR_ACTIONS.get(record.state, ()))


@router.get("/effects/{key}")
def effect(request: Request, key: str, ok: str | None = None) -> Response:
    if _session(request) is None:
        return _to_login()
    if not EFFECT_KEY.fullmatch(key):
        return _page(request, "error.html", 404, title="Not found", message="not an effect key")
    return _story(request, key, ok=ok if ok in _ACTIONS else None)


@router.post("/effects/{key}/{action}")
async def act(request: Request, key: str, action: str) -> Response:
    posted = await _operator_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    if not EFFECT_KEY.fullmatch(key) or action not in _ACTIONS:
        return _page(request, "error.html", 404, title="Not found", message="no such action")
    try:
        run = _action(action, key, session.token.name, form)
        await run_in_threadpool(run)
    except EffectqError as exc:
        problem = problem_of(exc)
        return await run_in_threadpool(
            _story, request, key, problem.status, error=problem.message, form=form
        )
    return RedirectResponse(f"/console/effects/{key}?ok={action}", status_code=303)


def _action(action: str, key: str, actor: str, form: dict[str, str]) -> Callable[[], object]:
    reason = form.get("reason", "")
    if action == "resolve":
        executed = form.get("outcome") == "executed"
        receipt = _receipt(form.get("receipt", "")) if executed else None
        override = form.get("override_evidence") == "on"
        return lambda: verbs.resolve(
            key, executed=executed, actor=actor, reason=reason, receipt=receipt,
            override_evidence=override,
        )  # fmt: skip
    if action == "replay":
        call = _replay_call(form)
        return lambda: verbs.replay(key, actor=actor, reason=reason, **call)
    verb = {"revoke": verbs.revoke, "supersede": verbs.supersede}[action]
    return lambda: verb(key, actor=actor, reason=reason)


def _replay_call(form: dict[str, str]) -> dict[str, Any]:
    """The original call from the replay form (shown where the record keeps no request):
    none when its fields are empty, so a stored request is sent as it is."""
    scope, action, text = (form.get(f, "").strip() for f in ("scope", "action", "args"))
    if not (scope or action or text):
        return {}
    args = _json_object(text, "the arguments") if text else {}
    return {"scope": scope or None, "action": action or None, "args": args}


def _receipt(text: str) -> dict[str, Any] | None:
    if not text.strip():
        return None  # the Operator refuses "executed" without evidence, with its own words
    return _json_object(text, "the receipt")


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise MessageError(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise MessageError(f"{what} must be a JSON object")
    return value


@router.get("/campaigns")
def campaign(
    request: Request,
    campaign_id: Annotated[str, Query(alias="id", max_length=256)] = "",
    cursor: Annotated[int, Query(ge=0, le=MAX_CURSOR)] = 0,
) -> Response:
    if _session(request) is None:
        return _to_login()
    if not campaign_id:
        return _page(request, "campaign.html", progress=None)
    try:
        progress = verbs.campaign_status(verbs.operator(), campaign_id, cursor=cursor)
    except CampaignNotFoundError:
        return _page(request, "campaign.html", 404, progress=None, campaign_id=campaign_id,
                     error="no such campaign")  # fmt: skip
    return _page(request, "campaign.html", progress=progress, campaign_id=campaign_id)


@router.get("/static/console.css")
def stylesheet() -> Response:
    return Response(_CSS, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


# -- pause and resume (workers.broker.gate) ---------------------------------------------


@router.get("/controls")
def controls(request: Request, ok: Text = "") -> Response:
    """What is paused and each tool's declared limits; pause and resume for operators."""
    if _session(request) is None:
        return _to_login()
    shown = {"paused": "paused", "resumed": "resumed"}.get(ok)
    try:
        document = verbs.controls()
    except EffectqError as exc:
        problem = problem_of(exc)
        return _page(request, "controls.html", problem.status, controls=None,
                     error=problem.message)  # fmt: skip
    return _page(request, "controls.html", controls=document, ok=shown)


@router.post("/controls/{action}")
async def control(request: Request, action: str) -> Response:
    posted = await _operator_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    if action not in ("pause", "resume"):
        return _page(request, "error.html", 404, title="Not found", message="no such action")
    verb = verbs.pause if action == "pause" else verbs.resume
    try:
        await run_in_threadpool(
            verb, form.get("kind", ""), form.get("name", ""), actor=session.token.name,
            reason=form.get("reason", ""),
        )  # fmt: skip
    except EffectqError as exc:
        problem = problem_of(exc)
        document = await run_in_threadpool(verbs.controls)
        return _page(request, "controls.html", problem.status, controls=document,
                     error=problem.message)  # fmt: skip
    return RedirectResponse(f"/console/controls?ok={action}d", status_code=303)
