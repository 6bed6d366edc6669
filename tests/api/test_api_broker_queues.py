"""The broker's queues under an on-call's hands, live (real redis-server, real worker
processes, the real sandbox, the API served over HTTP): what waits in the delay queues —
a failing effect's retry with its next attempt and attempt count — in the CLI, the API and
the console; dead letters requeued and purged through the API and the console, one or in
bounded bulk, each audited with the token's name and the reason."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import dramatiq
import pytest
from typer.testing import CliRunner

from dedupe import State
from tests.api.conftest import Api, poll_json
from tests.api.test_api_auth import _login
from tests.support.stack import wait_states
from workers import runtime, submit
from workers.cli import app
from workers.dev.local import LocalStack

SECRET_CUSTOMER = "cus_secret_4242"  # an argument: never shown by any face


@pytest.fixture
def own_runtime() -> Iterator[None]:
    """The CLI installs a runtime of its own in this process: put the session's back."""
    previous = runtime.current()
    yield
    runtime.install(previous)


def cli(live: LocalStack, *argv: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(argv), env=live.env())
    return result.exit_code, result.stdout, result.stderr


def _charge(scope: str) -> Any:
    return submit("charge", scope=scope, customer=SECRET_CUSTOMER, amount="5.00", currency="eur")


def test_a_failing_effect_waiting_to_retry_shows_in_cli_api_and_console(
    api: Api, live: LocalStack, own_runtime: None
) -> None:
    handle = _charge("sched-1")
    live.sandbox.fail_next(handle.key, 1)  # its first call: 503, nothing executed
    # A message sent with a delay (never ran) beside it.
    delayed = runtime.current().broker.enqueue(
        dramatiq.Message(queue_name="effectq", actor_name="set_value", args=(), kwargs={},
                         options={}),
        delay=3_600_000,
    )  # fmt: skip
    started = datetime.now(UTC)
    live.start_workers(1, 2, EFFECTQ_RETRY_MIN_BACKOFF_MS="60000",
                       EFFECTQ_RETRY_MAX_BACKOFF_MS="300000")  # fmt: skip

    with api.client("dash") as viewer:  # read scope is enough to look
        page = poll_json(
            viewer, "/v1/scheduled?kind=retrying", lambda b: bool(b["scheduled"]), timeout=60
        )
        everything = viewer.get("/v1/scheduled").json()
        only_delayed = viewer.get("/v1/scheduled", params={"kind": "delayed"}).json()
        bad = viewer.get("/v1/scheduled", params={"kind": "someday-x9"})
    [row] = page["scheduled"]
    assert row["tool"] == "charge" and row["key_prefix"] == handle.key[:12]
    assert row["message_id"] == handle.message_id and row["queue"] == "effectq"
    assert (row["retries"], row["why"], row["error"]) == (1, "retry_after_failure", "not executed")
    next_attempt = datetime.fromisoformat(row["next_attempt"])
    # Dramatiq's backoff at the first retry: the minimum, up to twice it with jitter.
    assert 55 <= (next_attempt - started).total_seconds() <= 125, row
    assert row["next_attempt_ms"] == int(next_attempt.timestamp() * 1000)
    assert page["total"] == 2 and everything["total"] == 2
    assert [r["message_id"] for r in everything["scheduled"]] == [
        handle.message_id,
        delayed.message_id,
    ]  # by next attempt
    [late] = only_delayed["scheduled"]
    assert (late["why"], late["retries"], late["key_prefix"]) == ("delay", 0, "")
    assert bad.status_code == 422 and "someday" not in bad.text
    assert SECRET_CUSTOMER not in json.dumps(everything)
    record = runtime.ledger().get(handle.key)
    assert record is not None and record.state is State.FAILED
    assert live.stats()["executions"] == {}

    code, out, _ = cli(live, "scheduled", "--retrying", "--json")
    assert code == 0 and json.loads(out)["scheduled"] == [row]
    code, out, _ = cli(live, "scheduled")
    assert code == 0, out
    line = next(r for r in out.splitlines() if handle.message_id in r)
    assert handle.key[:12] in line and row["next_attempt"] in line
    assert "retry_after_failure (not executed)" in line and SECRET_CUSTOMER not in out
    code, _, err = cli(live, "scheduled", "--retrying", "--delayed")
    assert code == 2 and err.count("\n") == 1

    console, _ = _login(api, "dash")
    html = console.get("/console/scheduled", params={"kind": "retrying"}).text
    assert handle.message_id in html and handle.key[:12] in html
    assert "retry_after_failure (not executed)" in html and delayed.message_id not in html
    assert SECRET_CUSTOMER not in html
    assert 'href="/console/scheduled"' in console.get("/console").text  # in the header


def test_a_message_held_back_by_a_pause_shows_why_it_waits(api: Api, live: LocalStack) -> None:
    with api.client("sre-ana") as ops:
        paused = ops.post("/v1/pause", json={"tool": "charge", "reason": "provider outage"})
        assert paused.status_code == 200, paused.text
    handle = _charge("held-1")
    live.start_workers(1, 2)
    with api.client("dash") as viewer:
        page = poll_json(viewer, "/v1/scheduled", lambda b: bool(b["scheduled"]), timeout=60)
    [row] = page["scheduled"]
    assert row["message_id"] == handle.message_id
    assert (row["why"], row["error"], row["retries"]) == ("held_back", "paused", 0)
    assert live.stats()["executions"] == {}


def _dead(api: Api, live: LocalStack, count: int) -> list[tuple[str, str]]:
    """``count`` charges dead-lettered once their retries are spent (the provider refuses
    every call): (key, message id as GET /v1/deadletters shows it), oldest first. A retried
    message's Redis id is not its message id: requeue and purge take the one shown."""
    keys = [_charge(f"dead-{i}").key for i in range(count)]
    live.sandbox.configure(fail_rate=1.0)
    live.start_workers(1, 2, EFFECTQ_MAX_RETRIES="1")
    with api.client("dash") as viewer:
        page = poll_json(
            viewer, "/v1/deadletters", lambda b: len(b["dead_letters"]) == count, timeout=60
        )
    live.sandbox.configure(fail_rate=0.0)
    by_key = {e["key"]: e["message_id"] for e in page["dead_letters"]}
    return [(key, by_key[key]) for key in keys]


def _dead_queue_ids() -> set[str]:
    """The message ids in the broker's dead-letter queue now."""
    from workers.broker.dead_queue import DeadLetterQueue

    dead = DeadLetterQueue(runtime.current().broker.client, "effectq")  # type: ignore[attr-defined]
    return {letter.message_id for letter in dead.letters()}


def test_dead_letters_requeued_and_purged_through_the_api_audited(
    api: Api, live: LocalStack
) -> None:
    (k0, m0), (k1, m1), (k2, m2) = _dead(api, live, 3)
    assert _dead_queue_ids() == {m0, m1, m2}
    requeue, purge = "/v1/deadletters/requeue", "/v1/deadletters/purge"
    with api.client("dash") as viewer:  # read scope only
        refused = viewer.post(requeue, json={"message_ids": [m0], "reason": "r"})
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    with api.client("sre-ana") as ops:
        for body in (
            {"message_ids": ["zz-secret-not-an-id"], "reason": "r"},
            {"message_ids": [m0]},  # no reason
            {"message_ids": [m0], "reason": " "},
            {"all": True, "reason": "r", "limit": 5000},
            {"all": True, "reason": "r", "tool": "Secret Tool"},
            {"message_ids": [m0], "reason": "r", "surprise": 1},
            {"message_ids": [m0], "all": True, "reason": "r"},  # one or the other
            {"reason": "r"},  # neither
        ):
            answer = ops.post(requeue, json=body)
            assert answer.status_code == 422, (body, answer.text)
            assert "secret" not in answer.text.lower() and "5000" not in answer.text
        assert ops.post("/v1/deadletters/resurrect", json={"all": True, "reason": "r"}
                        ).status_code == 422  # fmt: skip
        assert runtime.ledger().audit_log() == []  # nothing refused reached an action
        assert _dead_queue_ids() == {m0, m1, m2}

        one = ops.post(requeue, json={"message_ids": [m0], "reason": "provider back, INC-7"})
        assert one.status_code == 200, one.text
        assert one.json() == {"matched": 1, "requeued": [m0], "refused": [], "not_found": [],
                              "dry_run": False, "more": False}  # fmt: skip
        assert wait_states(runtime.ledger(), [k0], timeout=60)[k0].state is State.DONE

        counted = ops.post(requeue, json={"all": True, "tool": "charge", "limit": 1,
                                          "reason": "how many", "dry_run": True})  # fmt: skip
        assert counted.json()["matched"] == 1 and counted.json()["more"] is True

        dropped = ops.post(purge, json={"message_ids": [m1], "reason": "customer cancelled"})
        assert dropped.json()["purged"] == [m1]
        again = ops.post(purge, json={"message_ids": [m1], "reason": "twice"})
        assert again.json()["purged"] == [] and again.json()["not_found"] == [m1]

        bulk = ops.post(requeue, json={"all": True, "tool": "charge", "limit": 1,
                                       "reason": "the rest, INC-7"})  # fmt: skip
        assert bulk.json()["requeued"] == [m2] and bulk.json()["more"] is False
        assert wait_states(runtime.ledger(), [k2], timeout=60)[k2].state is State.DONE
        audit = ops.get("/v1/audit", params={"actor": "sre-ana"}).json()["audit"]

    assert _dead_queue_ids() == set()
    executions = live.stats()["executions"]
    assert executions == {k0: 1, k2: 1}  # the purged one never ran
    record = runtime.ledger().get(k1)
    assert record is not None and record.state is State.FAILED
    entries = [(e["action"], e["key"], e["reason"], e["outcome"].split(" (")[0]) for e in audit]
    assert entries == [
        ("deadletter_requeue", "", "the rest, INC-7", "ok: 1 of 1"),
        ("deadletter_requeue", k2, "the rest, INC-7", "ok: back on effectq"),
        ("deadletter_purge", "", "twice", "ok: 0 of 0"),
        ("deadletter_purge", "", "customer cancelled", "ok: 1 of 1"),
        ("deadletter_purge", k1, "customer cancelled", "ok: dropped from effectq"),
        ("deadletter_requeue", "", "provider back, INC-7", "ok: 1 of 1"),
        ("deadletter_requeue", k0, "provider back, INC-7", "ok: back on effectq"),
    ]
    assert {e["actor"] for e in audit} == {"sre-ana"}


def test_the_console_requeues_and_purges_a_dead_letter_with_csrf(
    api: Api, live: LocalStack
) -> None:
    (k0, m0), (_, m1) = _dead(api, live, 2)
    viewer, _ = _login(api, "dash")
    page = viewer.get("/console/deadletters").text
    assert m0 in page and "/console/deadletters/requeue" not in page  # no forms to a viewer
    csrf_of_viewer = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf_of_viewer is not None
    form = {"csrf": csrf_of_viewer.group(1), "message_id": m0, "reason": "r"}
    assert viewer.post("/console/deadletters/requeue", data=form).status_code == 403

    ops, _ = _login(api, "sre-ana")
    page = ops.get("/console/deadletters").text
    assert page.count('action="/console/deadletters/requeue"') == 3  # bulk + one per row
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match is not None
    csrf = match.group(1)
    forged = ops.post("/console/deadletters/requeue",
                      data={"csrf": "0" * 64, "message_id": m0, "reason": "r"})  # fmt: skip
    assert forged.status_code == 403 and _dead_queue_ids() == {m0, m1}
    counted = ops.post("/console/deadletters/purge",
                       data={"csrf": csrf, "tool": "charge", "limit": "1", "reason": "count",
                             "dry_run": "on"})  # fmt: skip
    assert counted.status_code == 200
    assert "Dry run: <strong>1</strong>" in counted.text and "More match" in counted.text
    done = ops.post("/console/deadletters/requeue",
                    data={"csrf": csrf, "message_id": m0, "reason": "pool fixed"})  # fmt: skip
    assert done.status_code == 200 and "Requeued\n<strong>1</strong>" in done.text
    bad = ops.post("/console/deadletters/purge",
                   data={"csrf": csrf, "message_id": "secret-id", "reason": "x"})  # fmt: skip
    assert bad.status_code == 422 and "secret" not in bad.text
    gone = ops.post("/console/deadletters/purge",
                    data={"csrf": csrf, "message_id": m1, "reason": "cancelled"})  # fmt: skip
    assert gone.status_code == 200 and _dead_queue_ids() == set()
    assert wait_states(runtime.ledger(), [k0], timeout=60)[k0].state is State.DONE
    assert live.stats()["executions"] == {k0: 1}
    trail = [(e["actor"], e["action"], e["reason"]) for e in runtime.ledger().audit_log()
             if e["key"]]  # fmt: skip
    assert trail == [("sre-ana", "deadletter_purge", "cancelled"),
                     ("sre-ana", "deadletter_requeue", "pool fixed")]  # fmt: skip


def test_a_retried_dead_letter_is_requeued_by_the_id_deadletters_shows(
    api: Api, live: LocalStack, own_runtime: None
) -> None:
    """Dramatiq gives each retry a fresh Redis id; the dead-letter stream and the logs show
    the message's own id. `effectq requeue` took only the Redis id: a message that died
    after its retries could not be named at all (not_found)."""
    [(key, message_id)] = _dead(api, live, 1)
    code, out, err = cli(live, "requeue", message_id, "--actor", "sre", "--reason", "INC-8",
                         "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["requeued"] == [message_id]
    assert wait_states(runtime.ledger(), [key], timeout=60)[key].state is State.DONE
    assert live.stats()["executions"] == {key: 1}
