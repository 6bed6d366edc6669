"""A deployment for the system-level checker, and what it takes to drive and read it.

Real processes throughout: a ledger Redis of its own (AOF, ``appendfsync always``), a broker
Redis **without persistence** (so that a restart forgets every message, as a failover that
missed the writes does), the sandbox provider with its execution log (``workers.dev.sandbox``),
worker pools and reconcilers (``workers.dev.local.LocalStack``), producers
(``tests.chaos.producer``) and the operator verbs through the real ``effectq`` CLI.

Every submission and every operator action is appended to an events file
(``events-*.jsonl``, one JSON object a line, ``tests.chaos.checker.Event``) that the checker
reads with the provider's log. ``voided_generation_scenario`` is the deterministic run of
issue 37's hole 1. ``tests.chaos.harness`` runs its own faults on the same ``Deployment``,
with the producer's retries, the example calls, the fault times and the command line below.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import redis

from dedupe import EffectqError, idempotency_key
from tests.chaos.checker import ACCEPTED, ENDS, Event, Final, Verdict, check
from workers import runtime
from workers.dev.local import LocalStack
from workers.dev.redis_server import RedisServer, default_redis_binary
from workers.dev.sandbox import SandboxConfig

ROOT = Path(__file__).resolve().parents[2]
QUEUES = ("dramatiq:effectq.msgs", "dramatiq:effectq.DQ.msgs")
# A pool that must not requeue a dead worker's messages by itself (the scenario decides
# when the old message comes back).
NO_REQUEUE = {"EFFECTQ_BROKER_HEARTBEAT_TIMEOUT_MS": "600000"}
TOOLS = ("charge", "send_email", "set_value")  # workers.examples'
T = TypeVar("T")


def example_args(tool: str, i: int) -> dict[str, Any]:
    """The ``i``-th effect's arguments for one of ``TOOLS``."""
    if tool == "charge":
        return {"customer": f"c{i}", "amount": f"{1 + i % 90}.50", "currency": "eur"}
    if tool == "send_email":
        return {"recipient": f"user{i}@example.com", "subject": f"s{i}"}
    return {"target": f"t{i}", "value": i}


def spread(rng: random.Random, kinds: list[str], window_s: float) -> list[tuple[float, str]]:
    """The faults ``kinds`` in a seeded order at seeded times, none in the window's first
    tenth nor its last 15 % (what they leave behind has time to show)."""
    rng.shuffle(kinds)
    times = sorted(rng.uniform(0.1 * window_s, 0.85 * window_s) for _ in kinds)
    return list(zip(times, kinds, strict=True))


@dataclass
class Retrying:
    """A producer's calls, retried while the ledger Redis is down (a submission asks it
    first): how many retries they took, and what was given up at its deadline."""

    retries: int = 0
    errors: list[str] = field(default_factory=list)

    def __call__(self, what: str, fn: Callable[[], T], deadline: float) -> T | None:
        delay = 0.05
        while True:
            try:
                return fn()
            except (EffectqError, redis.RedisError) as exc:
                if time.monotonic() > deadline:
                    self.errors.append(f"{what}: {type(exc).__name__}: {exc}")
                    return None
                self.retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)


class Recorder:
    """Appends events to one file, flushed line by line (a SIGKILL loses at most the line
    being written, never an earlier one)."""

    def __init__(self, path: Path, who: str) -> None:
        self.path = path
        self.who = who

    def write(self, kind: str, key: str, **fields: Any) -> None:
        row = {"kind": kind, "key": key, "mono": time.monotonic(), "who": self.who, **fields}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()

    def submit(self, tool: str, scope: str, args: dict[str, Any]) -> str:
        """Submit one call in this process: an intent line first (the producer may die
        before it hears the answer), then the answer."""
        from workers import get_tool, submit

        key = get_tool(tool).derive(scope, args, None).key
        fields = {"tool": tool, "args": args, "scope": scope, "attempt": uuid.uuid4().hex}
        self.write("submit", key, status=None, **fields)
        handle = submit(tool, scope=scope, **args)
        self.write("submit", key, status=handle.status.value, **fields)
        return handle.status.value


def read_events(workdir: Path) -> list[Event]:
    events: list[Event] = []
    for path in sorted(workdir.glob("events-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError, KeyError):  # a line torn by SIGKILL
                events.append(Event.of(json.loads(line)))
    return events


class Deployment:
    def __init__(
        self, workdir: Path, sandbox: SandboxConfig, env: dict[str, str] | None = None
    ) -> None:
        self.workdir = workdir
        binary = default_redis_binary()
        self.broker_server = RedisServer(binary, workdir / "broker", aof=False)
        self.ledger_server = RedisServer(binary, workdir / "ledger", aof=True)
        self.stack = LocalStack(
            redis_url=self.ledger_server.url,
            broker_url=f"redis://127.0.0.1:{self.broker_server.port}/0",
            sandbox=sandbox,
            env=env or {},
            workdir=workdir,
        )
        self.operator = Recorder(workdir / "events-operator.jsonl", "operator")

    def start(self) -> None:
        self.broker_server.start()
        self.ledger_server.start()
        self.stack.start()
        # This process becomes the deployment's producer; stop() gives the process its own
        # environment and runtime back (a pytest process runs other tests after this one:
        # left pointing at these servers, stopped, every later test found them refused).
        self._saved_env = {k: v for k, v in os.environ.items() if k.startswith("EFFECTQ_")}
        self._saved_runtime = runtime.installed()
        self.stack.apply_env()
        import workers.examples  # noqa: F401  (declares the tools against this broker)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stack.stop()
        self.broker_server.stop()
        self.ledger_server.stop()
        saved = getattr(self, "_saved_env", None)
        if saved is not None:
            for name in [k for k in os.environ if k.startswith("EFFECTQ_")]:
                del os.environ[name]
            os.environ.update(saved)
            previous = self._saved_runtime
            runtime.install(previous if previous is not None else runtime.Runtime.from_settings())

    # -- operator verbs, through the real CLI ----------------------------------------------

    def cli(self, *argv: str, timeout: float = 60.0) -> tuple[int, str]:
        done = subprocess.run(
            [sys.executable, "-m", "workers", *argv],
            cwd=ROOT, env=self.stack.env(), capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        return done.returncode, (done.stdout or done.stderr).strip()

    def void(self, key: str, verb: str, reason: str) -> bool:
        """``effectq revoke|supersede KEY``; recorded only when it took effect."""
        code, _ = self.cli(verb, key, "--actor", "chaos", "--reason", reason, "--json")
        if code == 0:
            self.operator.write("void", key, action=verb)
        return code == 0

    def replay(self, key: str) -> str | None:
        """``effectq replay KEY``: recorded as a submission of the stored request."""
        record = self.ledger().get(key)
        request = record.request if record is not None else None
        if not request:
            return None
        args = request.get("args") or {}
        tool = record.tool if record is not None else ""
        attempt = uuid.uuid4().hex
        self.operator.write("replay", key, tool=tool, args=args, status=None, attempt=attempt)
        code, out = self.cli("replay", key, "--actor", "chaos", "--reason", "bounced", "--json")
        # A refused replay sent nothing: recorded as refused (the checker skips it).
        status = json.loads(out)["status"] if code == 0 else "conflict"
        self.operator.write("replay", key, tool=tool, args=args, status=status, attempt=attempt)
        return status

    def resolve(self, key: str) -> tuple[int, str]:
        """``effectq resolve KEY``: an UNKNOWN effect decided from the provider's log (what
        an operator reads off the provider's dashboard)."""
        record = self.ledger().get(key)
        if record is None or record.state.value != "UNKNOWN":
            return -1, "not UNKNOWN any more"
        mine = [
            e for e in self.stack.sandbox.executions()
            if e["idempotency_key"] == record.idempotency_key
        ]  # fmt: skip
        if mine:
            receipt = json.dumps({"id": mine[-1]["id"], "key": record.idempotency_key})
            argv = ["--executed", "--receipt", receipt]
        else:
            argv = ["--not-executed"]
        return self.cli("resolve", key, *argv, "--actor", "chaos", "--reason", "provider log")

    def recheck(self, tool: str) -> tuple[int, str]:
        return self.cli("recheck", "--tool", tool, "--actor", "chaos", "--reason", "lookups")

    # -- reads ----------------------------------------------------------------------------

    def ledger(self) -> Any:
        return runtime.ledger()

    def held_messages(self) -> Counter[str]:
        """Broker messages still alive (queued, unacked or delayed), by effect key."""
        client = redis.Redis.from_url(self.stack.broker_url, decode_responses=True)
        held: Counter[str] = Counter()
        try:
            for name in QUEUES:
                for raw in client.hvals(name):
                    try:
                        held[json.loads(raw)["args"][0]["key"]] += 1
                    except (ValueError, KeyError, IndexError, TypeError):
                        held["?"] += 1
        finally:
            client.close()
        return held

    def finals(self, keys: list[str]) -> dict[str, Final]:
        records = self.ledger().get_many(keys)
        return {
            k: Final(r.state.value, r.generation, (r.receipt or {}).get("id"))
            for k, r in records.items()
            if r is not None
        }

    def listed(self, states: set[str]) -> dict[str, set[str]]:
        """state -> keys ``effectq list --state S --json`` shows."""
        shown: dict[str, set[str]] = {}
        for state in sorted(states):
            code, out = self.cli("list", "--state", state, "--limit", "10000", "--json")
            shown[state] = {r["key"] for r in json.loads(out)} if code == 0 else set()
        return shown

    def quiet(self, keys: list[str]) -> tuple[bool, dict[str, Any]]:
        """Every key in an end state and no message left that could still change one."""
        finals = self.finals(keys)
        held = self.held_messages()
        waiting = [
            k for k in keys
            if (k in finals and finals[k].state not in ENDS)
            or (held.get(k) and finals.get(k, Final("ABSENT")).state != "UNKNOWN")
        ]  # fmt: skip
        return not waiting, {"waiting": len(waiting), "held": sum(held.values())}

    def wait_quiet(self, keys: list[str], timeout: float) -> tuple[bool, float, dict[str, Any]]:
        started = time.monotonic()
        progress: dict[str, Any] = {}
        while time.monotonic() - started < timeout:
            try:
                ok, progress = self.quiet(keys)
            except redis.RedisError as exc:
                ok, progress = False, {"error": str(exc)}
            if ok:
                return True, round(time.monotonic() - started, 2), progress
            time.sleep(0.5)
        return False, round(time.monotonic() - started, 2), progress

    def verdict(self) -> Verdict:
        events = read_events(self.workdir)
        keys = sorted({e.key for e in events})
        finals = self.finals(keys)
        listed = self.listed({f.state for f in finals.values()})
        return check(events, self.stack.sandbox.executions(), finals, listed)

    # -- faults ---------------------------------------------------------------------------

    def restart_ledger(self, down_s: float) -> str:
        """SIGKILL the ledger Redis and start it again ``down_s`` later, on the same port and
        dir: it reloads its AOF."""
        self.ledger_server.kill()
        time.sleep(down_s)
        self.ledger_server.start()
        return f"ledger Redis SIGKILLed, down {down_s:.1f}s, restarted from AOF"


def wait_for(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout}s")
        time.sleep(0.1)


def voided_generation_scenario(workdir: Path) -> dict[str, Any]:
    """Issue 37, hole 1, step by step: charge 10.00 → DONE g0, the worker SIGKILLed after its
    commit and before its ack (failpoint after_commit=kill); revoke; the customer resubmits
    12.00 (g1), whose first attempt gets a 503 (``fail-next`` on the g1 idempotency key) →
    FAILED g1; then the g0 message comes back (a second pool's maintenance requeues the dead
    worker's unacked message). The g1 retry waits ≥ 20 s, so the old message meets the FAILED
    record. Right: the old message changes nothing and 12.00 runs under the g1 key."""
    # No maintenance pass by chance anywhere (this process's enqueue included): the old
    # message comes back exactly when the scenario runs one.
    dep = Deployment(
        workdir,
        SandboxConfig(provider_idempotency=False),
        env={"EFFECTQ_BROKER_MAINTENANCE_CHANCE": "0"},
    )
    actions: list[str] = []
    try:
        dep.start()
        producer = Recorder(workdir / "events-producer.jsonl", "producer")
        scope, customer, eur = "order-hole1", "cus_hole1", {"currency": "EUR"}

        def state() -> tuple[str, int] | None:
            record = dep.ledger().get(key)
            return (record.state.value, record.generation) if record else None

        pool_a = dep.stack.start_workers(1, 1, EFFECTQ_FAILPOINTS="after_commit=kill", **NO_REQUEUE)
        dep.stack.wait_for_workers(1, timeout=60)
        producer.submit("charge", scope, {"customer": customer, "amount": "10.00", **eur})
        key = read_events(workdir)[-1].key
        actions.append("submit charge 10.00 (g0)")
        wait_for("DONE g0", lambda: state() == ("DONE", 0), 60)
        # The worker died after the commit: its message is unacked in the broker. The pool
        # goes too, hard: a graceful stop would give the replacement process's unacked
        # messages back at once (they share the dead one's broker id).
        os.killpg(pool_a.pid, signal.SIGKILL)
        pool_a.wait()
        dep.stack.pools.remove(pool_a)
        actions.append("worker SIGKILLed after commit, before ack (after_commit=kill)")
        assert dep.void(key, "revoke", "refunded"), "revoke refused"
        actions.append("effectq revoke (refunded)")
        dep.stack.sandbox.fail_next(idempotency_key(key, 1), 1)
        dep.stack.start_workers(
            1, 1, EFFECTQ_RETRY_MIN_BACKOFF_MS="20000", EFFECTQ_RETRY_MAX_BACKOFF_MS="25000",
            **NO_REQUEUE,
        )  # fmt: skip
        producer.submit("charge", scope, {"customer": customer, "amount": "12.00", **eur})
        actions.append("resubmit charge 12.00 (g1); sandbox 503 on the g1 key once")
        wait_for("FAILED g1", lambda: state() == ("FAILED", 1), 60)
        actions.append("g1 first attempt FAILED (503)")
        actions.append(f"broker holds {sum(dep.held_messages().values())} messages of the key")
        # A pool that requeues dead workers' messages (3 s heartbeat timeout, a pass every
        # 5 s): the dead worker's g0 message comes back and this idle pool runs it.
        dep.stack.start_workers(1, 1)
        actions.append("a second pool starts: its maintenance redelivers the old g0 message")
        quiet, quiesce_s, progress = dep.wait_quiet([key], timeout=90)
        verdict = dep.verdict()
        record = dep.ledger().get(key)
        return {
            "scenario": "voided generation after FAILED (issue 37 hole 1)",
            "actions": actions,
            "quiet": quiet,
            "quiesce_s": quiesce_s,
            "progress": progress,
            "final": None
            if record is None
            else {
                "state": record.state.value,
                "generation": record.generation,
                "request_args": (record.request or {}).get("args"),
                "history": [(h.state, h.token, h.note[:60]) for h in record.history],
            },
            "executions": [
                {k: e[k] for k in ("seq", "idempotency_key", "token", "body")}
                for e in dep.stack.sandbox.executions()
            ],
            "dead_letters": [d.get("reason") for d in dep.ledger().dead_letters(count=100)],
            "figures": verdict.figures,
            "violations": verdict.violations,
        }
    finally:
        dep.stop()


# -- the seeded workload -------------------------------------------------------------------

LEASE_S = 3.0  # FAST_ENV's lease of the example tools
# Four attempts: a fail-next of 5 leaves an effect FAILED (dead-lettered) for a replay; a
# lookup outage makes an unestablished outcome UNKNOWN within seconds, for an operator.
DEPLOYMENT_ENV = {
    "EFFECTQ_MAX_RETRIES": "3",
    "EFFECTQ_RECONCILER_BUDGET": "2",
    "EFFECTQ_RECONCILER_BACKOFF_S": "0.5",
}


@dataclass
class Effect:
    """What the producer knows of one key: its call and whether an operator voided it
    since its last submission."""

    tool: str
    scope: str
    args: dict[str, Any]
    voided: bool = False


@dataclass
class Workload:
    """Effects and faults drawn from ``random.Random(seed)``, run against a
    ``Deployment``; process timing decides the rest (which claim a SIGKILL meets)."""

    args: argparse.Namespace
    dep: Deployment
    rng: random.Random
    producer: Recorder
    effects: dict[str, Effect] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)
    operator: Counter[str] = field(default_factory=Counter)
    fired: Counter[str] = field(default_factory=Counter)
    fault_log: list[str] = field(default_factory=list)
    tries: Retrying = field(default_factory=Retrying)  # the producer's, while the ledger is down
    stopped: list[psutil.Process] = field(default_factory=list)
    frozen: list[psutil.Process] = field(default_factory=list)  # by a broker loss
    later: list[tuple[float, str]] = field(default_factory=list)  # faults a fault scheduled
    arm_next: int = 0  # fail-next: the next new effects' first attempt gets a 503
    broker_lost: int = 0  # messages the broker forgot
    refusals: list[str] = field(default_factory=list)  # operator verbs that answered no
    t0: float = field(default_factory=time.monotonic)

    def log(self, text: str) -> None:
        if not self.args.quiet:
            print(f"[{time.monotonic() - self.t0:7.2f}s] {text}", file=sys.stderr, flush=True)

    # -- producer --------------------------------------------------------------------------

    def submit(self, tool: str, scope: str, args: dict[str, Any], step: str) -> str | None:
        """One submission, retried while the ledger is down (each try is recorded: the
        ones that raised as maybe-submitted)."""
        deadline = time.monotonic() + 60
        status = self.tries(step, lambda: self.producer.submit(tool, scope, args), deadline)
        if status is None:
            return None
        self.steps[step] += 1
        self.statuses[status] += 1
        return status

    def new_effect(self, i: int) -> None:
        tool = self.rng.choice(TOOLS)
        scope = f"sys-{self.args.seed}-{i}"
        args = example_args(tool, i)
        from workers import get_tool

        key = get_tool(tool).derive(scope, args, None).key
        if self.arm_next > 0:
            self.arm_next -= 1
            self.dep.stack.sandbox.fail_next(idempotency_key(key, 0), self.rng.choice((1, 2, 5)))
        self.effects[key] = Effect(tool, scope, args)
        self.submit(tool, scope, args, "new")

    def changed(self, effect: Effect) -> dict[str, Any]:
        """The call with its bound value changed (same key: the identity is kept)."""
        args = dict(effect.args)
        if effect.tool == "charge":
            args["amount"] = f"{self.rng.randint(100, 999)}.{self.rng.randint(10, 99)}"
        elif effect.tool == "set_value":
            args["value"] = self.rng.randint(10_000, 99_999)
        else:
            args["subject"] = f"reworded {self.rng.randint(0, 999)}"
        return args

    def state(self, key: str) -> str:
        record = self.dep.ledger().get(key)
        return record.state.value if record is not None else "ABSENT"

    def in_state(self, state: str) -> list[str]:
        from dedupe import State

        return sorted(
            set(self.dep.ledger().keys_in(State(state), limit=10_000)) & set(self.effects)
        )

    def step(self, move: str, i: int) -> None:
        """One move of the plan: a new effect, or a move on an effect submitted before
        (on one in the state the move needs; a duplicate when there is none)."""
        if move == "new":
            self.new_effect(i)
            return
        try:
            pool = {"void": "DONE", "replay": "FAILED", "settle": "UNKNOWN"}.get(move)
            keys = self.in_state(pool) if pool else sorted(self.effects)
            if move == "void":  # send_email binds only its identity: nothing to change
                keys = [k for k in keys if self.effects[k].tool != "send_email"]
            if not keys:
                move, keys = "duplicate", sorted(self.effects)
            key = self.rng.choice(keys)
            effect = self.effects[key]
            if move == "duplicate" or (move == "conflict" and effect.tool == "send_email"):
                # A reworded subject (send_email's free field) is a duplicate, not a conflict.
                args = effect.args if move == "duplicate" else self.changed(effect)
                if self.submit(effect.tool, effect.scope, args, move) in ACCEPTED:
                    effect.args, effect.voided = args, False
            elif move == "conflict":
                self.submit(effect.tool, effect.scope, self.changed(effect), "conflict")
            elif move == "void":
                verb = self.rng.choice(("revoke", "supersede"))
                if self.dep.void(key, verb, "refunded" if verb == "revoke" else "corrected"):
                    self.operator[verb] += 1
                    effect.voided = True
                    effect.args = self.changed(effect)
                    status = self.submit(effect.tool, effect.scope, effect.args, "resubmit")
                    effect.voided = status not in ACCEPTED
                else:
                    self.operator[f"{verb}:refused"] += 1
            elif move == "replay":
                self.operator[f"replay:{self.dep.replay(key)}"] += 1
            else:
                self.settle_unknown(key)
        except redis.RedisError:  # the ledger is down: the move is skipped
            self.steps[f"{move} skipped (ledger down)"] += 1

    def settle_unknown(self, key: str | None = None) -> None:
        """An operator on UNKNOWN effects: resolve from the provider's log, or recheck the
        tool (the reconciler asks the provider again)."""
        unknown = [key] if key is not None else self.in_state("UNKNOWN")
        for k in unknown:
            verb = "recheck" if self.rng.random() < 0.3 else "resolve"
            code, out = (
                self.dep.recheck(self.effects[k].tool)
                if verb == "recheck"
                else (self.dep.resolve(k))
            )
            self.operator[f"{verb}:{'ok' if code == 0 else 'refused'}"] += 1
            if code != 0:
                self.refusals.append(
                    f"{verb} {k[:12]}: {out.splitlines()[-1][:160] if out else code}"
                )

    # -- faults ----------------------------------------------------------------------------

    def victim(self) -> psutil.Process | None:
        pids = [
            p for p in self.dep.stack.worker_processes()
            if p not in {s.pid for s in self.stopped}
        ]  # fmt: skip
        if not pids:
            return None
        with contextlib.suppress(psutil.NoSuchProcess):
            return psutil.Process(self.rng.choice(sorted(pids)))
        return None

    def inject(self, kind: str) -> None:
        stack = self.dep.stack
        detail = ""
        self.fired[kind] += 1
        if kind == "kill":
            proc = self.victim()
            detail = "no worker process" if proc is None else f"SIGKILL worker pid {proc.pid}"
            if proc is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
        elif kind == "failpoint_pool":
            point = self.rng.choice(("after_commit", "after_effect"))
            p = round(self.rng.uniform(0.2, 0.5), 2)
            span = self.rng.uniform(4.0, 8.0)
            pool = stack.start_workers(1, 2, EFFECTQ_FAILPOINTS=f"{point}=kill@{p}")
            threading.Timer(span, self.end_pool, (pool,)).start()
            detail = f"a pool armed {point}=kill@{p} for {span:.1f}s, then SIGKILLed"
        elif kind == "stop":
            proc = self.victim()
            hold = LEASE_S * 2 + self.rng.uniform(1.0, 3.0)
            detail = "no worker process" if proc is None else f"SIGSTOP pid {proc.pid} {hold:.1f}s"
            if proc is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.suspend()
                    self.stopped.append(proc)
                    threading.Timer(hold, self.resume, (proc,)).start()
        elif kind == "broker_loss":
            # The workers freeze first: what is submitted meanwhile waits in the broker, and
            # that is what the broker then forgets.
            hold = self.rng.uniform(3.0, 6.0)
            stopped = {p.pid for p in self.stopped}
            for pid in stack.worker_processes():
                with contextlib.suppress(psutil.NoSuchProcess):
                    if pid not in stopped:
                        proc = psutil.Process(pid)
                        proc.suspend()
                        self.frozen.append(proc)
            self.later.append((time.monotonic() - self.t0 + hold, "broker_flush"))
            detail = f"{len(self.frozen)} worker processes frozen for {hold:.1f}s"
        elif kind == "broker_flush":
            client = redis.Redis.from_url(stack.broker_url)
            try:
                held = sum(client.hlen(q) for q in QUEUES)
                client.flushdb()
            finally:
                client.close()
            self.broker_lost += held
            for proc in self.frozen:
                self.resume(proc)
            self.frozen.clear()
            detail = f"broker db flushed ({held} messages), workers resumed"
            self.fault_log.append(f"{time.monotonic() - self.t0:.1f}s {kind}: {detail}")
            self.log(f"fault {kind}: {detail}; resubmitting every key")
            for effect in list(self.effects.values()):
                if not effect.voided:
                    self.submit(effect.tool, effect.scope, effect.args, "resubmit after loss")
            return
        elif kind == "fail_next":
            more = self.rng.randint(1, 3)
            self.arm_next += more
            detail = f"{more} more new effects get 1, 2 or 5 503s ({self.arm_next} armed)"
        elif kind == "lost_acks":
            span = self.rng.uniform(3.0, 8.0)
            stack.sandbox.configure(drop_ack_rate=0.3)
            threading.Timer(span, self.acks_back).start()
            detail = f"drop_ack_rate 0.3 for {span:.1f}s"
        elif kind == "lookup_outage":
            span = self.rng.uniform(4.0, 8.0)
            stack.sandbox.configure(drop_ack_rate=0.5, lookup_enabled=False)
            threading.Timer(span, self.acks_back).start()
            detail = f"lookups down and drop_ack_rate 0.5 for {span:.1f}s"
        elif kind == "ledger_restart":
            detail = self.dep.restart_ledger(self.rng.uniform(0.5, 2.0))
        self.fault_log.append(f"{time.monotonic() - self.t0:.1f}s {kind}: {detail}")
        self.log(f"fault {kind}: {detail}")

    def end_pool(self, pool: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pool.pid, signal.SIGKILL)
        pool.wait()

    def resume(self, proc: psutil.Process) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.resume()
        with contextlib.suppress(ValueError):
            self.stopped.remove(proc)

    def acks_back(self) -> None:
        with contextlib.suppress(Exception):
            self.dep.stack.sandbox.configure(
                drop_ack_rate=self.args.drop_ack_rate, lookup_enabled=True
            )

    def heal(self) -> None:
        for proc in [*self.stopped, *self.frozen]:
            self.resume(proc)
        if not self.dep.ledger_server.running:
            self.dep.ledger_server.start()
        self.dep.stack.sandbox.configure(fail_rate=0.0, drop_ack_rate=0.0, lookup_enabled=True)


def schedule(
    rng: random.Random, args: argparse.Namespace, window_s: float
) -> list[tuple[float, str]]:
    kinds = (
        ["kill"] * args.kills + ["failpoint_pool"] * args.failpoint_pools
        + ["stop"] * args.stops + ["broker_loss"] * args.broker_losses
        + ["fail_next"] * args.fail_next + ["lost_acks"] * args.lost_acks
        + ["lookup_outage"] * args.lookup_outages
        + ["ledger_restart"] * args.ledger_restarts
    )  # fmt: skip
    return spread(rng, kinds, window_s)


MOVES = {"duplicate": 30, "conflict": 15, "void": 10, "replay": 6, "settle": 4}


def work_plan(rng: random.Random, effects: int) -> list[str]:
    """``effects`` new effects and 0.8 as many moves on earlier ones, the first three new."""
    moves = rng.choices(list(MOVES), list(MOVES.values()), k=int(0.8 * effects))
    rest = ["new"] * (effects - 3) + moves
    rng.shuffle(rest)
    return ["new"] * 3 + rest


def run_workload(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    dep = Deployment(
        workdir,
        SandboxConfig(drop_ack_rate=args.drop_ack_rate, provider_idempotency=False, seed=args.seed),
        env=DEPLOYMENT_ENV,
    )
    started = time.monotonic()
    try:
        dep.start()
        dep.stack.start_workers(args.processes, args.threads)
        dep.stack.start_reconciler()
        dep.stack.wait_for_workers(args.processes, timeout=120)
        work = Workload(args, dep, rng, Recorder(workdir / "events-producer.jsonl", "producer"))
        window_s = args.minutes * 60 if args.minutes else max(20.0, args.effects * 0.75)
        faults = schedule(rng, args, window_s)
        work.log(f"window {window_s:.0f}s, faults {[(round(t, 1), k) for t, k in faults]}")
        plan = work_plan(rng, args.effects)
        i = 0
        while i < len(plan) or faults:
            now = time.monotonic() - work.t0
            if faults and faults[0][0] <= now:
                work.inject(faults.pop(0)[1])
                faults = sorted(faults + work.later)
                work.later.clear()
                continue
            if i < len(plan):
                pause = work.t0 + window_s * 0.85 * i / len(plan) - time.monotonic()
                if pause > 0:
                    time.sleep(min(pause, faults[0][0] - now if faults else pause))
                    continue
                work.step(plan[i], i)
                i += 1
            else:
                time.sleep(max(0.0, faults[0][0] - now))
        chaos_s = round(time.monotonic() - work.t0, 1)
        time.sleep(LEASE_S * 2 + 4)  # the last SIGSTOP and lost-ack span end on their timers
        work.heal()
        keys = sorted(work.effects)
        quiet, quiesce_s, progress = dep.wait_quiet(keys, timeout=args.quiesce_timeout)
        # What is still UNKNOWN gets an operator: decided from the provider's log.
        work.settle_unknown()
        if work.operator:
            quiet, more_s, progress = dep.wait_quiet(keys, timeout=args.quiesce_timeout)
            quiesce_s += more_s
        verdict = dep.verdict()
        finals = dep.finals(keys)
        violations = list(verdict.violations)
        if not quiet:
            violations.append(f"not quiescent after {quiesce_s}s: {progress}")
        if work.tries.errors:
            violations.append(f"producer gave up: {work.tries.errors[:3]}")
        return {
            "chaos": "violations" if violations else "ok",
            "bench": "system_checker",
            "seed": args.seed,
            "effects": len(work.effects),
            "submissions": verdict.figures["submissions"],
            "steps": dict(work.steps),
            "statuses": dict(work.statuses),
            "producer_retries": work.tries.retries,
            "executions": verdict.figures["executions"],
            "states": dict(Counter(f.state for f in finals.values())),
            "operator": dict(work.operator),
            "faults": dict(work.fired),
            "broker_lost_messages": work.broker_lost,
            "operator_refusals": work.refusals,
            "fault_log": work.fault_log,
            "checker": verdict.figures,
            "dead_letters": len(dep.ledger().dead_letters(count=100_000)),
            "supervisor_restarts": dep.stack.log("workers.log").count("restarting in"),
            "chaos_s": chaos_s,
            "quiesce_s": quiesce_s,
            "wall_s": round(time.monotonic() - started, 1),
            "violations": violations,
        }
    finally:
        dep.stop()


def render(result: dict[str, Any]) -> str:
    lines = [f"effectq system checker — seed {result['seed']} — {result['chaos'].upper()}"]
    for name in ("effects", "submissions", "steps", "statuses", "executions", "states",
                 "operator", "faults", "broker_lost_messages", "checker", "dead_letters",
                 "supervisor_restarts", "chaos_s", "quiesce_s", "wall_s"):  # fmt: skip
        lines.append(f"  {name:<22}{json.dumps(result.get(name))}")
    lines += [f"  fault  {line}" for line in result.get("fault_log", [])]
    lines += [f"  refused  {line}" for line in result.get("operator_refusals", [])]
    lines += [f"  VIOLATION  {v}" for v in result.get("violations", [])[:30]]
    return "\n".join(lines)


# -- the command line (this one's and the harness's) ----------------------------------------


def command_line(
    prog: str, description: str | None, *, processes: int, quiesce_timeout: float
) -> argparse.ArgumentParser:
    """The options both runs take: the seed, the pool, the wait for quiescence, the workdir."""
    p = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seed", type=int, default=None, help="default: random, printed")
    p.add_argument("--processes", type=int, default=processes)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--quiesce-timeout", type=float, default=quiesce_timeout)
    p.add_argument("--keep", type=Path, default=None, help="keep the workdir (logs, events)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def seeded(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with a seed: the one given, else a random one (printed in the report)."""
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)
    return args


def workdir_for(cleanup: contextlib.ExitStack, keep: Path | None, prefix: str) -> Path:
    """``--keep DIR`` (made if missing), else a temporary directory gone on exit."""
    if keep is None:
        return Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    keep.mkdir(parents=True, exist_ok=True)
    return keep


def report(result: dict[str, Any], render: Callable[[dict[str, Any]], str]) -> int:
    """The one-screen report, then the result as one JSON line; 1 on any violation."""
    print(render(result))
    print(json.dumps(result, sort_keys=True))
    return 1 if result["violations"] else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = command_line("python -m tests.chaos.system", __doc__, processes=2, quiesce_timeout=120.0)
    p.add_argument("--hole1", action="store_true", help="the deterministic hole-1 scenario only")
    p.add_argument("--effects", type=int, default=100)
    p.add_argument("--minutes", type=float, default=None, help="window (default 0.75 s/effect)")
    p.add_argument("--kills", type=int, default=2, help="worker processes SIGKILLed")
    p.add_argument(
        "--failpoint-pools", type=int, default=1, help="pools armed with kill@P failpoints"
    )
    p.add_argument("--stops", type=int, default=1, help="workers SIGSTOPped past their lease")
    p.add_argument("--broker-losses", type=int, default=1, help="broker db flushed")
    p.add_argument("--fail-next", type=int, default=2, help="provider 503 on coming effects")
    p.add_argument("--lost-acks", type=int, default=1, help="spans of 30 %% lost acks")
    p.add_argument("--lookup-outages", type=int, default=1, help="lookups down, acks lost")
    p.add_argument("--ledger-restarts", type=int, default=1, help="ledger SIGKILL + AOF restart")
    p.add_argument("--drop-ack-rate", type=float, default=0.02, help="lost acks at all times")
    return seeded(p.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as cleanup:
        workdir = workdir_for(cleanup, args.keep, "system-")
        if args.hole1:
            print(json.dumps(voided_generation_scenario(workdir), indent=1))
            return 0
        try:
            result = run_workload(args, workdir)
        except Exception as exc:  # the report still says what broke, and the seed
            result = {"chaos": "error", "bench": "system_checker", "seed": args.seed,
                      "violations": [f"harness: {exc!r}"]}  # fmt: skip
    return report(result, render)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
