"""Replay once a DONE record keeps no request (issue 39): a record that settles DONE drops
its stored request (the raw arguments, recipients included, are not kept for the DONE
retention); replay from REVOKED / SUPERSEDED takes the original call from the operator,
checked against the effect's key and fingerprint. Real worker processes, the real ledger
and broker, the sandbox provider with its own idempotency off, so its execution count is
the only witness. A record written with its request (before this release) still replays
without the call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dedupe import OperatorError, State, idempotency_key
from tests.support.ledgers import RETENTION_S, charge, poll
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import get_tool, runtime, submit, verbs
from workers.dev.local import LocalStack

ARGS = {"customer": "cus_rp", "amount": "25.00", "currency": "usd"}
ROOT = Path(__file__).resolve().parents[2]
OLD_SCRIPT = (Path(__file__).parent / "ledger_json_format.lua").read_text(encoding="utf-8")


def _revoked(stack: LocalStack, scope: str) -> str:
    """A charge run once by a worker, then revoked by an operator."""
    handle = submit("charge", scope=scope, **ARGS)
    handle.wait(30)
    verbs.revoke(handle.key, actor="sre", reason="refunded")
    wait_for(lambda: broker_messages(stack) == DRAINED, what="first run acked", timeout=60)
    return handle.key


def test_a_record_that_settles_done_keeps_no_request(live: LocalStack) -> None:
    ledger = runtime.ledger()
    committed = charge()
    claim = ledger.claim(committed, lease_s=30, holder="w/1")
    assert ledger._stored(committed.key)["q"]  # type: ignore[index]  # held while claimed
    ledger.commit(committed.key, claim.token, {"id": "ch_1"}, retention_s=RETENTION_S)
    # The operator's resolve to DONE drops it too.
    resolved = charge()
    ledger.claim(resolved, lease_s=0.05, holder="w/1")
    takeover = poll(
        lambda: ledger.takeover(resolved.key, lease_s=30, holder="r/1"), lambda t: t is not None
    )
    assert takeover is not None and takeover.request is not None  # the lookup still has it
    ledger.mark_unknown(resolved.key, takeover.token, reason="lookup unavailable")
    verbs.resolve(
        resolved.key, executed=True, receipt={"id": "ch_2"}, actor="sre", reason="bank ok"
    )
    for key in (committed.key, resolved.key):
        stored = ledger._stored(key)
        assert stored is not None and stored["s"] == "DONE" and "q" not in stored, stored
        record = ledger.get(key)
        assert record is not None and record.request is None and record.receipt is not None
    # A FAILED record is not DONE: it keeps its request, and replay sends it as before.
    failed = charge()
    claim = ledger.claim(failed, lease_s=30, holder="w/1")
    ledger.fail(failed.key, claim.token, reason="declined", retention_s=RETENTION_S)
    record = ledger.get(failed.key)
    assert record is not None and record.state is State.FAILED
    assert record.request == {
        "scope": failed.scope,
        "action": failed.action,
        "args": dict(failed.args),
    }


def test_replay_of_a_revoked_effect_without_the_call_is_refused_naming_what_to_pass(
    fenceless: LocalStack,
) -> None:
    fenceless.start_workers(processes=1, threads=2)
    key = _revoked(fenceless, "order-rp-bare")
    with pytest.raises(OperatorError) as info:
        verbs.replay(key, actor="sre", reason="charge again")
    message = info.value.message
    assert "keeps no request" in message and "--scope, --action and --arg" in message
    assert "\n" not in message
    [refusal, _] = runtime.ledger().audit_log()[:2]
    assert (refusal["action"], refusal["outcome"]) == ("replay", f"refused: {message}")
    assert broker_messages(fenceless) == DRAINED
    assert fenceless.stats()["executions"] == {key: 1}


def test_replay_with_the_original_call_runs_it_once_more(fenceless: LocalStack) -> None:
    fenceless.start_workers(processes=1, threads=2)
    key = _revoked(fenceless, "order-rp-call")
    # Free content may differ (none for charge); the bound values must be the recorded ones.
    document = verbs.replay(
        key, actor="sre", reason="charge again", scope="order-rp-call", args=dict(ARGS)
    )
    assert document == {"key": key, "status": "enqueued"}
    ledger = runtime.ledger()
    [again] = wait_states(ledger, [key], timeout=60).values()
    assert again is not None and again.state is State.DONE and again.generation == 1
    assert again.request is None
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="replay acked", timeout=60)
    stats = fenceless.stats()
    assert stats["executions"] == {key: 1, idempotency_key(key, 1): 1}
    # DONE again: a second replay is refused by the state table, nothing more runs.
    with pytest.raises(Exception, match="replay refused: effect is DONE"):
        verbs.replay(key, actor="sre", reason="twice", scope="order-rp-call", args=dict(ARGS))
    assert fenceless.stats()["total"] == 2


def test_replay_with_another_request_is_refused_as_a_conflict(live: LocalStack) -> None:
    ledger = runtime.ledger()
    effect = get_tool("charge").derive("order-rp-other", ARGS)
    claim = ledger.claim(effect, lease_s=30, holder="w/1")
    ledger.commit(effect.key, claim.token, {"id": "ch_o"}, retention_s=RETENTION_S)
    verbs.supersede(effect.key, actor="sre", reason="new terms")
    other_amount = {**ARGS, "amount": "99.17"}
    with pytest.raises(OperatorError, match="conflict: the call given has other bound") as info:
        verbs.replay(effect.key, actor="sre", reason="x", scope="order-rp-other", args=other_amount)
    assert "99.17" not in info.value.message
    with pytest.raises(OperatorError, match="derives another key") as info:
        verbs.replay(effect.key, actor="sre", reason="x", scope="order-rp-elsewhere", args=ARGS)
    assert "order-rp-elsewhere" not in info.value.message
    with pytest.raises(OperatorError, match="has no scope"):
        verbs.replay(effect.key, actor="sre", reason="x", args=ARGS)
    outcomes = [e["outcome"] for e in ledger.audit_log()[:3]]
    assert all(o.startswith("refused: replay refused") for o in outcomes), outcomes
    assert broker_messages(live) == DRAINED
    record = ledger.get(effect.key)
    assert record is not None and record.state is State.SUPERSEDED


def _cli(stack: LocalStack, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers", *argv], cwd=ROOT, env=stack.env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_cli_replays_with_the_call_as_submit_takes_it(live: LocalStack) -> None:
    ledger = runtime.ledger()
    effect = get_tool("charge").derive("order-rp-cli", ARGS)
    claim = ledger.claim(effect, lease_s=30, holder="w/1")
    ledger.commit(effect.key, claim.token, {"id": "ch_c"}, retention_s=RETENTION_S)
    verbs.revoke(effect.key, actor="sre", reason="refunded")
    words = ["replay", effect.key, "--actor", "sre", "--reason", "again"]
    bare = _cli(live, *words)
    assert bare.returncode == 2 and bare.stdout == ""
    assert bare.stderr.strip().count("\n") == 0 and "--scope" in bare.stderr
    call = ["--scope", "order-rp-cli", "--arg", "customer=cus_rp", "--arg", "currency=usd"]
    other = _cli(live, *words, *call, "--arg", "amount=99.17")
    assert other.returncode == 2 and "conflict" in other.stderr and "99.17" not in other.stderr
    bad = _cli(live, *words, *call, "--arg", "amount:={nope")
    assert bad.returncode == 2 and "nope" not in bad.stderr
    ok = _cli(live, *words, *call, "--arg", "amount=25.00", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"key": effect.key, "status": "enqueued"}
    assert broker_messages(live)["live"] == 1


def test_an_old_record_with_its_request_replays_without_the_call(fenceless: LocalStack) -> None:
    # A DONE record written with its request (every release before this one): the JSON
    # format's frozen script writes one, as a previous release's worker left it.
    ledger = runtime.ledger()
    effect = get_tool("charge").derive("order-rp-old", ARGS)
    old = ledger.client.register_script(OLD_SCRIPT)
    keys = ledger._keys(effect.key)
    reply = old(keys=keys, args=["claim", effect.key, effect.fingerprint, effect.tool, 30_000,
                                 "old/1", ledger.request_text(effect), "", 0])  # fmt: skip
    assert reply[0] == "acquired", reply
    done = old(keys=keys, args=["commit", effect.key, reply[1], '{"id":"ch_old"}', "",
                                int(RETENTION_S * 1000), "commit"])  # fmt: skip
    assert done[0] == "ok", done
    verbs.revoke(effect.key, actor="sre", reason="refunded")
    record = ledger.get(effect.key)
    assert record is not None and record.request is not None  # revoke leaves it as it was
    fenceless.start_workers(processes=1, threads=2)
    assert verbs.replay(effect.key, actor="sre", reason="again")["status"] == "enqueued"
    [again] = wait_states(ledger, [effect.key], timeout=60).values()
    assert again is not None and again.state is State.DONE and again.generation == 1
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="replay acked", timeout=60)
    assert fenceless.stats()["executions"] == {idempotency_key(effect.key, 1): 1}
