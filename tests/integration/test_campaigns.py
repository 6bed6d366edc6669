"""Campaign batches over real workers and the real sandbox: frozen plans, safe
re-submission, plan versions, and status from counters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dedupe import CampaignStore, ConflictError
from dedupe.errors import InvisibleCharacterError
from tests.support.stack import DRAINED, broker_messages, wait_for
from workers import get_tool, runtime
from workers.campaigns import campaign_status, submit_campaign
from workers.dev.local import LocalStack

TEMPLATE = {"subject": "Spring sale", "body": "Hello!"}


def _people(n: int, start: int = 0) -> list[str]:
    return [f"person{i}@example.com" for i in range(start, start + n)]


def _counts(**nonzero: int) -> dict[str, int]:
    return {"pending": 0, "done": 0, "failed": 0, "unknown": 0, "revoked": 0, **nonzero}


def _all_done(campaign_id: str, total: int) -> bool:
    return campaign_status(campaign_id)["counts"].get("done") == total


def test_pool_killed_mid_campaign_then_resubmitted_sends_each_recipient_once(
    live: LocalStack,
) -> None:
    live.sandbox.configure(provider_idempotency=False, latency_ms=30)
    report = submit_campaign("spring-1", "send_email", _people(100), TEMPLATE, action="notice")
    assert (report.recipients, report.sent) == (100, 100)
    pool = live.start_workers(1, 4)
    wait_for(lambda: live.stats()["total"] >= 40, what="~40 sent")
    os.killpg(pool.pid, signal.SIGKILL)  # the whole pool, supervisor included
    pool.wait()
    live.pools.remove(pool)
    done_before = campaign_status("spring-1")["counts"].get("done", 0)
    again = submit_campaign("spring-1", "send_email", _people(100), TEMPLATE, action="notice")
    assert again.skipped.get("done", 0) == done_before
    assert again.sent + sum(again.skipped.values()) == 100
    assert again.sent <= 100 - done_before
    live.start_workers(2, 4)
    live.start_reconciler()
    wait_for(lambda: _all_done("spring-1", 100), what="all DONE", timeout=90)
    wait_for(lambda: broker_messages(live) == DRAINED, what="drained", timeout=60)
    stats = live.stats()
    assert stats["total"] == 100 and set(stats["executions"].values()) == {1}
    status = campaign_status("spring-1", page_size=1000)
    assert status["counts"] == _counts(done=100)
    assert status["approved_but_never_sent"] == 0
    assert {r["state"] for r in status["recipients"]} == {"done"}


def test_reworded_resubmission_sends_nothing_new(live: LocalStack) -> None:
    live.start_workers(1, 4)
    submit_campaign("spring-2", "send_email", _people(10), TEMPLATE)
    wait_for(lambda: _all_done("spring-2", 10), what="sent")
    reworded = {"subject": "SPRING SALE!!", "body": "Hi there"}
    again = submit_campaign("spring-2", "send_email", _people(10), reworded)
    assert again.sent == 0 and again.skipped == {"done": 10}
    assert live.stats()["total"] == 10
    key = campaign_status("spring-2")["recipients"][0]["key"]
    receipt = runtime.ledger().get(key).receipt  # type: ignore[union-attr]
    assert receipt is not None and receipt["body"]["subject"] == "Spring sale"


def test_spellings_of_one_address_collapse_to_one_effect(live: LocalStack) -> None:
    report = submit_campaign(
        "spring-3", "send_email", ["Anna@Example.com ", "anna@example.com", "bob@example.com"],
        TEMPLATE,
    )  # fmt: skip
    assert (report.recipients, report.collapsed, report.sent) == (2, 1, 2)


def test_invalid_recipients_are_rejected_one_by_one(live: LocalStack) -> None:
    report = submit_campaign("spring-4", "send_email", ["ok@example.com", "nope", 7], TEMPLATE)
    assert report.recipients == 1
    assert [r["index"] for r in report.rejected] == [1, 2]
    assert "not an email address" in report.rejected[0]["reason"]
    assert all("nope" not in r["reason"] for r in report.rejected)


def test_a_recipient_or_campaign_id_with_an_invisible_character_is_refused(
    live: LocalStack,
) -> None:
    # "ana" and "ana" + U+200B would be two effects for one mailbox: each is refused, by
    # index, never sent and never named.
    people = ["ana@example.com", "ana\u200b@example.com", "ana@exam\ufe0fple.com",
              "bob@example.com", "\u3164bob@example.com"]  # fmt: skip
    report = submit_campaign("spring-invisible", "send_email", people, TEMPLATE)
    assert (report.recipients, report.sent) == (2, 2)
    assert [r["index"] for r in report.rejected] == [1, 2, 4]
    assert all("holds a control, format, invisible" in r["reason"] for r in report.rejected)
    assert all("ana" not in r["reason"] and "bob" not in r["reason"] for r in report.rejected)
    sent = broker_messages(live)["live"]
    with pytest.raises(InvisibleCharacterError):
        submit_campaign("spring\u200b-invisible", "send_email", people[:1], TEMPLATE)
    assert broker_messages(live)["live"] == sent
    with pytest.raises(InvisibleCharacterError):
        campaign_status("spring-\u2060invisible")


def test_changed_list_is_a_conflict_unless_a_new_plan_version(live: LocalStack) -> None:
    live.start_workers(1, 4)
    submit_campaign("spring-5", "send_email", _people(10), TEMPLATE)
    wait_for(lambda: _all_done("spring-5", 10), what="v1 sent")
    changed = _people(8) + _people(3, start=100)  # two removed, three added
    with pytest.raises(ConflictError, match=r"changed recipient list .* \(\+3 -2 recipients\)"):
        submit_campaign("spring-5", "send_email", changed, TEMPLATE)
    v2 = submit_campaign("spring-5", "send_email", changed, TEMPLATE, plan_version=2)
    assert (v2.plan_version, v2.added, v2.removed, v2.sent) == (2, 3, 2, 3)
    assert v2.skipped == {"done": 8}
    wait_for(lambda: live.stats()["total"] == 13, what="only the added sent")
    status = campaign_status("spring-5", page_size=100)
    assert status["plan_version"] == 2 and status["recipients_total"] == 11
    assert len(status["recipients"]) == 11


def test_changed_bound_arguments_are_a_conflict(live: LocalStack) -> None:
    submit_campaign("order-batch", "charge", ["c1", "c2"], {"amount": "5.00", "currency": "eur"})
    with pytest.raises(ConflictError, match="changed bound arguments"):
        submit_campaign(
            "order-batch", "charge", ["c1", "c2"], {"amount": "6.00", "currency": "eur"}
        )


def test_a_100k_campaign_is_frozen_fanned_out_and_reported_without_a_scan(
    live: LocalStack,
) -> None:
    started = time.monotonic()
    report = submit_campaign("big-1", "send_email", _people(100_000), TEMPLATE)
    fanned = time.monotonic() - started
    assert (report.recipients, report.sent) == (100_000, 100_000)
    assert CampaignStore(runtime.ledger()).sent_count("big-1", 1) == 100_000
    assert broker_messages(live)["live"] == 100_000
    started = time.monotonic()
    status = campaign_status("big-1", page_size=50)
    answered = time.monotonic() - started
    assert status["counts"] == _counts(pending=100_000)
    assert status["approved_but_never_sent"] == 0 and len(status["recipients"]) >= 50
    print(f"100k fan-out {fanned:.1f}s, status {answered * 1000:.0f} ms")


def test_every_batch_of_a_fan_out_confirms_its_markers_and_gives_back_its_connections(
    live: LocalStack,
) -> None:
    # Three batches: a batch's confirms are read only after the next batch is built, the
    # last one's after the loop. An unread or unsent confirm would leave a reservation.
    ledger = runtime.ledger()
    pool = ledger.client.connection_pool
    in_use = set(pool._in_use_connections)  # type: ignore[attr-defined]
    report = submit_campaign("spring-confirm", "send_email", _people(2500), TEMPLATE)
    assert report.sent == 2500
    rows = campaign_status("spring-confirm", page_size=3000)["recipients"]
    markers = ledger.client.mget([ledger._pending_key(row["key"]) for row in rows])
    assert len(markers) == 2500 and all(m is not None for m in markers)
    reserved = [m for m in markers if str(m).endswith("|r")]
    assert not reserved, f"{len(reserved)} reservations never confirmed"
    assert pool._in_use_connections == in_use  # type: ignore[attr-defined]
    again = submit_campaign("spring-confirm", "send_email", _people(2500), TEMPLATE)
    assert (again.sent, again.skipped) == (2500, {})  # force: a campaign sends again


def _cli(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "workers", *args]
    return subprocess.run(command, env=stack.env(), capture_output=True, text=True, timeout=60)


def test_campaign_cli_submit_and_status(live: LocalStack, tmp_path: Path) -> None:
    path = tmp_path / "campaign.json"
    path.write_text(json.dumps({"campaign_id": "cli-1", "tool": "send_email",
                                "args": TEMPLATE, "recipients": _people(5)}))  # fmt: skip
    done = _cli(live, "campaign", "submit", str(path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sent"] == 5
    document = json.loads(_cli(live, "campaign", "status", "cli-1", "--json").stdout)
    assert document["counts"] == _counts(pending=5)
    assert {r["recipient"] for r in document["recipients"]} == set(_people(5))
    bad = _cli(live, "campaign", "status", "nope")
    assert bad.returncode == 6 and "no campaign 'nope'" in bad.stderr  # 6: not found
    path.write_text(json.dumps({"campaign_id": "cli-1", "tool": "send_email",
                                "args": TEMPLATE, "recipients": _people(6)}))  # fmt: skip
    changed = _cli(live, "campaign", "submit", str(path))  # same id, another list
    assert changed.returncode == 3, changed.stderr  # DESIGN §8: 3 is a conflict
    assert "changed recipient list" in changed.stderr


def test_a_new_plan_version_counts_only_its_own_recipients(live: LocalStack) -> None:
    # v1 runs to DONE; v2 drops one recipient and adds one, submitted with no worker
    # running: the carried-over DONE ones count done and were sent (under v1), the dropped
    # one counts nowhere, and the added one is pending.
    live.start_workers(1, 4)
    submit_campaign("spring-6", "send_email", _people(3), TEMPLATE)
    wait_for(lambda: _all_done("spring-6", 3), what="v1 sent")
    live.stop_processes()
    v2 = _people(2) + _people(1, start=100)
    report = submit_campaign("spring-6", "send_email", v2, TEMPLATE, plan_version=2)
    assert (report.sent, report.skipped, report.added, report.removed) == (1, {"done": 2}, 1, 1)
    status = campaign_status("spring-6")
    assert status["counts"] == _counts(done=2, pending=1)
    assert status["approved_but_never_sent"] == 0 and status["message"] is None
    assert sorted(r["state"] for r in status["recipients"]) == ["done", "done", "pending"]
    assert all(r["sent"] for r in status["recipients"])
    live.start_workers(1, 4)
    wait_for(lambda: _all_done("spring-6", 3), what="v2 sent")
    assert campaign_status("spring-6")["counts"] == _counts(done=3)
    assert live.stats()["total"] == 4


def test_one_campaign_id_in_nfc_and_nfd_spelling_is_one_plan(live: LocalStack) -> None:
    nfc, nfd = "caf\u00e9-1", "cafe\u0301-1"
    first = submit_campaign(nfc, "send_email", _people(3), TEMPLATE)
    with pytest.raises(ConflictError, match="changed recipient list"):
        submit_campaign(f" {nfd} ", "send_email", _people(4), TEMPLATE)
    again = submit_campaign(nfd, "send_email", _people(3), TEMPLATE)
    assert again.campaign_id == first.campaign_id == nfc and again.plan_version == 1
    status = campaign_status(nfd)
    assert status["campaign_id"] == nfc and status["recipients_total"] == 3
    assert status["counts"] == _counts(pending=3)


def test_concurrent_first_submissions_of_one_campaign_never_merge_their_plans(
    live: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both submissions read "no approved plan" before either approves its own.
    both_read = threading.Barrier(2, timeout=30)
    read = CampaignStore.meta

    waited: set[str] = set()

    def meta_then_wait(self: CampaignStore, campaign_id: str) -> Any:
        found = read(self, campaign_id)
        name = threading.current_thread().name
        if name.startswith("race-") and name not in waited:
            waited.add(name)
            both_read.wait()
        return found

    monkeypatch.setattr(CampaignStore, "meta", meta_then_wait)
    lists = {"race-a": _people(3), "race-b": _people(3, start=50)}
    outcomes: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            outcomes[name] = submit_campaign("spring-7", "send_email", lists[name], TEMPLATE)
        except ConflictError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=run, args=(n,), name=n) for n in lists]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    conflicts = [n for n, o in outcomes.items() if isinstance(o, ConflictError)]
    assert len(outcomes) == 2 and len(conflicts) == 1, outcomes
    (winner,) = set(lists) - set(conflicts)
    status = campaign_status("spring-7", page_size=100)
    assert status["recipients_total"] == 3
    assert {r["recipient"] for r in status["recipients"]} == set(lists[winner])
    assert broker_messages(live)["live"] == 3


def _request_bytes(scope: str, action: str, args: dict[str, Any]) -> int:
    """The size of the request a worker's claim stores (and bounds)."""
    request = {"scope": scope, "action": action, "args": args}
    text = json.dumps(request, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return len(text.encode())


def test_a_recipient_over_the_request_bound_is_rejected_at_submit(live: LocalStack) -> None:
    # The template brings each request close to the bound the claim enforces; the longer
    # address takes its request over it.
    short, long = "a@example.com", "x" * 60 + "@example.com"
    limit = runtime.ledger().max_request_bytes
    fill = limit - _request_bytes("spring-8", "receipt", {"recipient": short, "body": ""}) - 10
    template = {"body": "b" * fill}
    report = submit_campaign("spring-8", "send_email", [short, long], template)
    assert (report.recipients, report.sent) == (1, 1)
    assert [r["index"] for r in report.rejected] == [1]
    assert "bound" in report.rejected[0]["reason"] and "xxxx" not in report.rejected[0]["reason"]
    assert broker_messages(live)["live"] == 1


def test_plans_sent_sets_and_meta_expire_with_the_tools_retention(live: LocalStack) -> None:
    submit_campaign("spring-9", "send_email", _people(2), TEMPLATE)
    submit_campaign("spring-9", "send_email", _people(3), TEMPLATE, plan_version=2)
    client = runtime.ledger().client
    names = list(client.scan_iter(match="effectq:campaign:*"))
    assert len(names) >= 4  # meta, two plans, two sent sets
    retention_s = get_tool("send_email").spec.retention_s
    for name in names:
        ttl_s = client.pttl(name) / 1000
        assert retention_s <= ttl_s <= 2 * retention_s + 60, (name, ttl_s)


def _campaign_keys(campaign_id: str) -> list[str]:
    from dedupe import campaign_tag

    client = runtime.ledger().client
    return list(client.scan_iter(match=f"effectq:campaign:{campaign_tag(campaign_id)}*"))


def test_a_list_that_breaks_while_planning_sends_nothing_and_leaves_no_plan(
    live: LocalStack,
) -> None:
    def recipients() -> Any:  # a file that turns out unreadable past its 2,500th row
        yield from _people(2500)
        raise OSError("disk gone")

    with pytest.raises(OSError):
        submit_campaign("spring-10", "send_email", recipients(), TEMPLATE)
    assert broker_messages(live)["live"] == 0
    assert _campaign_keys("spring-10") == []  # no meta, no staged rows
    with pytest.raises(Exception, match="no campaign"):
        campaign_status("spring-10")


def test_a_plan_frozen_before_rows_ids_is_adopted_compared_and_versioned(
    live: LocalStack,
) -> None:
    # A plan as the earlier store froze it: rows under version + sorted-key fingerprint.
    import hashlib

    from dedupe import CampaignPlan

    tool = get_tool("send_email")
    effects = {tool.derive("spring-11", {"recipient": p}, None).key: p for p in _people(3)}
    legacy = CampaignPlan(
        "spring-11", "send_email", "receipt", 1, 3, _args_fingerprint(tool),
        hashlib.sha256("\n".join(sorted(effects)).encode()).hexdigest(),
    )  # fmt: skip
    store = CampaignStore(runtime.ledger())
    assert store.freeze(legacy, effects, ttl_s=3600)
    again = submit_campaign("spring-11", "send_email", _people(3), TEMPLATE)
    assert (again.plan_version, again.recipients, again.sent) == (1, 3, 3)
    assert store.meta("spring-11") == legacy  # adopted as it was, not re-approved
    with pytest.raises(ConflictError, match=r"\(\+1 -0 recipients\)"):
        submit_campaign("spring-11", "send_email", _people(4), TEMPLATE)
    v2 = submit_campaign("spring-11", "send_email", _people(4)[1:], TEMPLATE, plan_version=2)
    # The two kept are still pending (no worker runs): sent again with the added one.
    assert (v2.plan_version, v2.added, v2.removed, v2.sent) == (2, 1, 1, 3)
    status = campaign_status("spring-11", page_size=100)
    assert status["recipients_total"] == 3 and status["approved_but_never_sent"] == 0


def _args_fingerprint(tool: Any) -> str:
    """The args fingerprint submit_campaign computes for send_email (no bound field but
    the recipient)."""
    from workers.campaigns.plan import _sha

    return _sha({"tool": tool.name, "action": "receipt", "bound": {}})


def test_rejections_past_the_listed_thousand_are_counted(live: LocalStack) -> None:
    report = submit_campaign("spring-12", "send_email", ["nope"] * 1200 + _people(1), TEMPLATE)
    assert (report.recipients, report.sent, report.rejected_total) == (1, 1, 1200)
    assert len(report.rejected) == 1000 and report.rejected[-1]["index"] == 999


def test_cli_streams_a_file_whose_recipients_come_before_its_header(
    live: LocalStack, tmp_path: Path
) -> None:
    path = tmp_path / "campaign.json"
    recipients = json.dumps([*_people(2500), "Person0@Example.com"])
    path.write_text(f'{{"recipients": {recipients}, "tool": "send_email", '
                    f'"campaign_id": "cli-2", "args": {json.dumps(TEMPLATE)}}}')  # fmt: skip
    done = _cli(live, "campaign", "submit", str(path), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["recipients"], report["collapsed"], report["sent"]) == (2500, 1, 2500)
    for text, reason in (
        ('{"campaign_id": "c", "tool": "send_email", "recipients": ["a@b.c"', "not JSON"),
        ('{"campaign_id": "c", "tool": "send_email", "recipients": []}', "recipients"),
        ('{"campaign_id": "c", "tool": "send_email", "recipients": "a@b.c"}', "recipients"),
        ('{"campaign_id": "c", "tool": "send_email"}', "recipients"),
        ('{"campaign_id": "c", "campaign_id": "d", "tool": "t", "recipients": [1]}', "twice"),
        ('{"campaign_id": "c", "tool": "send_email", "recipients": [1], "x": 1}', "x"),
        ('["a@b.c"]', "campaign file"),
    ):
        path.write_text(text)
        bad = _cli(live, "campaign", "submit", str(path))
        assert bad.returncode == 2 and reason in bad.stderr, (text, bad.stderr)
    assert broker_messages(live)["live"] == 2500
