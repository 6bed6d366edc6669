"""The on-call's controls, live (issue 41): real `effectq worker` pools on redis-server, the
real sandbox provider over HTTP, and the CLI in this process.

A paused tool's (or queue's) messages wait in the delay queue: the provider executes nothing,
no claim is taken, nothing is dead-lettered and no retry is spent; after resume each runs once.
A tool's declared rate and concurrency hold across two worker pools, counted at the provider
and in the tool body."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from tests.support import limited_tools
from tests.support.stack import broker_client, broker_messages, wait_for, wait_states
from workers import runtime, submit
from workers.cli import app
from workers.dev.local import LocalStack
from workers.dev.ports import free_port

TOOLS = "tests.support.limited_tools"


@pytest.fixture
def own_runtime() -> Iterator[None]:
    """The acting verbs install a runtime of their own in this process: put the session's
    back afterwards."""
    previous = runtime.current()
    yield
    runtime.install(previous)


def cli(live: LocalStack, *argv: str) -> Any:
    result = CliRunner().invoke(app, [*argv, "--json"], env=live.env(EFFECTQ_TOOLS=TOOLS))
    assert result.exit_code == 0, (argv, result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def held_back(live: LocalStack, queue: str = "effectq") -> dict[str, dict[str, Any]]:
    """The delay queue's messages by message id: their options (retries, deferrals)."""
    bodies = broker_client(live).hvals(f"dramatiq:{queue}.DQ.msgs")
    messages = [json.loads(body) for body in bodies]
    return {m["message_id"]: m["options"] for m in messages}


def audit(live: LocalStack) -> list[dict[str, str]]:
    entries = cli(live, "audit", "--limit", "100")["audit"]
    return [e for e in entries if e["action"] in ("pause", "resume")]


def _submit_charges(n: int, prefix: str) -> list[str]:
    return [submit("charge", scope=f"{prefix}-{i}", customer=f"c{i}", amount="3.00",
                   currency="eur").key for i in range(n)]  # fmt: skip


def _assert_held_then_run(live: LocalStack, keys: list[str]) -> None:
    # Every message was looked at and held back at least twice: workers are consuming.
    wait_for(
        lambda: len(held := held_back(live)) == len(keys)
        and all(o.get("effectq_deferrals", 0) >= 2 for o in held.values()),
        timeout=60, what="every message held back twice",
    )  # fmt: skip
    held = held_back(live)
    assert all(o.get("retries", 0) == 0 for o in held.values()), held  # no retry spent
    assert live.stats()["total"] == 0  # the provider executed nothing
    ledger = runtime.ledger()
    assert all(ledger.get(k) is None for k in keys)  # no claim taken
    assert broker_client(live).hlen("dramatiq:effectq.XQ.msgs") == 0  # nothing dead
    assert cli(live, "deadletters")["dead_letters"] == []


def test_a_paused_tool_holds_its_messages_until_resume_then_each_runs_once(
    live: LocalStack, own_runtime: None
) -> None:
    paused = cli(live, "pause", "--tool", "charge", "--actor", "sre",
                 "--reason", "provider outage")  # fmt: skip
    assert paused == {**paused, "kind": "tool", "name": "charge", "paused": True, "changed": True}
    shown = cli(live, "controls")
    assert [(p["kind"], p["name"], p["actor"]) for p in shown["paused"]] == [
        ("tool", "charge", "sre")
    ]
    assert {t["tool"]: t["paused"] for t in shown["tools"]}["charge"] is True
    live.start_workers(1, 4, EFFECTQ_TOOLS=TOOLS)
    keys = _submit_charges(4, "paused")
    _assert_held_then_run(live, keys)

    resumed = cli(live, "resume", "--tool", "charge", "--actor", "sre",
                  "--reason", "provider back")  # fmt: skip
    assert resumed["paused"] is False and resumed["changed"] is True
    wait_states(runtime.ledger(), keys, timeout=60)
    executions = live.stats()["executions"]
    assert len(executions) == len(keys) and set(executions.values()) == {1}
    assert cli(live, "controls")["paused"] == []
    entries = audit(live)
    assert [(e["action"], e["actor"], e["reason"], e["outcome"]) for e in entries] == [
        ("resume", "sre", "provider back", "ok: tool charge resumed"),
        ("pause", "sre", "provider outage", "ok: tool charge paused"),
    ]


def _deferred(port: int, tool: str, cause: str) -> float:
    """``effectq_deferred_total{tool, cause}`` as the pool serves it."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "effectq_deferred_total"
        and sample.labels == {"tool": tool, "cause": cause}
    )


def deferred_paused(port: int) -> float:
    return _deferred(port, "charge", "paused")


def test_a_paused_tool_waits_on_any_broker_counted_in_its_metric(
    live: LocalStack, own_runtime: None
) -> None:
    """Broker-agnostic (tests/rabbitmq runs it on RabbitMQ): the pool's own metric shows
    every message held back twice while the provider executes nothing."""
    cli(live, "pause", "--tool", "charge", "--actor", "sre", "--reason", "outage")
    port = free_port()
    live.start_workers(1, 4, EFFECTQ_TOOLS=TOOLS, EFFECTQ_METRICS_PORT=str(port))
    wait_for(lambda: _serving(port), timeout=30, what="the pool's metrics endpoint")
    assert deferred_paused(port) == 0  # born at 0
    keys = _submit_charges(3, "any-broker")
    wait_for(lambda: deferred_paused(port) >= 6, timeout=60, what="each held back twice")
    assert live.stats()["total"] == 0
    assert all(runtime.ledger().get(k) is None for k in keys)
    assert broker_messages(live)["dead"] == 0
    cli(live, "resume", "--tool", "charge", "--actor", "sre", "--reason", "back")
    wait_states(runtime.ledger(), keys, timeout=90)
    assert sorted(live.stats()["executions"].values()) == [1, 1, 1]


def _serving(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_paused_queue_holds_every_tool_on_it_until_resume(
    live: LocalStack, own_runtime: None
) -> None:
    cli(live, "pause", "--queue", "effectq", "--actor", "sre", "--reason", "upgrade")
    live.start_workers(1, 4, EFFECTQ_TOOLS=TOOLS)
    value = submit("set_value", scope="queue-op", target="t1", value="v").key
    keys = [*_submit_charges(2, "queue"), value]
    _assert_held_then_run(live, keys)
    cli(live, "resume", "--queue", "effectq", "--actor", "sre", "--reason", "upgraded")
    wait_states(runtime.ledger(), keys, timeout=60)
    assert set(live.stats()["executions"].values()) == {1}
    assert [e["outcome"] for e in audit(live)] == [
        "ok: queue effectq resumed", "ok: queue effectq paused",
    ]  # fmt: skip


def test_a_declared_rate_holds_across_two_worker_pools_under_load(
    live: LocalStack, own_runtime: None
) -> None:
    live.start_workers(1, 8, EFFECTQ_TOOLS=TOOLS)
    live.start_workers(1, 8, EFFECTQ_TOOLS=TOOLS)
    keys = [limited_tools.rated_set.derive(f"rate-{i}", {"target": f"t{i}"}).key
            for i in range(40)]  # fmt: skip
    for i in range(40):
        submit("rated_set", scope=f"rate-{i}", target=f"t{i}")
    wait_states(runtime.ledger(), keys, timeout=120)
    log = live.sandbox.executions()
    assert len(log) == 40  # each once
    per_second = Counter(int(e["created_at"]) for e in log)
    # Admissions are capped per second and spaced a bucket apart (200 ms at 5/s); a call
    # admitted at a second's end that reaches the provider after it counts in the next.
    assert max(per_second.values()) <= limited_tools.RATE + 1, sorted(per_second.items())
    first, last = min(per_second), max(per_second)
    for start in range(first, last + 1):
        window = sum(per_second[s] for s in range(start, start + 5))
        assert window <= 5 * limited_tools.RATE + 1, sorted(per_second.items())
    assert last - first >= 40 // limited_tools.RATE - 1  # it did have to wait
    assert broker_client(live).hlen("dramatiq:effectq.XQ.msgs") == 0


def test_a_declared_concurrency_holds_across_two_worker_pools(
    live: LocalStack, own_runtime: None, tmp_path: Path
) -> None:
    spans = tmp_path / "spans"
    live.sandbox.configure(latency_ms=150.0)
    env = {"EFFECTQ_TOOLS": TOOLS, "EFFECTQ_TEST_SPANS": str(spans)}
    live.start_workers(1, 8, **env)
    live.start_workers(1, 8, **env)
    keys = [limited_tools.narrow_set.derive(f"conc-{i}", {"target": f"t{i}"}).key
            for i in range(16)]  # fmt: skip
    for i in range(16):
        submit("narrow_set", scope=f"conc-{i}", target=f"t{i}")
    wait_states(runtime.ledger(), keys, timeout=120)
    calls = [tuple(map(float, line.split())) for line in spans.read_text().splitlines()]
    assert len(calls) == 16 and live.stats()["total"] == 16
    events = sorted([(start, 1) for start, _ in calls] + [(end, -1) for _, end in calls])
    running = peak = 0
    for _, step in events:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    assert peak == limited_tools.CONCURRENCY


def test_pause_state_is_in_the_ledgers_namespace(live: LocalStack, own_runtime: None) -> None:
    cli(live, "pause", "--tool", "rated_set", "--actor", "sre", "--reason", "r")
    client = redis.Redis.from_url(live.ledger_url, decode_responses=True)
    assert list(client.hgetall("effectq:paused")) == ["tool:rated_set"]


@pytest.mark.parametrize(
    "argv",
    [
        ["pause", "--actor", "sre", "--reason", "r"],  # neither
        ["pause", "--tool", "charge", "--queue", "effectq", "--actor", "sre", "--reason", "r"],
        ["pause", "--tool", "Sec<ret>", "--actor", "sre", "--reason", "r"],
        ["resume", "--queue", "Sec ret", "--actor", "sre", "--reason", "r"],
        ["pause", "--tool", "charge", "--reason", "r"],  # no actor
        ["pause", "--tool", "charge", "--actor", "sre", "--reason", " "],
        ["pause", "--tool", "secret_tool", "--actor", "sre", "--reason", "r"],  # undeclared
        ["resume", "--queue", "secret_queue", "--actor", "sre", "--reason", "r"],
    ],
)
def test_a_bad_pause_exits_2_in_one_line_that_never_echoes_the_value(
    live: LocalStack, own_runtime: None, argv: list[str]
) -> None:
    result = CliRunner().invoke(app, argv, env=live.env(EFFECTQ_TOOLS=TOOLS))
    assert result.exit_code == 2, (argv, result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Sec" not in result.stderr and "secret" not in result.stderr, result.stderr
    assert redis.Redis.from_url(live.ledger_url).hlen("effectq:paused") == 0


def test_a_slot_whose_holder_was_sigkilled_expires_by_itself(
    live: LocalStack, own_runtime: None
) -> None:
    """A worker SIGKILLed inside a call never gives its concurrency slot back; the slot is a
    key of its own with a TTL of the tool's time limit plus a minute (2 s + 60 s here), so
    it frees itself — a shared counter touched by every later call would not."""
    pool = live.start_workers(1, 2, EFFECTQ_TOOLS=TOOLS, EFFECTQ_FAILPOINTS="before_effect=kill")
    submit("single_set", scope="killed", target="t-killed")
    client = redis.Redis.from_url(live.ledger_url, decode_responses=True)
    slot = "{effectq:limit:single_set}:slot:0"
    wait_for(lambda: pool.poll() is not None or client.get(slot) == "1", timeout=30,
             what="the slot taken")  # fmt: skip
    live.stop_processes()  # the killed child's pool, and any restarted child
    assert client.get(slot) == "1"  # never given back
    left_ms = client.pttl(slot)
    assert 0 < left_ms <= 62_000
    # Meanwhile another call of the tool waits for it: held back, not run, not dead.
    port = free_port()
    live.start_workers(1, 2, EFFECTQ_TOOLS=TOOLS, EFFECTQ_METRICS_PORT=str(port))
    other = submit("single_set", scope="waiting", target="t-waiting").key
    wait_for(lambda: _serving(port) and _deferred(port, "single_set", "concurrency") >= 1,
             timeout=30, what="held back by the dead holder's slot")  # fmt: skip
    assert runtime.ledger().get(other) is None
    assert live.stats()["total"] == 0
    assert 0 < client.pttl(slot) < left_ms  # the waiters' tries do not extend it
