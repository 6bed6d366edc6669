"""The producer API end to end — real worker processes, the real sandbox over HTTP — each
answer checked by status code and body; the bodies are the CLI's ``--json`` documents."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx

from tests.api.conftest import poll_json
from tests.support.ledgers import poll
from tests.support.stack import DRAINED, broker_messages, wait_for
from workers import get_tool, runtime
from workers.dev.local import LocalStack

EMAIL: dict[str, Any] = {
    "tool": "send_email",
    "scope": "evt-api-1",
    "args": {"recipient": "Ana@Example.com"},
}
TEMPLATE = {"subject": "Spring sale", "body": "Hello!"}


def _cli(stack: LocalStack, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "workers", *args, "--json"], env=stack.env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _charge(amount: str) -> dict[str, Any]:
    args = {"customer": "cus_7", "amount": amount, "currency": "usd"}
    return {"tool": "charge", "scope": "order-1042", "args": args}


def test_submit_duplicate_conflict_and_wait_for_the_receipt(
    client: httpx.Client, live: LocalStack
) -> None:
    first = client.post("/v1/tool-calls", json=EMAIL)
    assert first.status_code == 202, first.text
    key = get_tool("send_email").derive("evt-api-1", {"recipient": "ana@example.com"}).key
    assert first.json() == {
        "key": key, "status": "enqueued", "tool": "send_email",
        "message_id": first.json()["message_id"],
    }  # fmt: skip
    # A reworded duplicate before any worker ran: the live message stands for it.
    reworded = {**EMAIL, "args": {**EMAIL["args"], "subject": "Reworded"}}
    pending = client.post("/v1/tool-calls", json=reworded)
    assert pending.status_code == 202
    assert pending.json() == {
        "key": key,
        "status": "pending",
        "tool": "send_email",
        "state": "ABSENT",
    }
    assert client.post("/v1/tool-calls", json=_charge("10.50")).status_code == 202
    conflict = client.post("/v1/tool-calls", json=_charge("11.00"))
    assert conflict.status_code == 409
    assert conflict.json()["status"] == "conflict" and "receipt" not in conflict.json()

    live.start_workers(1, 4)
    waited = client.post("/v1/tool-calls", params={"wait": 20}, json=EMAIL)
    assert waited.status_code == 200, waited.text
    body = waited.json()
    assert (body["key"], body["status"], body["state"]) == (key, "done", "DONE")
    assert body["receipt"]["key"] == key and body["receipt"]["body"]["to"] == "Ana@Example.com"
    again = client.post("/v1/tool-calls", json=reworded)
    assert again.status_code == 200
    assert again.json() == {"key": key, "status": "done", "tool": "send_email", "state": "DONE",
                            "receipt": body["receipt"]}  # fmt: skip
    wait_for(lambda: broker_messages(live) == DRAINED, what="drained")
    charged = poll_json(client, f"/v1/effects/{conflict.json()['key']}",
                        lambda d: d.get("state") == "DONE")  # fmt: skip
    # The first one won, as submitted (a DONE record keeps its fingerprint, not its request).
    first = _charge("10.50")
    won = get_tool("charge").derive(first["scope"], first["args"]).fingerprint
    assert charged["fingerprint"] == won and charged["request"] is None
    assert client.post("/v1/tool-calls", json=_charge("11.00")).json()["state"] == "DONE"
    assert live.stats()["executions"] == {key: 1, charged["key"]: 1}
    # The effect document is `effectq inspect --json`, field for field (the record's
    # time to live runs down between the two reads).
    document = client.get(f"/v1/effects/{key}")
    assert document.status_code == 200
    api_doc, cli_doc = document.json(), _cli(live, "inspect", key)
    assert abs(api_doc.pop("ttl_ms") - cli_doc.pop("ttl_ms")) < 60_000
    assert api_doc == cli_doc


def test_wait_that_runs_out_answers_202_with_the_state(client: httpx.Client) -> None:
    late = client.post("/v1/tool-calls", params={"wait": 0.2}, json=EMAIL)  # no worker runs
    assert late.status_code == 202
    body = late.json()
    assert (body["status"], body["state"]) == ("enqueued", "ABSENT")
    assert body["message"] == "effect not DONE after 0.2s (state ABSENT)"


def test_an_unknown_effect_answers_423_blocked(client: httpx.Client) -> None:
    ledger = runtime.ledger()
    effect = get_tool("send_email").derive("evt-api-1", {"recipient": "ana@example.com"})
    ledger.claim(effect, lease_s=0.05, holder="dead/1")  # a holder that died after its claim
    takeover = poll(lambda: ledger.takeover(effect.key, lease_s=30, holder="r/1"), bool)
    assert takeover is not None
    ledger.mark_unknown(effect.key, takeover.token, reason="lookup unavailable 5 times")
    blocked = client.post("/v1/tool-calls", json=EMAIL)
    assert blocked.status_code == 423
    assert blocked.json() == {"key": effect.key, "status": "blocked", "tool": "send_email",
                              "state": "UNKNOWN"}  # fmt: skip


def test_invalid_calls_get_422_with_field_errors_and_no_echo(client: httpx.Client) -> None:
    extra = client.post("/v1/tool-calls", json={**EMAIL, "priority": "high"})
    assert extra.status_code == 422
    assert extra.json() == {
        "error": "invalid", "message": "1 invalid field",
        "errors": [{"loc": ["body", "priority"], "msg": "Extra inputs are not permitted",
                    "type": "extra_forbidden"}],
    }  # fmt: skip
    typed = client.post("/v1/tool-calls", json={**EMAIL, "scope": 42}, params={"wait": 31})
    assert typed.status_code == 422
    assert {tuple(e["loc"]) for e in typed.json()["errors"]} == {
        ("query", "wait"),
        ("body", "scope"),
    }
    secret = "secret.person@leak"
    bad = client.post("/v1/tool-calls", json={**EMAIL, "args": {"recipient": secret}})
    assert bad.status_code == 422 and bad.json()["error"] == "invalid"
    assert "recipient" in bad.json()["message"] and "secret" not in bad.text
    misspelt = client.post("/v1/tool-calls", params={"wiat": 5}, json=EMAIL)
    assert misspelt.status_code == 422
    assert misspelt.json()["errors"] == [{"loc": ["query", "wiat"], "type": "extra_forbidden",
                                          "msg": "Extra inputs are not permitted"}]  # fmt: skip
    unknown = client.post("/v1/tool-calls", json={**EMAIL, "tool": "nope"})
    assert unknown.status_code == 422 and "unknown tool 'nope'" in unknown.json()["message"]
    reserved = client.post("/v1/tool-calls", json={**EMAIL, "args": {"scope": "x"}})
    assert reserved.status_code == 422 and "reserved" in reserved.json()["message"]
    not_json = client.post(
        "/v1/tool-calls", content=b"{", headers={"content-type": "application/json"}
    )
    assert not_json.status_code == 422 and not_json.json()["errors"][0]["type"] == "json_invalid"
    assert client.get("/v1/effects/not-a-key").status_code == 422
    missing = client.get(f"/v1/effects/{'0' * 64}")
    assert missing.status_code == 404
    assert missing.json() == {"error": "not_found", "message": "no effect with this key"}


def test_bodies_over_the_bound_get_413_before_anything_reads_them(
    client: httpx.Client, live: LocalStack
) -> None:
    big = {**EMAIL, "args": {**EMAIL["args"], "body": "x" * 70_000}}
    declared = client.post("/v1/tool-calls", json=big)
    assert declared.status_code == 413
    assert declared.json() == {"error": "too_large",
                               "message": "request body over the 65536-byte bound"}  # fmt: skip

    def chunks() -> Any:  # no Content-Length: counted as it streams
        yield b'{"tool": "send_email", "scope": "s", "args": {"body": "'
        for _ in range(80):
            yield b"x" * 1000
        yield b'"}}'

    streamed = client.post("/v1/tool-calls", content=chunks(),
                           headers={"content-type": "application/json"})  # fmt: skip
    assert streamed.status_code == 413 and streamed.json()["error"] == "too_large"
    assert broker_messages(live)["live"] == 0  # nothing was submitted


def test_campaign_submit_status_and_conflict(client: httpx.Client, live: LocalStack) -> None:
    people = [f"person{i}@example.com" for i in range(5)]
    spec = {"campaign_id": "spring-api", "tool": "send_email", "args": TEMPLATE,
            "recipients": [*people, "Person0@Example.com", "not-an-address"]}  # fmt: skip
    submitted = client.post("/v1/campaigns", json=spec)
    assert submitted.status_code == 202, submitted.text
    assert submitted.json() == {
        "campaign_id": "spring-api", "plan_version": 1, "recipients": 5, "collapsed": 1,
        "rejected": [{"index": 6, "reason": submitted.json()["rejected"][0]["reason"]}],
        "rejected_total": 1, "sent": 5, "skipped": {}, "added": 0, "removed": 0,
    }  # fmt: skip
    assert "not-an-address" not in submitted.text
    live.start_workers(1, 4)
    status = poll_json(client, "/v1/campaigns/spring-api", lambda d: d["counts"]["done"] == 5)
    assert status["counts"] == {"pending": 0, "done": 5, "failed": 0, "unknown": 0, "revoked": 0}
    assert status["approved_but_never_sent"] == 0 and status["next_cursor"] == 0
    assert sorted(r["recipient"] for r in status["recipients"]) == people
    assert {r["state"] for r in status["recipients"]} == {"done"}
    assert status == _cli(live, "campaign", "status", "spring-api")
    changed = {**spec, "recipients": [*people[:3], "new@example.com"]}
    conflict = client.post("/v1/campaigns", json=changed)
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "conflict"
    assert "changed recipient list under plan version 1 (+1 -2" in conflict.json()["message"]
    v2 = client.post("/v1/campaigns", json={**changed, "plan_version": 2})
    assert v2.status_code == 202
    assert (v2.json()["sent"], v2.json()["added"], v2.json()["removed"]) == (1, 1, 2)
    assert client.get("/v1/campaigns/nope").json() == {"error": "not_found",
                                                       "message": "no such campaign"}  # fmt: skip
    none_valid = client.post("/v1/campaigns", json={**spec, "campaign_id": "x",
                                                    "recipients": ["secret.person"]})  # fmt: skip
    assert none_valid.status_code == 422 and "secret" not in none_valid.text


def test_a_large_campaign_is_accepted_as_a_job_whose_status_is_the_campaigns(
    client: httpx.Client, live: LocalStack
) -> None:
    people = [f"job{i}@example.com" for i in range(1500)]  # over the inline bound
    spec = {"campaign_id": "spring-job", "tool": "send_email", "args": TEMPLATE,
            "recipients": people}  # fmt: skip
    accepted = client.post("/v1/campaigns", json=spec)
    assert accepted.status_code == 202, accepted.text
    job = accepted.json()
    assert (job["state"], job["recipients"]) == ("accepted", 1500)
    assert accepted.headers["location"] == job["status_url"]
    assert job["status_url"] == f"/v1/campaigns/spring-job/jobs/{job['job_id']}"
    done = poll_json(client, job["status_url"], lambda d: d["state"] in ("done", "failed"))
    assert done["state"] == "done", done
    assert (done["planned"], done["sent"], done["report"]["sent"]) == (1500, 1500, 1500)
    assert done["campaign"]["counts"]["pending"] == 1500
    assert done["campaign"]["approved_but_never_sent"] == 0
    assert broker_messages(live)["live"] == 1500
    # A changed list under the same plan version: the job fails as a conflict, sends nothing.
    changed = client.post("/v1/campaigns", json={**spec, "recipients": [*people[1:], "x@y.io"]})
    url = changed.json()["status_url"]
    failed = poll_json(client, url, lambda d: d["state"] in ("done", "failed"))
    assert failed["state"] == "failed" and failed["error"]["error"] == "conflict"
    assert "changed recipient list" in failed["error"]["message"]
    assert broker_messages(live)["live"] == 1500
    missing = client.get("/v1/campaigns/spring-job/jobs/0123456789abcdef")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_campaign_recipients_are_paged(client: httpx.Client) -> None:
    # Over Redis's compact-hash threshold (512), so the plan is scanned in pages.
    people = {f"p{i}@example.com" for i in range(600)}
    spec = {"campaign_id": "paged", "tool": "send_email", "recipients": sorted(people)}
    assert client.post("/v1/campaigns", json=spec).status_code == 202
    seen: list[str] = []
    cursor, pages = 0, 0
    while True:
        page = client.get("/v1/campaigns/paged", params={"cursor": cursor, "page_size": 100})
        assert page.status_code == 200
        body = page.json()
        assert body["counts"]["pending"] == 600
        seen += [r["recipient"] for r in body["recipients"]]
        cursor, pages = body["next_cursor"], pages + 1
        if cursor == 0:
            break
    assert pages > 1 and len(seen) == len(set(seen)) and set(seen) == people
    # Redis's cursor is 64-bit: a larger one is a bad request, not an outage.
    beyond = client.get("/v1/campaigns/paged", params={"cursor": 2**64})
    assert beyond.status_code == 422 and beyond.json()["errors"][0]["loc"] == ["query", "cursor"]
