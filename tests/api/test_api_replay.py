"""Replay through the API and the console once a DONE record keeps no request (issue 39):
the body's (or the form's) scope, action and args are the original call, checked against
the effect's key and fingerprint; a refusal is a 4xx that never echoes a value."""

from __future__ import annotations

import json

import httpx

from dedupe import Ledger
from tests.api.conftest import ROLES, Api, bearer
from tests.support.ledgers import RETENTION_S
from tests.support.stack import broker_messages
from workers import get_tool, runtime
from workers.api.auth import Tokens
from workers.api.console import COOKIE
from workers.dev.local import LocalStack

ARGS = {"customer": "cus_api", "amount": "12.50", "currency": "eur"}


def _revoked(ledger: Ledger, scope: str) -> str:
    effect = get_tool("charge").derive(scope, ARGS)
    claim = ledger.claim(effect, lease_s=30, holder="w/1")
    ledger.commit(effect.key, claim.token, {"id": "ch_api"}, retention_s=RETENTION_S)
    ledger.operate(effect.key, "revoke", note="set up", retention_s=RETENTION_S)
    return effect.key


def test_the_api_replays_a_revoked_effect_from_the_call_in_its_body(
    api: Api, live: LocalStack
) -> None:
    key = _revoked(runtime.ledger(), "order-api-rp")
    with httpx.Client(base_url=api.url, headers=bearer("sre-ana"), timeout=60) as c:
        bare = c.post(f"/v1/effects/{key}/replay", json={"reason": "again"})
        assert bare.status_code == 422
        assert "keeps no request" in bare.json()["message"]
        assert "scope, action, args" in bare.json()["message"]
        other = {"reason": "again", "scope": "order-api-rp", "args": {**ARGS, "amount": "77.31"}}
        conflict = c.post(f"/v1/effects/{key}/replay", json=other)
        assert conflict.status_code == 422 and "conflict" in conflict.json()["message"]
        assert "77.31" not in conflict.text
        moved = {"reason": "again", "scope": "order-xyz-secret", "args": ARGS}
        elsewhere = c.post(f"/v1/effects/{key}/replay", json=moved)
        assert elsewhere.status_code == 422 and "order-xyz-secret" not in elsewhere.text
        assert broker_messages(live)["live"] == 0
        body = {"reason": "again", "scope": "order-api-rp", "args": ARGS}
        ok = c.post(f"/v1/effects/{key}/replay", json=body)
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"key": key, "status": "enqueued"}
    assert broker_messages(live)["live"] == 1
    outcomes = [e["outcome"].split(":")[0] for e in runtime.ledger().audit_log()]
    assert outcomes == ["enqueued", "refused", "refused", "refused"]


def test_the_console_asks_for_the_call_where_no_request_is_stored(
    api: Api, live: LocalStack
) -> None:
    key = _revoked(runtime.ledger(), "order-console-rp")
    c = api.client(None)
    answer = c.post("/console/login", data={"token": ROLES["sre-ana"][0]})
    cookie = answer.headers["set-cookie"].split(";")[0].split("=", 1)[1]
    c.headers["Cookie"] = f"{COOKIE}={cookie}"
    tokens: Tokens = api.app.state.tokens
    csrf = tokens.csrf(tokens.from_session(cookie), cookie)  # type: ignore[arg-type]
    page = c.get(f"/console/effects/{key}")
    assert page.status_code == 200
    assert 'id="replay-needs-call"' in page.text and 'name="scope"' in page.text
    form = {"reason": "again", "csrf": csrf, "scope": "order-console-rp"}
    refused = c.post(f"/console/effects/{key}/replay",
                     data={**form, "args": '{"customer": "cus_api", "amount": "3.99", '
                           '"currency": "eur"}'})  # fmt: skip
    assert refused.status_code == 422 and "conflict" in refused.text
    assert "3.99" not in refused.text and "order-console-rp" not in refused.text
    assert broker_messages(live)["live"] == 0
    done = c.post(f"/console/effects/{key}/replay", data={**form, "args": json.dumps(ARGS)})
    assert done.status_code == 303, done.text
    assert done.headers["location"] == f"/console/effects/{key}?ok=replay"
    assert broker_messages(live)["live"] == 1
