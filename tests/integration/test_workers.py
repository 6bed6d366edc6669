"""The worker path end to end: real `dramatiq` worker processes (through `effectq worker`),
the real ledger and broker on redis-server, the real sandbox provider over HTTP. Every
assertion about execution is made on the provider's own count."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from dedupe import (
    Claim,
    ClaimOutcome,
    Ledger,
    LedgerError,
    LedgerUnavailableError,
    NotExecutedError,
    State,
    Write,
)
from tests.support.stack import DRAINED, broker_client, broker_messages, wait_for, wait_states
from workers import EffectCall, Envelope, RetryLater, Status, effect_tool, get_tool, runtime, submit
from workers.dev.local import LocalStack
from workers.dev.ports import free_port
from workers.dev.redis_server import RedisServer, default_redis_binary
from workers.settings import Settings
from workers.tool.envelope import SUBMITTED_MS
from workers.tool.retry import retry_delay_ms, retry_when


def _calls(n: int) -> list[tuple[str, str, dict[str, Any]]]:
    out: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(n):
        if i % 2:
            out.append(("send_email", f"evt-{i}", {"recipient": f"u{i}@example.com"}))
        else:
            out.append(("charge", f"order-{i}", {"customer": f"c{i}", "amount": "5.00",
                                                 "currency": "eur"}))  # fmt: skip
    return out


def test_duplicate_submissions_and_redeliveries_execute_each_effect_once(
    live: LocalStack,
) -> None:
    # The provider's own idempotency is off: only effectq stands between a retry and a
    # second execution.
    live.sandbox.configure(provider_idempotency=False)
    rng = random.Random(2000)
    unique = _calls(1400)
    submissions = unique + [rng.choice(unique) for _ in range(600)]  # 2,000, 30 % repeats
    rng.shuffle(submissions)
    live.start_workers(processes=2, threads=8)
    statuses: Counter[str] = Counter()
    keys: set[str] = set()
    forced = 0
    for n, (tool, scope, args) in enumerate(submissions):
        handle = submit(tool, scope=scope, **args)
        statuses[handle.status.value] += 1
        keys.add(handle.key)
        if n % 10 == 0:
            # A forced redelivery: the same message body enqueued again behind the ledger's
            # back, as a broker does after a worker's heartbeat is lost.
            effect = get_tool(tool).derive(scope, args)
            get_tool(tool).actor.send(Envelope.of(effect).model_dump())
            forced += 1
    assert statuses["enqueued"] == len(keys) == 1400
    assert statuses["enqueued"] + statuses["pending"] + statuses["done"] == 2000
    ledger = runtime.ledger()
    wait_states(ledger, keys, timeout=120)
    drained = {"live": 0, "delayed": 0, "dead": 0}
    wait_for(lambda: broker_messages(live) == drained, what="queue drained", timeout=60)
    stats = live.stats()
    assert stats["total"] == 1400
    assert set(stats["executions"]) == keys
    assert set(stats["executions"].values()) == {1}
    counts = ledger.counts()
    suppressed_submit = sum(v for (k, _), v in counts.items() if k == "dup_submit")
    suppressed_claim = sum(v for (k, _), v in counts.items() if k == "dup_claim")
    assert suppressed_submit == 600
    # Each forced redelivery (or its original, whichever came second) reached a worker and
    # was suppressed there, at once or after retrying while the first was in flight.
    assert suppressed_claim == forced


def test_changed_bound_field_under_the_same_key_is_dead_lettered_unexecuted(
    live: LocalStack,
) -> None:
    live.start_workers(processes=1, threads=2)
    handle = submit("charge", scope="order-77", customer="c1", amount="10.00", currency="usd")
    handle.wait(30)
    refused = submit("charge", scope="order-77", customer="c1", amount="99.00", currency="usd")
    assert refused.status is Status.CONFLICT  # refused at submit, not enqueued
    # The same change arriving straight on the queue is dead-lettered by the worker.
    tool = get_tool("charge")
    changed = tool.derive("order-77", {"customer": "c1", "amount": "99.00", "currency": "usd"})
    assert changed.key == handle.key
    tool.actor.send(Envelope.of(changed).model_dump())
    ledger = runtime.ledger()
    wait_for(lambda: ledger.dead_letters(), what="dead-letter record")
    [dead] = ledger.dead_letters()
    assert dead["key"] == handle.key and "bound fields differ" in dead["reason"]
    assert dead["reason"].startswith("ConflictError")
    assert live.stats()["executions"] == {handle.key: 1}
    assert broker_messages(live)["dead"] == 1


MALFORMED: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("charge", ("not an envelope",), {}, "exactly one envelope"),
    ("charge", ({"v": 1, "key": "x"},), {}, "invalid envelope"),
    ("charge", ({"v": 1, "key": "0" * 64, "scope": 7, "action": "default", "args": {}},), {},
     "scope: Input should be a valid string"),
    ("charge", ({"v": 1, "key": "0" * 64, "scope": "s", "action": "default",
                 "args": {"customer": "c", "amount": 1.5, "currency": "usd"}},), {}, "float"),
    ("charge", ({"v": 1, "key": "0" * 64, "scope": "s", "action": "default",
                 "args": {"customer": "c", "amount": "1", "currency": "usd"}},), {},
     "does not match its arguments"),
    ("charge", ({"v": 1, "key": "0" * 64, "scope": "s", "action": "default",
                 "args": {"customer": "c"}},), {}, "missing identity/bound arguments"),
    ("send_email", ({"v": 1, "key": "0" * 64, "scope": "s", "action": "receipt",
                     "args": {"recipient": "a@b.co", "body": "x" * 200_000}},), {},
     "over the 65536-byte bound"),
    ("send_email", (), {"recipient": "a@b.co"}, "exactly one envelope"),
    ("no_such_tool", ({},), {}, "unknown tool 'no_such_tool'"),
]  # fmt: skip


def test_malformed_messages_are_dead_lettered_with_a_reason_and_never_executed(
    live: LocalStack,
) -> None:
    live.start_workers(processes=1, threads=4)
    broker = runtime.broker()
    for actor_name, args, kwargs, _ in MALFORMED:
        broker.enqueue(
            dramatiq.Message(
                queue_name="effectq", actor_name=actor_name, args=args, kwargs=kwargs, options={}
            )
        )
    ledger = runtime.ledger()
    wait_for(lambda: len(ledger.dead_letters()) == len(MALFORMED), what="all dead-lettered")
    reasons = [d["reason"] for d in ledger.dead_letters()]
    for _, _, _, expected in MALFORMED:
        assert any(expected in reason for reason in reasons), (expected, reasons)
    assert live.stats()["total"] == 0
    assert broker_messages(live)["dead"] == len(MALFORMED)
    # The worker keeps serving.
    ok = submit("send_email", scope="after-garbage", recipient="z@example.com")
    assert ok.wait(30)["key"] == ok.key


def test_unknown_action_is_refused_at_submit() -> None:
    from dedupe import SpecError

    with pytest.raises(SpecError, match="action 'shout' is not declared"):
        submit("send_email", scope="s", action="shout", recipient="a@b.co")


def test_wait_returns_the_original_receipt_for_a_duplicate_of_an_in_flight_call(
    live: LocalStack,
) -> None:
    live.sandbox.configure(latency_ms=500)
    live.start_workers(processes=1, threads=2)
    first = submit("set_value", scope="op-1", target="acct-1", value=41)
    second = submit("set_value", scope="op-1", target="acct-1", value=41)
    assert (first.status, second.status) == (Status.ENQUEUED, Status.PENDING)
    assert second.wait(30) == first.wait(30)
    third = submit("set_value", scope="op-1", target="acct-1", value=41)
    assert third.status is Status.DONE and third.receipt == first.receipt
    record = runtime.ledger().get(first.key)
    assert record is not None and record.state is State.DONE and record.token == 1


def test_a_message_older_than_the_provider_window_never_executes(live: LocalStack) -> None:
    live.start_workers(processes=1, threads=2)
    done = submit("charge", scope="order-old-1", customer="c1", amount="3.00", currency="usd")
    done.wait(30)
    tool = get_tool("charge")
    two_days_ago = int((time.time() - 2 * 86400) * 1000)
    for scope in ("order-old-1", "order-old-2"):  # DONE already / never executed
        effect = tool.derive(scope, {"customer": "c1", "amount": "3.00", "currency": "usd"})
        runtime.broker().enqueue(
            dramatiq.Message(
                queue_name="effectq", actor_name="charge", args=(Envelope.of(effect).model_dump(),),
                kwargs={}, options={}, message_timestamp=two_days_ago,
            )
        )  # fmt: skip
    ledger = runtime.ledger()
    wait_for(lambda: broker_messages(live)["live"] == 0, what="both handled")
    [dead] = ledger.dead_letters()
    assert "past the provider's 86400s idempotency window; not executed" in dead["reason"]
    assert dead["key"] == tool.derive("order-old-2", {"customer": "c1", "amount": "3.00",
                                                      "currency": "usd"}).key  # fmt: skip
    assert live.stats()["executions"] == {done.key: 1}


def test_a_fresh_submission_from_a_producer_whose_clock_is_a_day_behind_runs(
    live: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider window is judged on the ledger's clock (issue 37, item 4): a producer
    host 25 h behind stamps its messages 25 h in the past, which says nothing of their age."""
    live.start_workers(processes=1, threads=2)
    real = time.time
    with monkeypatch.context() as skewed:
        skewed.setattr(time, "time", lambda: real() - 25 * 3600)
        handle = submit("charge", scope="order-skew", customer="c9", amount="4.00", currency="usd")
    assert handle.status is Status.ENQUEUED
    handle.wait(30)
    assert live.stats()["executions"] == {handle.key: 1}
    assert runtime.ledger().dead_letters() == []


def test_a_message_the_ledger_stamped_past_the_window_never_runs_whatever_its_clock(
    live: LocalStack,
) -> None:
    """The opposite skew: a producer clock ahead makes an old message look fresh. The
    ledger's stamp at submit decides: past the window it is dead-lettered, never run."""
    live.start_workers(processes=1, threads=2)
    effect = get_tool("charge").derive(
        "order-skew-old", {"customer": "c1", "amount": "3.00", "currency": "usd"}
    )
    ledger = runtime.ledger()
    stamped = ledger.server_time_ms() - 2 * 86_400_000
    runtime.broker().enqueue(
        dramatiq.Message(
            queue_name="effectq", actor_name="charge", args=(Envelope.of(effect).model_dump(),),
            kwargs={}, options={SUBMITTED_MS: stamped},
            message_timestamp=int(time.time() * 1000),
        )
    )  # fmt: skip
    wait_for(lambda: broker_messages(live)["live"] == 0, what="handled")
    [dead] = ledger.dead_letters()
    assert dead["key"] == effect.key and "idempotency window" in dead["reason"]
    assert "ledger time" in dead["reason"]
    assert live.stats()["executions"] == {}
    assert ledger.get(effect.key) is None


# -- a ledger that cannot answer never kills a message (issue 15, items 6 and 14) ----------


@pytest.fixture
def unbuildable_ledger(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Point this process's runtime at another ledger URL, built lazily on first use."""

    previous = runtime.current()

    def point(url: str) -> None:
        monkeypatch.setenv("EFFECTQ_REDIS_URL", url)
        runtime.install(runtime.Runtime(Settings(), broker=previous.broker))

    yield point
    monkeypatch.undo()
    runtime.install(previous)


def _envelope(scope: str) -> dict[str, Any]:
    effect = get_tool("charge").derive(scope, {"customer": "c1", "amount": "1", "currency": "usd"})
    return Envelope.of(effect).model_dump()


def test_a_ledger_that_cannot_be_built_at_first_use_leaves_the_message_alive(
    live: LocalStack, unbuildable_ledger: Callable[[str], None], tmp_path: Path
) -> None:
    tool = get_tool("charge")
    with RedisServer(default_redis_binary(), tmp_path / "volatile", aof=False) as volatile:
        for url in (f"redis://127.0.0.1:{free_port()}/0", volatile.url, "redis://[bad"):
            unbuildable_ledger(url)
            with pytest.raises(RetryLater) as caught:
                tool._perform(_envelope("order-first-use"))
            assert caught.value.reason.startswith("ledger unavailable"), url
            # Retried for as long as it takes, never dead-lettered for it.
            assert retry_when(20)(10_000, caught.value)
    assert live.stats()["total"] == 0


def test_a_ledger_error_never_runs_out_of_retries() -> None:
    when = retry_when(max_retries=20)
    assert when(10_000, LedgerUnavailableError("down"))
    assert when(10_000, LedgerError("ledger script error: OOM command not allowed"))
    assert not when(10_000, RuntimeError("a bug"))


class _Watched:
    """The runtime's ledger, telling when a heartbeat lands after the claim was settled."""

    def __init__(self, inner: Ledger) -> None:
        self.inner = inner
        self.settled = threading.Event()
        self.late_heartbeats = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def heartbeat(self, key: str, token: int, *, lease_s: float) -> Write:
        if self.settled.is_set():
            self.late_heartbeats += 1
        return self.inner.heartbeat(key, token, lease_s=lease_s)

    def _settle(self, write: Write) -> Write:
        self.settled.set()
        time.sleep(0.3)  # six heartbeat intervals: a keeper still beating would beat here
        return write

    def fail(self, key: str, token: int, **kwargs: Any) -> Write:
        return self._settle(self.inner.fail(key, token, **kwargs))

    def handover(self, key: str, token: int, **kwargs: Any) -> Write:
        return self._settle(self.inner.handover(key, token, **kwargs))


@pytest.mark.parametrize("outcome", ["not_executed", "uncertain"])
def test_no_heartbeat_after_a_failure_or_handover_is_recorded(
    live: LocalStack, outcome: str
) -> None:
    def probe(call: EffectCall, target: str) -> dict[str, Any]:
        time.sleep(0.2)  # long enough for the lease keeper to beat (every 0.05 s)
        if outcome == "not_executed":
            raise NotExecutedError("refused before acting")
        raise TimeoutError("no answer")

    tool = effect_tool(identity=("target",), name=f"hb_probe_{outcome}", lease_s=0.15)(probe)
    watched = _Watched(runtime.ledger())
    runtime.set_ledger(watched)  # type: ignore[arg-type]
    try:
        effect = tool.derive("op-hb", {"target": "t1"})
        with pytest.raises(RetryLater):
            tool._perform(Envelope.of(effect).model_dump())
    finally:
        runtime.set_ledger(watched.inner)
    record = watched.inner.get(effect.key)
    assert record is not None and record.token == 1
    assert watched.late_heartbeats == 0
    assert ("fenced", "heartbeat") not in watched.inner.counts()
    if outcome == "uncertain":
        # Handed over: the lease ended at the handover and nothing extended it.
        assert record.state is State.CLAIMED and record.history[-1].note.startswith("handover")
        assert record.lease_deadline_ms == record.history[-1].at_ms
    else:
        assert record.state is State.FAILED


def _ready(stack: LocalStack, count: int = 1) -> bool:
    return stack.log("workers.log").count("Worker process is ready for action") >= count


def _scrape(port: int) -> list[Sample]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _value(port: int, name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in _scrape(port)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_under_oom_a_message_stays_alive_and_an_unrecorded_dead_letter_is_counted(
    live: LocalStack, own_ledger: RedisServer
) -> None:
    port = free_port()
    live.start_workers(
        1, 2, EFFECTQ_REDIS_URL=own_ledger.url, EFFECTQ_MAX_RETRIES="1",
        EFFECTQ_METRICS_PORT=str(port), EFFECTQ_METRICS_HOST="127.0.0.1",
    )  # fmt: skip
    wait_for(lambda: _ready(live), what="worker booted", timeout=60)
    admin = own_ledger.client()
    admin.config_set("maxmemory", "1")  # noeviction: every write is refused with OOM
    envelope = _envelope("order-oom")
    get_tool("charge").actor.send(envelope)
    runtime.broker().enqueue(
        dramatiq.Message(queue_name="effectq", actor_name="charge", args=("not an envelope",),
                         kwargs={}, options={})
    )  # fmt: skip
    wait_for(
        lambda: _value(port, "effectq_claims_total", tool="charge", outcome="unavailable") >= 3,
        what="three claims refused under OOM",
        timeout=60,
    )
    # Past EFFECTQ_MAX_RETRIES, the valid message is alive; the malformed one is dead, and
    # the ledger could not take its reason: counted.
    assert broker_messages(live)["dead"] == 1
    assert _value(port, "effectq_dead_letters_unrecorded_total") == 1
    assert "dead-letter of" in live.log("workers.log")
    assert live.stats()["total"] == 0
    admin.config_set("maxmemory", "0")
    ledger = runtime.ledger()
    wait_states(ledger, [envelope["key"]], timeout=60)
    assert live.stats()["executions"] == {envelope["key"]: 1}
    assert ledger.dead_letters() == []
    admin.close()


def test_a_worker_that_cannot_reach_the_ledger_at_boot_consumes_nothing_until_it_can(
    live: LocalStack, own_ledger: RedisServer
) -> None:
    live.start_workers(1, 2, EFFECTQ_REDIS_URL=own_ledger.url, EFFECTQ_MAX_RETRIES="1")
    wait_for(lambda: _ready(live), what="worker booted", timeout=60)
    own_ledger.stop()
    [pid] = live.worker_processes()
    os.kill(pid, signal.SIGKILL)  # the supervisor respawns it while the ledger is down
    envelopes = [_envelope(f"order-boot-{i}") for i in range(3)]
    for envelope in envelopes:
        get_tool("charge").actor.send(envelope)
    wait_for(
        lambda: live.log("workers.log").count("refusing to start") >= 2,
        what="the respawned worker refusing to start, twice",
        timeout=60,
    )
    assert broker_messages(live) == {"live": 3, "delayed": 0, "dead": 0}
    assert live.stats()["total"] == 0
    own_ledger.start()  # from its AOF, same port
    ledger = runtime.ledger()
    wait_states(ledger, [e["key"] for e in envelopes], timeout=90)
    wait_for(lambda: broker_messages(live) == DRAINED, what="queue drained", timeout=30)
    assert set(live.stats()["executions"].values()) == {1}
    assert ledger.dead_letters() == []


def test_an_in_flight_claim_is_retried_just_after_its_lease_deadline(live: LocalStack) -> None:
    # The default backoff bounds (1 s to 5 min), not the stack's fast ones (at most 2 s).
    live.start_workers(1, 2, EFFECTQ_RETRY_MIN_BACKOFF_MS="1000",
                       EFFECTQ_RETRY_MAX_BACKOFF_MS="300000")  # fmt: skip
    live.start_reconciler()
    wait_for(lambda: _ready(live), what="worker booted", timeout=60)
    ledger = runtime.ledger()
    envelope = _envelope("order-held")
    effect = get_tool("charge").derive("order-held", envelope["args"])
    ledger.claim(effect, lease_s=8, holder="gone/1")  # a holder that died with its lease
    held_until = time.monotonic() + 8
    get_tool("charge").actor.send(envelope)
    client = broker_client(live)
    wait_for(lambda: client.hlen("dramatiq:effectq.DQ.msgs") == 1, what="retry scheduled")
    [body] = client.hvals("dramatiq:effectq.DQ.msgs")
    eta_in_s = json.loads(body)["options"]["eta"] / 1000 - time.time()
    # Not Dramatiq's blind exponential backoff (1-2 s at first): just past the deadline.
    assert held_until - time.monotonic() - 1 < eta_in_s < held_until - time.monotonic() + 2
    [record] = wait_states(ledger, [effect.key], timeout=60).values()
    assert record is not None
    assert [h.state for h in record.history][-3:] == ["FAILED", "CLAIMED", "DONE"]
    assert live.stats()["executions"] == {effect.key: 1}


def test_the_retry_delay_follows_the_lease_deadline_the_ledger_reports() -> None:
    def claim(outcome: ClaimOutcome, state: State, remaining_ms: int | None) -> Claim:
        return Claim(outcome, "0" * 64, 1, state=state, remaining_ms=remaining_ms)

    cfg = Settings()
    live_lease = claim(ClaimOutcome.IN_FLIGHT, State.CLAIMED, 1_200)
    assert retry_delay_ms(live_lease, cfg) == min(1_700, cfg.retry_max_backoff_ms)
    # Overdue (the reconciler's turn): as long again as it is overdue, at least the minimum.
    just_expired = claim(ClaimOutcome.BLOCKED, State.CLAIMED, -10)
    assert retry_delay_ms(just_expired, cfg) == cfg.retry_min_backoff_ms
    # ... but polled at least every 6 s: a key the reconciler frees runs within that.
    long_expired = claim(ClaimOutcome.BLOCKED, State.CLAIMED, -10_000_000)
    assert retry_delay_ms(long_expired, cfg) == min(6_000, cfg.retry_max_backoff_ms)
    # RECONCILING's lease is a takeover's (30 s), not when it decides: the same period.
    reconciling = claim(ClaimOutcome.IN_FLIGHT, State.RECONCILING, 29_000)
    assert retry_delay_ms(reconciling, cfg) == min(6_000, cfg.retry_max_backoff_ms)
    # UNKNOWN has no deadline: an operator's turn, Dramatiq's exponential backoff.
    assert retry_delay_ms(claim(ClaimOutcome.BLOCKED, State.UNKNOWN, None), cfg) is None
