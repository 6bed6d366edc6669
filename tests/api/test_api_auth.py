"""Who may call what: the auth matrix over every route, operator calls audited under the
token's name, the console's session cookie and CSRF guard, and what never leaves the
server (tracebacks, keys in the access log, tokens in configuration errors)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from dedupe import Effect, Ledger
from tests.api.conftest import ROLES, TOKENS, Api, bearer
from tests.support.ledgers import RETENTION_S, poll
from tests.support.stack import wait_for
from workers import get_tool, runtime, submit_campaign, verbs
from workers.api.auth import Tokens, parse_tokens
from workers.api.console import COOKIE
from workers.dev.local import LocalStack
from workers.settings import Settings

RECEIPT = {"id": "eff_by_hand"}


CHARGE_ARGS = {"customer": "c1", "amount": "1", "currency": "eur"}


def _effect(scope: str) -> Effect:
    return get_tool("charge").derive(scope, CHARGE_ARGS)


def _done(ledger: Ledger, scope: str = "order-done") -> str:
    effect = _effect(scope)
    claim = ledger.claim(effect, lease_s=30, holder="w/1")
    ledger.commit(effect.key, claim.token, RECEIPT, retention_s=RETENTION_S)
    return effect.key


def _unknown(ledger: Ledger, scope: str = "order-unknown") -> str:
    effect = _effect(scope)
    ledger.claim(effect, lease_s=0.05, holder="dead/1")
    takeover = poll(lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), bool)
    assert takeover is not None
    ledger.mark_unknown(effect.key, takeover.token, reason="lookup unavailable 5 times")
    return effect.key


def _revoked(ledger: Ledger) -> str:
    key = _done(ledger, "order-revoked")
    ledger.operate(key, "revoke", note="set up", retention_s=RETENTION_S)
    return key


@dataclass(frozen=True)
class Route:
    method: str
    scope: str
    path: Callable[[Ledger], str]  # sets up what a 2xx needs and returns the path
    body: dict[str, Any] | None
    ok: int


REASON = {"reason": "ticket 42"}
ROUTES = {
    "submit": Route("POST", "submit", lambda _: "/v1/tool-calls", {"tool": "set_value",
                    "scope": "op-1", "args": {"target": "t1", "value": 1}}, 202),
    "campaign": Route("POST", "submit", lambda _: "/v1/campaigns", {"campaign_id": "c1",
                      "tool": "send_email", "recipients": ["a@example.com"]}, 202),
    "campaign-status": Route("GET", "read", lambda _: _campaign(), None, 200),
    "effect": Route("GET", "read", lambda ledger: f"/v1/effects/{_done(ledger)}", None, 200),
    "scheduled": Route("GET", "read", lambda _: "/v1/scheduled", None, 200),
    "resolve": Route("POST", "operate", lambda ledger: f"/v1/effects/{_unknown(ledger)}/resolve",
                     {"executed": True, "receipt": RECEIPT, **REASON}, 200),
    "revoke": Route("POST", "operate", lambda ledger: f"/v1/effects/{_done(ledger)}/revoke",
                    REASON, 200),
    "supersede": Route("POST", "operate",
                       lambda ledger: f"/v1/effects/{_done(ledger)}/supersede", REASON, 200),
    # A DONE record keeps no request: replay from REVOKED takes the original call.
    "replay": Route("POST", "operate", lambda ledger: f"/v1/effects/{_revoked(ledger)}/replay",
                    {**REASON, "scope": "order-revoked", "args": CHARGE_ARGS}, 200),
}  # fmt: skip
# A role without each scope.
LACKING = {"submit": "dash", "read": "shop", "operate": "dash"}
ALLOWED = {"submit": "shop", "read": "dash", "operate": "sre-ana"}


def _campaign() -> str:
    submit_campaign("spring-auth", "send_email", ["a@example.com"])
    return "/v1/campaigns/spring-auth"


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_auth_matrix(api: Api, live: LocalStack, name: str) -> None:
    route = ROUTES[name]
    ledger = runtime.ledger()
    path = route.path(ledger)

    def call(headers: dict[str, str]) -> httpx.Response:
        with api.client(None) as c:
            return c.request(route.method, path, json=route.body, headers=headers)

    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789ab"},
                    {"Authorization": f"Basic {ROLES['root'][0]}"}):  # fmt: skip
        refused = call(headers)
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.headers["www-authenticate"] == 'Bearer realm="effectq"'
        assert refused.json()["error"] == "unauthorized"
    forbidden = call(bearer(LACKING[route.scope]))
    assert forbidden.status_code == 403
    lacks = f"this token lacks the {route.scope!r} scope"
    assert forbidden.json() == {"error": "forbidden", "message": lacks}
    assert ledger.audit_log() == []  # refused before any operator action ran
    allowed = call(bearer(ALLOWED[route.scope]))
    assert allowed.status_code == route.ok, allowed.text
    if route.scope == "operate":
        [entry] = ledger.audit_log()
        assert entry["actor"] == "sre-ana" and entry["reason"] == "ticket 42"
        assert entry["action"] == {"resolve": "resolve_done"}.get(name, name)
        assert path.split("/")[3] == entry["key"]


def test_operator_calls_answer_the_cli_documents_and_refusals_are_audited(
    api: Api, live: LocalStack
) -> None:
    ledger = runtime.ledger()
    key = _unknown(ledger)
    with api.client("sre-ana") as ops:
        no_evidence = ops.post(f"/v1/effects/{key}/resolve", json={"executed": True, **REASON})
        assert no_evidence.status_code == 422
        assert no_evidence.json()["message"] == "resolve --executed needs the receipt as evidence"
        resolved = ops.post(f"/v1/effects/{key}/resolve", json={"executed": False, **REASON})
        assert resolved.status_code == 200
        assert resolved.json() == {"key": key, "state": "FAILED", "token": 3}
        again = ops.post(f"/v1/effects/{key}/resolve", json={"executed": False, **REASON})
        assert again.status_code == 409
        assert again.json() == {
            "error": "refused", "state": "FAILED",
            "message": "resolve_failed refused: the effect is FAILED; only an UNKNOWN effect "
            "can be resolved",
        }  # fmt: skip
        blank = ops.post(f"/v1/effects/{key}/revoke", json={"reason": " "})
        assert blank.status_code == 422  # never reaches the audit stream
        replayed = ops.post(f"/v1/effects/{key}/replay", json=REASON)
        assert replayed.status_code == 200
        assert replayed.json() == {"key": key, "status": "enqueued"}
    trail = [(e["action"], e["actor"], e["outcome"].split(":")[0]) for e in ledger.audit_log()]
    assert trail == [
        ("replay", "sre-ana", "enqueued"),
        ("resolve_failed", "sre-ana", "refused"),
        ("resolve_failed", "sre-ana", "ok"),
        ("resolve_done", "sre-ana", "refused"),
    ]


def test_the_access_log_names_routes_not_keys(
    api: Api, live: LocalStack, caplog: pytest.LogCaptureFixture
) -> None:
    key = _done(runtime.ledger())
    caplog.set_level(logging.INFO, logger="workers.api")
    with api.client("dash") as c:
        assert c.get(f"/v1/effects/{key}").status_code == 200
        assert c.get("/v1/campaigns/secret-campaign").status_code == 404
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("workers.api")]
    assert any(line.startswith("GET /v1/effects/{key} 200") for line in lines), lines
    assert any(line.startswith("GET /v1/campaigns/{campaign_id} 404") for line in lines)
    assert not [line for line in lines if key[:12] in line or "secret" in line]


def test_an_unexpected_error_answers_500_without_a_traceback(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> Any:
        raise RuntimeError("boom for secret.person@leak.example")

    monkeypatch.setattr(verbs, "operator", broken)  # the server runs in this process
    with api.client("dash") as c:
        answer = c.get(f"/v1/effects/{'a' * 64}")
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal", "message": "internal error"}
    assert "secret" not in answer.text and "Traceback" not in answer.text


# -- the console's session and CSRF ------------------------------------------------------


def _login(api: Api, role: str) -> tuple[httpx.Client, str]:
    c = api.client(None)
    answer = c.post("/console/login", data={"token": ROLES[role][0]})
    assert answer.status_code == 303 and answer.headers["location"] == "/console"
    set_cookie = answer.headers["set-cookie"]
    for flag in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/console"):
        assert flag.lower() in set_cookie.lower(), set_cookie
    assert ROLES[role][0] not in set_cookie  # the browser never holds the token
    cookie = set_cookie.split(";")[0].split("=", 1)[1]
    c.headers["Cookie"] = f"{COOKIE}={cookie}"  # Secure cookies: httpx keeps them for https
    return c, cookie


def test_console_login_session_and_csrf(api: Api, live: LocalStack) -> None:
    tokens: Tokens = api.app.state.tokens
    assert api.client(None).get("/console").headers["location"] == "/console/login"
    wrong = api.client(None).post("/console/login", data={"token": "nope"})
    assert wrong.status_code == 401 and "unknown token" in wrong.text
    no_read = api.client(None).post("/console/login", data={"token": ROLES["shop"][0]})
    assert no_read.status_code == 403 and "set-cookie" not in no_read.headers
    foreign = api.client(None).post(
        "/console/login", data={"token": ROLES["sre-ana"][0]},
        headers={"Origin": "https://evil.example"},
    )  # fmt: skip
    assert foreign.status_code == 403 and "set-cookie" not in foreign.headers

    key = _unknown(runtime.ledger())
    stale = _effect("order-stale")
    runtime.ledger().claim(stale, lease_s=0.05, holder="dead/2")  # its holder died
    c, cookie = _login(api, "sre-ana")
    wait_for(lambda: stale.key[:16] in c.get("/console").text, what="expired claim listed")
    listed = c.get("/console").text
    assert "Needs an operator: UNKNOWN (1)" in listed and key[:16] in listed
    assert "Awaiting the reconciler: leases run out (1)" in listed
    page = c.get(f"/console/effects/{key}")
    assert page.status_code == 200 and "lookup unavailable 5 times" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    csrf = tokens.csrf(tokens.from_session(cookie), cookie)  # type: ignore[arg-type]
    assert f'name="csrf" value="{csrf}"' in page.text
    form = {"outcome": "not_executed", "reason": "ticket 42"}
    for refused in (
        c.post(f"/console/effects/{key}/resolve", data=form),
        c.post(f"/console/effects/{key}/resolve", data={**form, "csrf": "0" * 64}),
        c.post(f"/console/effects/{key}/resolve", data={**form, "csrf": csrf},
               headers={"Origin": "https://evil.example"}),
    ):  # fmt: skip
        assert refused.status_code == 403
    assert runtime.ledger().audit_log() == []
    tampered = api.client(None)
    tampered.headers["Cookie"] = f"{COOKIE}={cookie[:-1]}{'0' if cookie[-1] != '0' else '1'}"
    assert tampered.get("/console").headers["location"] == "/console/login"
    done = c.post(f"/console/effects/{key}/resolve", data={**form, "csrf": csrf})
    assert done.status_code == 303
    assert done.headers["location"] == f"/console/effects/{key}?ok=resolve"
    [entry] = runtime.ledger().audit_log()
    assert (entry["actor"], entry["action"]) == ("sre-ana", "resolve_failed")

    reader, reader_cookie = _login(api, "dash")
    read_only = reader.get(f"/console/effects/{_done(runtime.ledger())}")
    assert "read only" in read_only.text and 'action="/console/effects/' not in read_only.text
    reader_csrf = tokens.csrf(tokens.from_session(reader_cookie), reader_cookie)  # type: ignore[arg-type]
    refused = reader.post(f"/console/effects/{key}/replay",
                          data={"reason": "x", "csrf": reader_csrf})  # fmt: skip
    assert refused.status_code == 403 and "lacks the &#39;operate&#39; scope" in refused.text


# -- tokens ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ana:only-two-parts", "entry 1: expected NAME:TOKEN:SCOPE"),
        ("ana:short:read", "entry 1 (ana): the token must be at least 16"),
        ("ana:s3cret-s3cret-s3cret:read,admin", "scopes are submit, read, operate; got ['admin']"),
        ("a b:s3cret-s3cret-s3cret:read", "entry 1: the name must be"),
        ("ana:s3cret-s3cret-s3cret:read;ana:0ther-0ther-0ther:read", "'ana' is used twice"),
        ("ana:s3cret-s3cret-s3cret:read;bo:s3cret-s3cret-s3cret:read", "configured twice"),
    ],
)
def test_bad_token_configuration_names_the_entry_never_the_token(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="EFFECTQ_API_TOKENS") as caught:
        parse_tokens(text)
    assert message in str(caught.value)
    assert "s3cret" not in str(caught.value) and "0ther" not in str(caught.value)


def test_tokens_match_sessions_expire_and_settings_hide_the_secret() -> None:
    parsed = parse_tokens(TOKENS)
    tokens = Tokens(parsed, session_s=60)
    assert tokens.match(ROLES["sre-ana"][0]) == parsed[2]
    assert tokens.match(ROLES["sre-ana"][0] + "x") is None and tokens.match("") is None
    cookie = tokens.session(parsed[2], now=1000)
    assert tokens.from_session(cookie, now=1059) == parsed[2]
    assert tokens.from_session(cookie, now=1061) is None
    assert tokens.from_session(cookie.replace("sre-ana", "root", 1), now=1000) is None
    # A rotated token ends its sessions.
    rotated = Tokens(parse_tokens(TOKENS.replace("sre-token", "new-token")), session_s=60)
    assert rotated.from_session(cookie, now=1000) is None
    shown = repr(Settings(api_tokens=SecretStr(TOKENS))) + repr(parsed)
    assert not [role for role, (secret, _) in ROLES.items() if secret in shown]
