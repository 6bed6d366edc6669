"""The incident routes and console views: pages of the work queue, the dead-letter and audit
streams, the bulk re-check (operate scope, actor = the token's name); every hostile query a
4xx that never echoes the value, never a 500. Real stack, as the other API tests."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from dedupe import State
from tests.api.conftest import ROLES, Api
from tests.support.ledgers import charge, unknown_charge
from workers import runtime
from workers.dev.local import LocalStack


def test_pages_of_unknown_effects_go_on_by_cursor(client: httpx.Client) -> None:
    keys = {unknown_charge(runtime.ledger()) for _ in range(3)}
    first = client.get("/v1/effects", params={"state": "UNKNOWN", "limit": 2}).json()
    rest = client.get("/v1/effects", params={"cursor": first["next_cursor"], "limit": 2}).json()
    assert {e["key"] for e in first["effects"] + rest["effects"]} == keys
    assert rest["next_cursor"] is None
    key = next(iter(keys))
    [found] = client.get("/v1/effects", params={"key": key[:12]}).json()["effects"]
    assert found["key"] == key


def test_recheck_needs_operate_and_is_audited_under_the_tokens_name(
    api: Api, client: httpx.Client
) -> None:
    key = unknown_charge(runtime.ledger())
    body = {"tool": "charge", "since": "600", "reason": "lookups back", "dry_run": True}
    with api.client("dash") as reader:
        assert reader.post("/v1/recheck", json=body).status_code == 403
    counted = client.post("/v1/recheck", json=body).json()
    assert (counted["matched"], counted["rechecked"]) == (1, 0)
    with api.client("sre-ana") as sre:
        done = sre.post("/v1/recheck", json={**body, "dry_run": False})
    assert done.status_code == 200 and done.json()["rechecked"] == 1
    assert runtime.ledger().get(key).state is State.RECONCILING  # type: ignore[union-attr]
    [entry] = client.get("/v1/audit", params={"key": key}).json()["audit"]
    assert (entry["action"], entry["actor"], entry["reason"]) == (
        "recheck", "sre-ana", "lookups back",
    )  # fmt: skip
    assert client.get("/v1/audit", params={"actor": "sre-ana"}).json()["audit"][0]["key"] == ""


def test_dead_letters_newest_first_filtered_by_tool(client: httpx.Client) -> None:
    ledger = runtime.ledger()
    for n, tool in enumerate(["charge", "send_email", "charge"]):
        ledger.dead_letter(message_id=f"m-{n}", tool=tool, key=None, reason="retries exhausted")
    page = client.get("/v1/deadletters", params={"tool": "charge"}).json()
    assert [e["message_id"] for e in page["dead_letters"]] == ["m-2", "m-0"]
    assert page["dead_letters"][0]["reason"] == "retries exhausted"


SECRET = "4111111111111111"
HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("/v1/effects", {"limit": 10**30}),
    ("/v1/effects", {"limit": 0}),
    ("/v1/effects", {"limit": 1001}),
    ("/v1/effects", {"since": SECRET + "x"}),
    ("/v1/effects", {"since": "nan"}),
    ("/v1/effects", {"since": "-1"}),
    ("/v1/effects", {"since": "9" * 5000}),
    ("/v1/effects", {"since": "0001-01-01"}),
    ("/v1/effects", {"cursor": SECRET}),
    ("/v1/effects", {"cursor": "u1." + "A" * 64}),
    ("/v1/effects", {"state": "DONE"}),
    ("/v1/effects", {"tool": SECRET + " x"}),
    ("/v1/effects", {"key": SECRET[:11]}),
    ("/v1/effects", {"key": "a" * 12, "cursor": "u1." + "a" * 64}),
    ("/v1/deadletters", {"cursor": "$" + SECRET}),
    ("/v1/deadletters", {"cursor": "9" * 40 + "-0"}),
    ("/v1/deadletters", {"since": "2027-13-01"}),
    ("/v1/deadletters", {"limit": -1}),
    ("/v1/audit", {"key": SECRET}),
    ("/v1/audit", {"actor": "x" * 201}),
    ("/v1/audit", {"cursor": "1-2-3"}),
    ("/v1/audit", {"secret": SECRET}),
]


@pytest.mark.parametrize(("path", "params"), HOSTILE, ids=lambda v: str(v)[:40])
def test_hostile_queries_are_a_4xx_that_never_echoes_them(
    client: httpx.Client, path: str, params: dict[str, Any]
) -> None:
    response = client.get(path, params=params)
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert SECRET not in response.text


@pytest.mark.parametrize(
    "body",
    [
        {"tool": "charge", "reason": "r", "since": "secret-time"},
        {"tool": "charge", "reason": "r", "since": "2027-01-02", "until": "2027-01-01"},
        {"tool": "secret tool", "reason": "r"},
        {"tool": "nope", "reason": "r"},
        {"tool": "charge", "reason": ""},
        {"tool": "charge", "reason": "r", "dry_run": "yes"},
        {"tool": "charge", "reason": "r", "until": "1e999"},
    ],
    ids=lambda v: str(v)[:40],
)
def test_a_bad_recheck_is_a_4xx(client: httpx.Client, body: dict[str, Any]) -> None:
    response = client.post("/v1/recheck", json=body)
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert "secret" not in response.text


def _login(browser: httpx.Client, role: str) -> dict[str, str]:
    login = browser.post("/console/login", data={"token": ROLES[role][0]})
    assert login.status_code == 303
    return {"cookie": login.headers["set-cookie"].split(";")[0]}


def test_the_console_pages_filters_views_and_the_recheck_button(api: Api, live: LocalStack) -> None:
    keys = [unknown_charge(runtime.ledger()) for _ in range(3)]
    runtime.ledger().dead_letter(message_id="m-1", tool="charge", key=None, reason="bad input")
    with httpx.Client(base_url=api.url, timeout=60) as browser:
        cookie = _login(browser, "sre-ana")
        page = browser.get("/console", params={"tool": "charge"}, headers=cookie)
        assert page.status_code == 200 and all(k[:16] in page.text for k in keys)
        found = browser.get("/console", params={"q": keys[0][:12]}, headers=cookie)
        assert keys[0][:16] in found.text and keys[1][:16] not in found.text
        bad = browser.get("/console", params={"cursor": SECRET}, headers=cookie)
        assert bad.status_code == 422 and SECRET not in bad.text
        letters = browser.get("/console/deadletters", headers=cookie)
        assert letters.status_code == 200 and "bad input" in letters.text
        [csrf] = re.findall(r'name="csrf" value="([^"]+)"', page.text)[:1]
        form = {"csrf": csrf, "tool": "charge", "since": "600", "reason": "outage over"}
        counted = browser.post("/console/recheck", data={**form, "dry_run": "on"}, headers=cookie)
        assert counted.status_code == 200 and "<strong>3</strong>" in counted.text
        done = browser.post("/console/recheck", data=form, headers=cookie)
        assert done.status_code == 200 and "Re-checked <strong>3</strong>" in done.text
        trail = browser.get("/console/audit", params={"actor": "sre-ana"}, headers=cookie)
        assert trail.text.count("outage over") == 4  # three effects and the run itself
        effect = browser.get(f"/console/effects/{keys[0]}", headers=cookie)
        assert "recheck" in effect.text and "outage over" in effect.text
    with httpx.Client(base_url=api.url, timeout=60) as browser:
        cookie = _login(browser, "dash")
        page = browser.get("/console", headers=cookie)
        assert 'action="/console/recheck"' not in page.text  # read only: no button
        [csrf] = re.findall(r'name="csrf" value="([^"]+)"', page.text)[:1]
        refused = browser.post("/console/recheck", data={**form, "csrf": csrf}, headers=cookie)
        assert refused.status_code == 403


def test_keys_only_a_broker_message_stands_for_are_listed_by_the_api_and_the_console(
    api: Api, client: httpx.Client
) -> None:
    """A pending marker with no record is invisible to every state list (issue 37, item 2):
    /v1/pending and the console's Pending page show it."""
    effect = charge()
    ledger = runtime.ledger()
    assert ledger.submit(effect, message_id="m-lost", pending_s=600).status == "enqueue"
    ledger.confirm_pending([(effect, "m-lost")], 600)
    [row] = client.get("/v1/pending").json()["pending"]
    assert (row["key"], row["state"], row["message_id"], row["confirmed"]) == (
        effect.key, "ABSENT", "m-lost", True,
    )  # fmt: skip
    with httpx.Client(base_url=api.url, timeout=60) as browser:
        cookie = _login(browser, "dash")
        page = browser.get("/console/pending", headers=cookie)
        assert page.status_code == 200 and effect.key[:16] in page.text and "m-lost" in page.text
