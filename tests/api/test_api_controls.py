"""Pause and resume over HTTP: the operate scope acts (the actor is the token's name, audited),
the read scope sees the state; every bad body a 422 that never echoes the value. Real stack,
as the other API tests (the worker side: tests/integration/test_pause_and_limits.py)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.api.conftest import Api
from tests.api.test_api_auth import _login
from workers import runtime
from workers.dev.local import LocalStack


def test_pause_and_resume_need_operate_and_are_audited_under_the_tokens_name(
    api: Api, client: httpx.Client
) -> None:
    body = {"tool": "charge", "reason": "provider outage"}
    with api.client("dash") as reader:
        assert reader.post("/v1/pause", json=body).status_code == 403
        assert reader.get("/v1/controls").json()["paused"] == []
    with api.client("sre-ana") as operator:
        paused = operator.post("/v1/pause", json=body)
        assert paused.status_code == 200, paused.text
        assert paused.json() | {"at_ms": 0} == {
            "kind": "tool", "name": "charge", "paused": True, "changed": True, "at_ms": 0,
        }  # fmt: skip
        with api.client("dash") as reader:
            shown = reader.get("/v1/controls").json()
        assert [(p["kind"], p["name"], p["actor"], p["reason"]) for p in shown["paused"]] == [
            ("tool", "charge", "sre-ana", "provider outage")
        ]
        assert {t["tool"]: t["paused"] for t in shown["tools"]}["charge"] is True
        resumed = operator.post("/v1/resume", json={"tool": "charge", "reason": "back"}).json()
        assert resumed["paused"] is False and resumed["changed"] is True
    audit = client.get("/v1/audit").json()["audit"]
    assert [(e["action"], e["actor"], e["reason"]) for e in audit[:2]] == [
        ("resume", "sre-ana", "back"), ("pause", "sre-ana", "provider outage"),
    ]  # fmt: skip


HOSTILE = "<script>x</script>"


@pytest.mark.parametrize(
    "body",
    [
        {"reason": "r"},  # neither tool nor queue
        {"tool": "charge", "queue": "effectq", "reason": "r"},  # both
        {"tool": HOSTILE, "reason": "r"},
        {"queue": HOSTILE, "reason": "r"},
        {"tool": "charge", "reason": ""},
        {"tool": "charge", "reason": "r", "extra": 1},
        {"tool": "no_such_tool", "reason": "r"},  # well-formed, but declared nowhere here
        {"queue": "no_such_queue", "reason": "r"},
    ],
)
def test_a_bad_pause_is_a_422_that_never_echoes_the_value(
    client: httpx.Client, body: dict[str, Any]
) -> None:
    for route in ("/v1/pause", "/v1/resume"):
        answer = client.post(route, json=body)
        assert answer.status_code == 422, (route, body, answer.text)
        for value in body.values():
            if isinstance(value, str) and len(value) > 2:
                assert value not in answer.text or value in ("charge", "effectq"), answer.text
    assert client.get("/v1/controls").json()["paused"] == []


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match is not None
    return match.group(1)


def test_the_console_shows_pauses_and_offers_pause_and_resume_to_an_operator(
    api: Api, live: LocalStack
) -> None:
    viewer, _ = _login(api, "dash")
    page = viewer.get("/console/controls").text
    assert "Nothing paused." in page and 'action="/console/controls/pause"' not in page
    form = {"csrf": _csrf(page), "kind": "tool", "name": "charge", "reason": "r"}
    assert viewer.post("/console/controls/pause", data=form).status_code == 403

    ops, _ = _login(api, "sre-ana")
    csrf = _csrf(ops.get("/console/controls").text)
    forged = {"csrf": "0" * 64, "kind": "tool", "name": "charge", "reason": "r"}
    assert ops.post("/console/controls/pause", data=forged).status_code == 403
    bad = ops.post("/console/controls/pause", data={**form, "csrf": csrf, "name": "Sec<ret>"})
    assert bad.status_code == 422 and "Sec" not in bad.text
    done = ops.post("/console/controls/pause", data={**form, "csrf": csrf, "reason": "outage"})
    assert (done.status_code, done.headers["location"]) == (303, "/console/controls?ok=paused")
    page = ops.get(done.headers["location"]).text
    assert re.search(r"<td>tool</td><td>charge</td><td>sre-ana</td>", page), page
    assert 'action="/console/controls/resume"' in page
    back = ops.post("/console/controls/resume", data={**form, "csrf": csrf, "reason": "back"})
    assert back.status_code == 303
    assert "Nothing paused." in ops.get("/console/controls").text
    audit = [(e["actor"], e["action"], e["reason"]) for e in runtime.ledger().audit_log()]
    assert audit[:2] == [("sre-ana", "resume", "back"), ("sre-ana", "pause", "outage")]
