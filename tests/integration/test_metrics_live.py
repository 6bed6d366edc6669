"""Metrics of a real run, scraped over HTTP: a supervised pool of 2 Dramatiq worker
processes and a reconciler process, each serving its own endpoint.

The run: 16 charges with the sandbox's own idempotency off (its execution count is the
ground truth), one worker process SIGKILLed while it sleeps at the ``before_commit``
failpoint (its effect executed, not recorded: the reconciler finds it), duplicates at
submit and at claim, a conflict at each stage, and an expired claim of a tool the
reconciler does not declare (left alone, counted; made UNKNOWN by one that declares it).
Then:

* each scrape passes ``promtool check metrics`` and carries only allowlisted labels;
* the counters, summed over the pool's worker processes (the killed one included), equal
  what the sandbox and the ledger report;
* a real Prometheus server (Debian's binary, on a free loopback port, its own config and
  data directory, stopped by pid) scrapes both endpoints, loads the alert rules, answers
  the suppression-ratio queries and every dashboard query.

promtool / prometheus missing: those tests skip, except with CI=true, where they fail.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from dedupe import EffectRecord, Ledger, State, ToolSpec, derive
from reconciler import Reconciler
from tests.support.requires import need_binary
from tests.support.stack import SANDBOX_DEFAULTS, broker_messages, wait_for, wait_states
from workers import get_tool, metrics, runtime, submit
from workers.dev.local import LocalStack
from workers.dev.ports import free_port
from workers.producer import Status
from workers.tool import Envelope

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "effectq.json"
N = 16
ARGS = {"customer": "c-7", "amount": "12.50", "currency": "usd"}
# Labels of the client library's own process / platform metrics (reconciler endpoint).
CLIENT_LABELS = {"generation", "implementation", "major", "minor", "patchlevel", "version"}
KEYISH = re.compile(r"[0-9a-f]{16,}")


def need(binary: str) -> str:
    return need_binary(binary, "apt-get install prometheus")


def samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def total(found: list[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in found
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def charge_scope(i: int) -> str:
    return f"order-metrics-{i}"


@dataclass
class Run:
    stack: LocalStack
    worker_port: int
    reconciler_port: int
    workers: str  # the pool's scrape, after the run
    reconciler: str  # the reconciler's
    keys: list[str]
    killed: int
    metrics_dir: Path
    counts: dict[tuple[str, str], int]
    records: dict[str, EffectRecord | None]
    provider: dict[str, Any]
    resubmitted: list[Status]


def _scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


def _sleeping_holder(
    stack: LocalStack, ledger: Ledger, keys: list[str], seen: dict[tuple[str, int], float]
) -> int | None:
    """The pid of a worker process that executed an effect and has not recorded it yet:
    asleep at before_commit. The provider counts an execution before the worker has read
    its answer, so a holder counts only once it has stayed so for a while (``seen``: when
    each (key, pid) was first found so) — on a loaded machine, reading the answer is not
    instant, and a process killed inside the call would not have counted it."""
    executed = stack.stats()["executions"]
    now = time.monotonic()
    for key, record in ledger.get_many(keys).items():
        if record and record.state is State.CLAIMED and executed.get(key) and record.holder:
            match = re.search(r":(\d+)/", record.holder)
            if match:
                pid = int(match.group(1))
                if now - seen.setdefault((key, pid), now) >= _SETTLED_S:
                    return pid
    return None


# How long a holder must stay "executed, not recorded" before it counts as asleep at the
# failpoint (which sleeps _ASLEEP_S).
_SETTLED_S, _ASLEEP_S = 0.4, 1.5


@pytest.fixture(scope="module")
def run(stack: LocalStack) -> Iterator[Run]:
    # What the `live` fixture does, for one scenario shared by this module's tests.
    redis.Redis.from_url(stack.ledger_url).flushall()
    for log in ("workers.log", "reconciler.log"):
        (stack.workdir / log).unlink(missing_ok=True)
    stack.sandbox.reset()
    stack.sandbox.configure(**{**SANDBOX_DEFAULTS, "provider_idempotency": False})
    worker_port, reconciler_port = free_port(), free_port()
    metrics_dir = stack.workdir / "metrics-live"
    try:
        # One thread per process: the killed one has exactly one effect in flight, asleep
        # after its provider call (a thread killed inside the call would leave an execution
        # that no worker saw return; only the reconciler's "found" would count it).
        stack.start_workers(
            2, 1, EFFECTQ_METRICS_PORT=str(worker_port), EFFECTQ_METRICS_HOST="127.0.0.1",
            EFFECTQ_METRICS_DIR=str(metrics_dir),
            EFFECTQ_FAILPOINTS=f"before_commit=sleep:{_ASLEEP_S}",
        )  # fmt: skip
        stack.start_reconciler(
            0.3, EFFECTQ_METRICS_PORT=str(reconciler_port), EFFECTQ_METRICS_HOST="127.0.0.1"
        )
        pids = stack.wait_for_workers(2)
        ledger = runtime.ledger()
        tool = get_tool("charge")

        keys = [submit("charge", scope=charge_scope(i), **ARGS).key for i in range(N)]
        # A crash at a failpoint: SIGKILL a worker process while it sleeps at before_commit.
        holder: list[int] = []
        seen: dict[tuple[str, int], float] = {}
        wait_for(
            lambda: (
                holder.append(pid) or True  # type: ignore[func-returns-value]
                if (pid := _sleeping_holder(stack, ledger, keys, seen)) is not None
                else False
            ),
            what="a worker process holding an executed, unrecorded effect",
        )
        killed = holder[0]
        assert killed in pids
        os.kill(killed, signal.SIGKILL)
        wait_states(ledger, keys, timeout=60)
        wait_for(lambda: broker_messages(stack) == {"live": 0, "delayed": 0, "dead": 0},
                 what="queue drained", timeout=60)  # fmt: skip

        # Duplicates at submit (the producer's check: not enqueued) and at claim (sent past
        # that check, as a broker redelivery would be).
        resubmitted = [submit("charge", scope=charge_scope(i), **ARGS).status for i in range(8)]
        for i in range(5):
            tool.actor.send(Envelope.of(tool.derive(charge_scope(i), ARGS)).model_dump())
        # A conflict at each stage: refused at submit; dead-lettered at claim.
        changed = {**ARGS, "amount": "99.00"}
        assert submit("charge", scope=charge_scope(0), **changed).status is Status.CONFLICT
        tool.actor.send(Envelope.of(tool.derive(charge_scope(1), changed)).model_dump())
        # An expired claim of a tool the reconciler process does not declare: left alone
        # there and counted; then one that declares it (no lookup) makes it UNKNOWN.
        ghost_spec = ToolSpec(name="ghost", identity=("x",))
        ghost = derive(ghost_spec, "ghost-1", {"x": "1"})
        ledger.claim(ghost, lease_s=0.2, holder="gone/1")
        wait_for(lambda: broker_messages(stack) == {"live": 0, "delayed": 0, "dead": 1},
                 what="duplicates acked, conflict dead-lettered", timeout=60)  # fmt: skip

        def unowned() -> float:
            return total(samples(_scrape(reconciler_port)), "effectq_reconciler_unowned_claims",
                         tool="ghost")  # fmt: skip

        wait_for(lambda: unowned() == 1, what="the reconciler leaving the ghost's claim alone")
        assert ledger.get(ghost.key).state is State.CLAIMED  # type: ignore[union-attr]
        assert Reconciler(ledger, {"ghost": ghost_spec}).reconcile(ghost.key) == "unknown"
        wait_for(lambda: unowned() == 0, what="the ghost's claim no longer left alone")
        yield Run(
            stack=stack, worker_port=worker_port, reconciler_port=reconciler_port,
            workers=_scrape(worker_port), reconciler=_scrape(reconciler_port), keys=keys,
            killed=killed, metrics_dir=metrics_dir, counts=ledger.counts(),
            records=ledger.get_many(keys), provider=stack.stats(), resubmitted=resubmitted,
        )  # fmt: skip
    finally:
        stack.stop_processes()
        stack.sandbox.configure(**SANDBOX_DEFAULTS)


def test_counters_equal_what_the_sandbox_and_the_ledger_report(run: Run) -> None:
    w, r = samples(run.workers), samples(run.reconciler)
    records = [rec for rec in run.records.values() if rec is not None]
    assert len(records) == N and {rec.state for rec in records} == {State.DONE}
    # Ground truth: each effect executed exactly once, and the pool counted each execution.
    assert run.provider["total"] == N and set(run.provider["executions"].values()) == {1}
    assert total(w, "effectq_effects_total", tool="charge", outcome="succeeded") == N
    assert total(w, "effectq_effects_total", outcome="failed") == 0
    assert total(w, "effectq_effects_total", outcome="uncertain") == 0
    assert total(w, "effectq_effect_duration_seconds_count", tool="charge") == N
    # Every claim the ledger granted (the killed holder's included).
    granted = sum(rec.attempts for rec in records)
    assert total(w, "effectq_claims_total", tool="charge", outcome="acquired") == granted
    assert total(w, "effectq_claim_duration_seconds_count", op="claim") == total(
        w, "effectq_claims_total"
    )
    # What the reconciler resolved, from the records' own histories.
    found = sum(any("found at the provider" in h.note for h in rec.history) for rec in records)
    not_executed = sum(
        any("not found after the settle window" in h.note for h in rec.history) for rec in records
    )
    assert found == 1  # the killed holder's executed, unrecorded effect
    assert total(r, "effectq_reconciler_resolutions_total", tool="charge",
                 resolution="found") == found  # fmt: skip
    assert total(r, "effectq_reconciler_resolutions_total", tool="charge",
                 resolution="not_executed") == not_executed  # fmt: skip
    # The ghost's claim: left alone by this reconciler, resolved by one that declares it.
    assert total(r, "effectq_reconciler_resolutions_total", tool="ghost") == 0
    assert total(r, "effectq_reconciler_unowned_claims", tool="ghost") == 0
    assert total(w, "effectq_claim_duration_seconds_count", op="commit") == N - found
    # Duplicates and conflicts: the workers' own counts, the ledger's, the producer's.
    assert all(status is Status.DONE for status in run.resubmitted)
    dup_claim = run.counts[("dup_claim", "charge")]
    assert dup_claim >= 5 and total(w, "effectq_claims_total", outcome="duplicate") == dup_claim
    assert run.counts[("dup_submit", "charge")] == len(run.resubmitted)
    for found_in in (w, r):  # one scrape of either endpoint shows every stage
        assert total(found_in, "effectq_duplicates_suppressed_total", tool="charge",
                     stage="claim") == dup_claim  # fmt: skip
        assert total(found_in, "effectq_duplicates_suppressed_total", tool="charge",
                     stage="submit") == len(run.resubmitted)  # fmt: skip
        assert total(found_in, "effectq_conflicts_total", tool="charge") == 2
    assert run.counts[("conflict", "charge")] == 2
    assert total(w, "effectq_claims_total", tool="charge", outcome="conflict") == 1
    # Fenced writes: worker and reconciler counts against the ledger's.
    for op in ("commit", "fail", "handover", "unknown"):
        counted = total(w, "effectq_fenced_writes_total", op=op)
        counted += total(r, "effectq_fenced_writes_total", op=op)
        assert counted == run.counts.get(("fenced", op), 0), op
    heartbeats = total(w, "effectq_fenced_writes_total", op="heartbeat")
    assert heartbeats == run.counts.get(("fenced", "heartbeat"), 0)
    # Backlog gauges, read from the ledger at scrape time.
    assert total(w, "effectq_unknown_effects", tool="ghost") == 1
    assert total(w, "effectq_unknown_effects", tool="charge") == 0
    assert total(w, "effectq_inflight_claims") == run.counts.get(("CLAIMED", "charge"), 0) == 0
    assert total(w, "effectq_expired_claims") == 0 and total(w, "effectq_expired_leases") == 0
    assert total(w, "effectq_reconciler_lag_seconds") == 0
    assert total(w, "effectq_ledger_up") == 1
    assert total(w, "effectq_queue_messages", queue="effectq", state="dead") == 1
    assert total(w, "effectq_queue_messages", queue="effectq", state="queued") == 0


def test_the_sum_covers_every_worker_process_the_killed_one_included(run: Run) -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    files = sorted(run.metrics_dir.glob("counter_*.db"))
    pids = {int(f.stem.split("_")[1]) for f in files}
    assert run.killed in pids and len(pids) >= 3  # 2 workers, and the killed one's successor
    per_process: dict[int, float] = {}
    for pid in pids:
        alone = run.metrics_dir.parent / f"one-{pid}"
        alone.mkdir(exist_ok=True)
        shutil.copy(run.metrics_dir / f"counter_{pid}.db", alone)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        per_process[pid] = (
            registry.get_sample_value(
                "effectq_effects_total", {"tool": "charge", "outcome": "succeeded"}
            )
            or 0.0
        )
        shutil.rmtree(alone)
    assert per_process[run.killed] >= 1  # its executions survive its death
    assert sum(1 for n in per_process.values() if n) >= 2
    scraped = total(samples(run.workers), "effectq_effects_total", outcome="succeeded")
    assert sum(per_process.values()) == scraped == N


def test_each_scrape_passes_promtool_check_metrics(run: Run) -> None:
    promtool = need("promtool")
    for name, text in (("workers", run.workers), ("reconciler", run.reconciler)):
        done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"


def test_no_metric_carries_a_label_outside_the_allowlist(run: Run) -> None:
    tools = {"charge", "send_email", "set_value", "ghost"}
    seen: set[str] = set()
    for text in (run.workers, run.reconciler):
        for s in samples(text):
            if not s.name.startswith("effectq_"):
                assert set(s.labels) <= CLIENT_LABELS, (s.name, s.labels)
                continue
            seen.add(s.name)
            assert set(s.labels) <= metrics.LABELS, (s.name, s.labels)
            for label, value in s.labels.items():
                allowed = metrics.LABEL_VALUES.get(label)
                if label == "tool":
                    allowed = frozenset(tools)
                elif label == "queue":
                    allowed = frozenset({"effectq"})
                assert allowed is None or value in allowed, (s.name, label, value)
                # Never a key, a recipient or a campaign id.
                assert not KEYISH.search(value) and "@" not in value, (s.name, label, value)
    assert len(seen) >= 20


def _query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    reply = client.get("/api/v1/query", params={"query": expr}).json()
    assert reply["status"] == "success", (expr, reply)
    result: list[dict[str, Any]] = reply["data"]["result"]
    return result


@contextlib.contextmanager
def prometheus_server(tmp: Path, targets: dict[str, int]) -> Iterator[httpx.Client]:
    binary = need("prometheus")
    port = free_port()
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{p}']\n"
        for job, p in targets.items()
    )
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {RULES}\nscrape_configs:\n{jobs}"
    )
    with open(tmp / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError((tmp / "prometheus.log").read_text(errors="replace"))
        try:
            return client.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, what="prometheus ready", timeout=30)
        yield client
    finally:
        client.close()
        proc.terminate()  # by pid: only the server this test started
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


RATIO = (
    "sum by (stage) (max by (tool, stage) (effectq_duplicates_suppressed_total))"
    " / ignoring (stage) group_left ()"
    " (sum(max by (tool, stage) (effectq_duplicates_suppressed_total))"
    " + sum(effectq_claims_total{outcome='acquired'}))"
)


def test_a_real_prometheus_scrapes_the_endpoints_and_answers_the_suppression_ratio(
    run: Run, tmp_path: Path
) -> None:
    import json

    targets = {"effectq-workers": run.worker_port, "effectq-reconciler": run.reconciler_port}
    with prometheus_server(tmp_path, targets) as prom:
        wait_for(
            lambda: len(_query(prom, "up == 1")) == 2 and _query(prom, RATIO),
            what="both targets scraped", timeout=30,
        )  # fmt: skip
        w = samples(run.workers)
        dups = {stage: total(w, "effectq_duplicates_suppressed_total", stage=stage)
                for stage in ("submit", "claim")}  # fmt: skip
        decided = sum(dups.values()) + total(w, "effectq_claims_total", outcome="acquired")
        answer = {r["metric"]["stage"]: float(r["value"][1]) for r in _query(prom, RATIO)}
        assert answer == pytest.approx({stage: n / decided for stage, n in dups.items()})

        # The rate-based recording rule, over duplicates that happen while it scrapes.
        tool = get_tool("charge")
        for i in range(4):
            assert submit("charge", scope=charge_scope(i), **ARGS).status is Status.DONE
            tool.actor.send(Envelope.of(tool.derive(charge_scope(i), ARGS)).model_dump())

        def ratio_by_stage() -> dict[str, float]:
            rows = _query(prom, "effectq:suppression_ratio:rate5m")
            got = {r["metric"]["stage"]: float(r["value"][1]) for r in rows}
            return got if len(got) == 2 and all(v > 0 for v in got.values()) else {}

        wait_for(ratio_by_stage, what="suppression ratio by stage", timeout=30)
        # No claim acquired meanwhile: the stages share all of it.
        assert sum(ratio_by_stage().values()) == pytest.approx(1.0)

        # Every rule evaluates; the UNKNOWN effect already has its alert pending.
        def evaluated() -> list[dict[str, Any]]:
            groups = prom.get("/api/v1/rules").json()["data"]["groups"]
            rules = [rule for g in groups for rule in g["rules"]]
            return rules if all(rule["health"] == "ok" for rule in rules) else []

        wait_for(evaluated, what="every rule evaluated", timeout=30)
        alerts = prom.get("/api/v1/alerts").json()["data"]["alerts"]
        assert any(
            a["labels"]["alertname"] == "EffectqUnknownEffects" and a["labels"]["tool"] == "ghost"
            for a in alerts
        ), alerts
        # Every dashboard query parses and runs.
        board = json.loads(DASHBOARD.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$tool", ".*").replace("$__rate_interval", "1m")
                _query(prom, expr)
