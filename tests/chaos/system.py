"""A deployment for the system-level checker, and what it takes to drive and read it.

Real processes throughout: a ledger Redis of its own (AOF, ``appendfsync always``), a broker
Redis **without persistence** (so that a restart forgets every message, as a failover that
missed the writes does), the sandbox provider with its execution log (``workers.dev.sandbox``),
worker pools and reconcilers (``workers.dev.local.LocalStack``), producers
(``tests.chaos.producer``) and the operator verbs through the real ``effectq`` CLI.

Every submission and every operator action is appended to an events file
(``events-*.jsonl``, one JSON object a line, ``tests.chaos.checker.Event``) that the checker
reads with the provider's log. ``voided_generation_scenario`` is the deterministic run of
issue 37's hole 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from tests.chaos.checker import ENDS, Event, Final, Verdict, check
from workers.dev.local import LocalStack
from workers.dev.redis_server import RedisServer, default_redis_binary
from workers.dev.sandbox import SandboxConfig

ROOT = Path(__file__).resolve().parents[2]
QUEUES = ("dramatiq:effectq.msgs", "dramatiq:effectq.DQ.msgs")
# A pool that must not requeue a dead worker's messages by itself (the scenario decides
# when the old message comes back).
NO_REQUEUE = {"EFFECTQ_BROKER_HEARTBEAT_TIMEOUT_MS": "600000"}


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
        self.write("submit", key, tool=tool, args=args, status=None, scope=scope)
        handle = submit(tool, scope=scope, **args)
        self.write("submit", key, tool=tool, args=args, status=handle.status.value, scope=scope)
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
        self.stack.apply_env()
        import workers.examples  # noqa: F401  (declares the tools against this broker)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stack.stop()
        self.broker_server.stop()
        self.ledger_server.stop()

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
        self.operator.write("replay", key, tool=tool, args=args, status=None)
        code, out = self.cli("replay", key, "--actor", "chaos", "--reason", "bounced", "--json")
        # A refused replay sent nothing: recorded as refused (the checker skips it).
        status = json.loads(out)["status"] if code == 0 else "conflict"
        self.operator.write("replay", key, tool=tool, args=args, status=status)
        return status

    def resolve(self, key: str, executed: bool) -> int:
        """``effectq resolve KEY``: an UNKNOWN effect decided from the provider's log (what
        an operator reads off the provider's dashboard)."""
        record = self.ledger().get(key)
        if record is None or record.state.value != "UNKNOWN":
            return -1
        mine = [
            e for e in self.stack.sandbox.executions()
            if e["idempotency_key"] == record.idempotency_key
        ]  # fmt: skip
        if mine:
            receipt = json.dumps({"id": mine[-1]["id"], "key": record.idempotency_key})
            argv = ["--executed", "--receipt", receipt]
        else:
            argv = ["--not-executed"]
        code, _ = self.cli("resolve", key, *argv, "--actor", "chaos", "--reason", "provider log")
        return code

    def recheck(self, tool: str) -> int:
        code, _ = self.cli("recheck", tool, "--actor", "chaos", "--reason", "lookup outage")
        return code

    # -- reads ----------------------------------------------------------------------------

    def ledger(self) -> Any:
        from workers import runtime

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
    from dedupe import idempotency_key

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


if __name__ == "__main__":
    import tempfile

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory(prefix="hole1-") as tmp:
        print(json.dumps(voided_generation_scenario(Path(tmp)), indent=1))
