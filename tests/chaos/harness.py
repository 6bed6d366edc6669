"""Chaos harness: a whole effectq deployment under seeded faults, checked against DESIGN §7.

    python -m tests.chaos.harness --effects 300 --seed 7 --kills 3 --stops 1 \
        --redis-restarts 1 --sandbox-restarts 1

Real processes (``tests.chaos.system.Deployment``): a durable ledger Redis of its own (AOF,
``appendfsync always``) apart from the broker's Redis, the sandbox provider with faults
(5 % 5xx, 2 % lost acks, latency, lookup lag longer than the lease) and its own idempotency
OFF, a supervised pool ``effectq worker -p 3 -t 4`` and two reconcilers. It submits N effects
(30 % extra duplicate submissions, a couple of small campaigns) over a chaos window, and
meanwhile, on a schedule drawn from ``random.Random(seed)``: SIGKILLs worker processes (the
supervisor restarts them), SIGSTOPs one past its lease then SIGCONTs it, SIGKILLs the ledger
Redis and restarts it from its AOF on the same port, restarts the sandbox (its state file
survives). Then it heals everything, waits until quiescent (bounded), and checks:

* no key executed twice; a DONE key executed exactly once, a FAILED key never, an UNKNOWN
  key at most once (ground truth: the sandbox's own execution counts);
* every submitted key DONE, UNKNOWN (listed with its reason) or FAILED with its message
  dead-lettered with a reason; nothing stuck in CLAIMED/RECONCILING, nothing missing;
* each DONE record settled once, its receipt the provider's; total executions equal the
  executed DONE + UNKNOWN keys; no execution of a key nobody submitted.

Prints a one-screen report and, last, one JSON line ``{"chaos": ..., "violations": [...]}``;
exits 1 on any violation (the seed replays the schedule; process timing still varies).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

from tests.chaos.system import (
    TOOLS,
    Deployment,
    Retrying,
    command_line,
    example_args,
    report,
    seeded,
    spread,
    workdir_for,
)
from workers.dev.sandbox import SandboxConfig

LEASE_S = 3.0  # FAST_ENV's lease of the example tools
LOOKUP_LAG_S = 4.0  # longer than the lease: a lookup right after a takeover misses it
SETTLE_S = 6.0  # the tools' settle window must exceed the lag
TERMINAL = {"DONE", "FAILED", "UNKNOWN"}


@dataclass
class Fault:
    at_s: float
    kind: str
    detail: str = ""


@dataclass
class Submitted:
    keys: dict[str, str] = field(default_factory=dict)  # key -> tool
    statuses: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    campaigns: int = 0
    campaign_keys: int = 0
    tries: Retrying = field(default_factory=Retrying)  # while the ledger Redis is down


def _schedule(rng: random.Random, window_s: float, args: argparse.Namespace) -> list[Fault]:
    kinds = (
        ["kill"] * args.kills
        + ["stop"] * args.stops
        + ["ledger_restart"] * args.redis_restarts
        + ["sandbox_restart"] * args.sandbox_restarts
    )
    return [Fault(round(t, 2), kind) for t, kind in spread(rng, kinds, window_s)]


def _calls(rng: random.Random, n: int, seed: int) -> list[tuple[str, str, dict[str, Any]]]:
    calls: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(n):
        tool = rng.choice(TOOLS)
        calls.append((tool, f"chaos-{seed}-{i}", example_args(tool, i)))
    return calls


def _producer(
    rng: random.Random, args: argparse.Namespace, window_s: float, sub: Submitted
) -> None:
    from workers import campaign_status, get_tool, submit, submit_campaign

    campaign_size = max(3, min(20, args.effects // 30))
    campaigns = min(args.campaigns, max(0, args.effects // (2 * campaign_size)))
    singles = args.effects - campaigns * campaign_size
    calls = _calls(rng, singles, args.seed)
    plan: list[tuple[str, Any]] = [("call", c) for c in calls]
    for c in range(campaigns):
        cid = f"camp-{args.seed}-{c}"
        recipients = [f"member{j}@{cid}.example" for j in range(campaign_size)]
        plan.insert(rng.randrange(len(plan) + 1), ("campaign", (cid, recipients)))
    # 30 % extra submissions: duplicates of calls (or campaigns) submitted earlier.
    for _ in range(int(0.3 * len(plan))):
        position = rng.randrange(1, len(plan) + 1)
        kind, payload = plan[rng.randrange(position)]
        plan.insert(position, ("dup-" + kind, payload))
    spread_s = 0.8 * window_s
    start = time.monotonic()
    give_up = start + window_s + 120
    for i, (kind, payload) in enumerate(plan):
        pause = start + spread_s * i / len(plan) - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        if kind.endswith("call"):
            tool, scope, targs = payload
            handle = sub.tries("submit", partial(submit, tool, scope=scope, **targs), give_up)
            if handle is None:
                continue
            sub.keys[handle.key] = tool
            sub.statuses[("dup:" if kind.startswith("dup") else "") + handle.status.value] += 1
        else:
            cid, recipients = payload
            campaign = sub.tries(
                "campaign",
                partial(submit_campaign, cid, "send_email", recipients, {"subject": "hi"}),
                give_up,
            )
            if campaign is None:
                continue
            sub.statuses[("dup:" if kind.startswith("dup") else "") + "campaign_sent"] += (
                campaign.sent
            )
            status = sub.tries(
                "campaign status", partial(campaign_status, cid, page_size=1000), give_up
            )
            for row in status["recipients"] if status else []:
                sub.keys[row["key"]] = get_tool("send_email").name
            if not kind.startswith("dup"):
                sub.campaigns += 1
                sub.campaign_keys += len(recipients)
        if kind.startswith("dup"):
            sub.duplicates += 1


class Chaos:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        sandbox = SandboxConfig(
            fail_rate=0.05,
            drop_ack_rate=0.02,
            latency_ms=args.latency_ms,
            lookup_lag_s=LOOKUP_LAG_S,
            provider_idempotency=False,
            seed=args.seed,
        )
        self.dep = Deployment(workdir, sandbox, env={"EFFECTQ_EXAMPLE_SETTLE_S": str(SETTLE_S)})
        self.stack = self.dep.stack
        self.faults: list[Fault] = []
        self.stopped: list[psutil.Process] = []
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def log(self, text: str) -> None:
        if not self.args.quiet:
            print(f"[{self.now():7.2f}s] {text}", file=sys.stderr, flush=True)

    # -- faults --------------------------------------------------------------------------

    def _holders(self) -> set[int]:
        """Pids of worker processes holding a live claim right now (from the ledger)."""
        from dedupe import State
        from workers import runtime

        pids: set[int] = set()
        with contextlib.suppress(Exception):
            ledger = runtime.ledger()
            for record in ledger.get_many(ledger.keys_in(State.CLAIMED, limit=500)).values():
                holder = record.holder if record is not None else None
                if holder and "/" in holder:
                    with contextlib.suppress(ValueError):
                        pids.add(int(holder.partition("/")[0].rpartition(":")[2]))
        return pids

    def _victim(self) -> psutil.Process | None:
        """A running worker process, preferably one holding a claim (tried for up to 2 s):
        the seeded schedule says when and which kind; timing decides which claim."""
        deadline = time.monotonic() + 2.0
        while True:
            candidates = []
            for pid in sorted(self.stack.worker_processes()):
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc = psutil.Process(pid)
                    if proc.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                        candidates.append(proc)
            holding = [p for p in candidates if p.pid in self._holders()]
            if holding or time.monotonic() > deadline:
                pick = holding or candidates
                return self.rng.choice(pick) if pick else None
            time.sleep(0.05)

    def inject(self, fault: Fault) -> None:
        fault.at_s = self.now()
        if fault.kind == "kill":
            proc = self._victim()
            if proc is None:
                fault.detail = "no worker process alive"
            else:
                held = "holding a claim" if proc.pid in self._holders() else "idle"
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.send_signal(signal.SIGKILL)
                fault.detail = f"SIGKILL worker pid {proc.pid} ({held})"
        elif fault.kind == "stop":
            proc = self._victim()
            if proc is None:
                fault.detail = "no worker process alive"
            else:
                hold = LEASE_S * 2 + self.rng.uniform(1.0, 3.0)
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.suspend()
                    self.stopped.append(proc)
                    self.log(f"SIGSTOP worker pid {proc.pid} for {hold:.1f}s")
                    time.sleep(hold)
                    proc.resume()
                    self.stopped.remove(proc)
                fault.detail = f"SIGSTOP worker pid {proc.pid} for {hold:.1f}s, then SIGCONT"
        elif fault.kind == "ledger_restart":
            fault.detail = self.dep.restart_ledger(self.rng.uniform(0.5, 2.0))
        elif fault.kind == "sandbox_restart":
            self.stack.sandbox.restart()  # SandboxConfig again; the state file survives
            fault.detail = "sandbox restarted (state file kept)"
        self.faults.append(fault)
        self.log(f"fault {fault.kind}: {fault.detail}")

    def heal(self) -> None:
        for proc in list(self.stopped):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.resume()
        self.stopped.clear()
        if not self.dep.ledger_server.running:
            self.dep.ledger_server.start()
        sandbox = self.stack.sandbox
        if sandbox._proc is None or sandbox._proc.poll() is not None:
            sandbox.start()
        # The provider's fault switches off: what is left to do completes. No latency
        # either: the check looks every DONE receipt up, one GET per key.
        sandbox.configure(fail_rate=0.0, drop_ack_rate=0.0, latency_ms=0.0)

    # -- observation ---------------------------------------------------------------------

    def dead_letters(self) -> dict[str, str]:
        from workers import runtime

        return {
            d["key"]: d["reason"]
            for d in reversed(runtime.ledger().dead_letters(count=100_000))
            if d.get("key")
        }

    def settled(self, keys: list[str]) -> tuple[bool, dict[str, Any]]:
        from workers import runtime

        records = runtime.ledger().get_many(keys)
        held = self.dep.held_messages()
        dead = self.dead_letters()
        states = {k: (r.state.value if r else "ABSENT") for k, r in records.items()}
        waiting = [
            k
            for k, s in states.items()
            if s not in TERMINAL
            or (s == "FAILED" and k not in dead)
            or (s != "UNKNOWN" and held.get(k))
        ]
        stray = [k for k in held if k not in states or states[k] != "UNKNOWN"]
        return not waiting and not stray, {
            "waiting": waiting,
            "states": Counter(states.values()),
        }

    def run(self) -> dict[str, Any]:
        args = self.args
        self.dep.start()  # this process becomes the deployment's producer
        pool = self.stack.start_workers(args.processes, args.threads)
        for _ in range(2):
            self.stack.start_reconciler()
        self.stack.wait_for_workers(args.processes, timeout=60)
        self.t0 = time.monotonic()
        window_s = args.minutes * 60 if args.minutes else max(20.0, args.effects / 12)
        schedule = _schedule(self.rng, window_s, args)
        self.log(f"chaos window {window_s:.0f}s, schedule {[(f.at_s, f.kind) for f in schedule]}")
        sub = Submitted()
        producer = threading.Thread(
            target=_producer, args=(random.Random(args.seed + 1), args, window_s, sub), daemon=True
        )
        producer.start()
        for fault in schedule:
            pause = fault.at_s - (time.monotonic() - self.t0)
            if pause > 0:
                time.sleep(pause)
            self.inject(fault)
        producer.join(timeout=max(0.0, window_s - (time.monotonic() - self.t0)) + 180)
        chaos_s = self.now()
        self.heal()
        healed_at = time.monotonic()
        self.log("healed; waiting for quiescence")
        keys = sorted(sub.keys)
        deadline = healed_at + args.quiesce_timeout
        quiet, progress = False, dict[str, Any]()
        while time.monotonic() < deadline:
            try:
                quiet, progress = self.settled(keys)
            except redis.RedisError as exc:
                progress = {"error": str(exc)}
            if quiet:
                break
            time.sleep(0.5)
        quiescence_s = round(time.monotonic() - healed_at, 2)
        result = self.check(keys, sub, quiet, progress)
        result.update(
            chaos_window_s=round(window_s, 1),
            chaos_s=chaos_s,
            time_to_quiescence_s=quiescence_s,
            supervisor_restarts=self.stack.log("workers.log").count("restarting in"),
            pool_alive=pool.poll() is None,
        )
        return result

    # -- the invariants ------------------------------------------------------------------

    def check(
        self, keys: list[str], sub: Submitted, quiet: bool, progress: dict[str, Any]
    ) -> dict[str, Any]:
        from workers import runtime

        ledger = runtime.ledger()
        violations: list[str] = []
        if not quiet:
            waiting = progress.get("waiting", [])
            violations.append(
                f"not quiescent after {self.args.quiesce_timeout}s: {len(waiting)} keys waiting "
                f"{[k[:12] for k in waiting[:5]]}, progress {progress}"
            )
        if sub.tries.errors:
            violations.append(f"producer gave up: {sub.tries.errors[:3]}")
        if not keys:
            violations.append("nothing was submitted")
        stats = self.stack.sandbox.stats()
        executions: dict[str, int] = stats["executions"]
        records = ledger.get_many(keys)
        dead = self.dead_letters()
        states: Counter[str] = Counter()
        unknown: dict[str, str] = {}
        failed: dict[str, str] = {}
        notes: Counter[str] = Counter()
        late = 0
        time.sleep(LOOKUP_LAG_S + 0.5)  # the provider's lookups show an effect after the lag
        provider = httpx.Client(base_url=self.stack.sandbox.url, timeout=10.0, trust_env=False)
        for key in keys:
            record = records[key]
            count = executions.get(key, 0)
            if record is None:
                violations.append(f"{key[:12]}: lost (no ledger record), executed {count}x")
                continue
            state = record.state.value
            states[state] += 1
            late += len(record.late_receipts)
            for h in record.history:
                notes[_classify(h.state, h.note)] += 1
            if count > 1:
                violations.append(f"{key[:12]}: executed {count} times ({state})")
            if state == "DONE":
                if count != 1:
                    violations.append(f"{key[:12]}: DONE but executed {count} times")
                settles = [h for h in record.history if h.state == "DONE"]
                if len(settles) != 1:
                    violations.append(f"{key[:12]}: DONE written {len(settles)} times")
                if count == 1:
                    answer = provider.get(f"/v1/effects/{key}")
                    theirs = answer.json().get("id") if answer.status_code == 200 else None
                    ours = (record.receipt or {}).get("id")
                    if theirs != ours:
                        violations.append(f"{key[:12]}: receipt {ours} but provider has {theirs}")
            elif state == "UNKNOWN":
                unknown[key] = record.reason
            elif state == "FAILED":
                failed[key] = dead.get(key, "")
                if count:
                    violations.append(f"{key[:12]}: FAILED but executed {count} times")
                if not dead.get(key):
                    violations.append(f"{key[:12]}: FAILED without a dead-letter reason")
            else:
                violations.append(f"{key[:12]}: stuck in {state} ({record.reason})")
        provider.close()
        stray = sorted(set(executions) - set(keys))
        if stray:
            violations.append(f"{len(stray)} executed keys nobody submitted: {stray[:3]}")
        executed_keys = sum(1 for k in keys if executions.get(k))
        if stats["total"] != sum(executions.values()):
            violations.append(f"sandbox total {stats['total']} != sum of its counts")
        expected_total = sum(min(executions.get(k, 0), 1) for k in keys)
        if stats["total"] != expected_total:
            violations.append(f"{stats['total']} executions for {expected_total} executed keys")
        counts = ledger.counts()
        return {
            "chaos": "violations" if violations else "ok",
            "seed": self.args.seed,
            "config": {
                "effects": self.args.effects,
                "processes": self.args.processes,
                "threads": self.args.threads,
                "reconcilers": 2,
                "sandbox": {
                    "fail_rate": 0.05,
                    "drop_ack_rate": 0.02,
                    "latency_ms": self.args.latency_ms,
                    "lookup_lag_s": LOOKUP_LAG_S,
                    "provider_idempotency": False,
                },
                "lease_s": LEASE_S,
                "settle_s": SETTLE_S,
            },
            "faults": dict(Counter(f.kind for f in self.faults)),
            "fault_log": [f"{f.at_s}s {f.kind}: {f.detail}" for f in self.faults],
            "submitted": {
                "keys": len(keys),
                "submissions": sum(sub.statuses.values()),
                "duplicate_submissions": sub.duplicates,
                "campaigns": sub.campaigns,
                "campaign_keys": sub.campaign_keys,
                "statuses": dict(sub.statuses),
                "producer_retries": sub.tries.retries,
            },
            "duplicates_suppressed": {
                "at_submit": sum(v for (k, _), v in counts.items() if k == "dup_submit"),
                "at_claim": sum(v for (k, _), v in counts.items() if k == "dup_claim"),
            },
            "fenced_writes": {op: v for (k, op), v in counts.items() if k == "fenced"},
            "late_receipts": late,
            "states": dict(states),
            "executions": stats["total"],
            "executed_keys": executed_keys,
            "observed": dict(notes),
            "unknown": {k[:16]: r for k, r in unknown.items()},
            "failed": {k[:16]: r for k, r in failed.items()},
            "violations": violations,
        }


def _classify(state: str, note: str) -> str:
    """A ledger transition, by what it says happened (the report's 'observed' section)."""
    if "found at the provider" in note:
        return "reconciled: found"
    if "not found after the settle window" in note:
        return "reconciled: not found -> FAILED"
    if state == "UNKNOWN":
        return "reconciled: UNKNOWN"
    if note.startswith("handover:"):
        # A lost acknowledgement (or a crash mid-request): the outcome was uncertain.
        return f"handed over uncertain ({note[9:].split(':')[0].strip()})"
    if "503" in note:
        return "provider 5xx (not executed)"
    if "unreachable" in note:
        return "provider unreachable (not executed)"
    if "stale fencing token" in note:
        return "provider refused a stale token"
    if state == "RECONCILING":
        return "taken over by a reconciler"
    if state in ("CLAIMED", "DONE", "FAILED"):
        return state.lower()
    return state.lower() + ": " + note[:40]


def render(result: dict[str, Any]) -> str:
    sub = result.get("submitted", {})
    lines = [
        f"effectq chaos — seed {result['seed']} — {result['chaos'].upper()}",
        f"  config      {json.dumps(result.get('config', {}))}",
        f"  faults      {result.get('faults')}  (+ sandbox 5xx / lost acks, see observed)",
    ]
    lines += [f"              {entry}" for entry in result.get("fault_log", [])]
    lines += [
        f"  submitted   {sub.get('keys')} keys in {sub.get('submissions')} submissions "
        f"({sub.get('duplicate_submissions')} duplicates, {sub.get('campaigns')} campaigns "
        f"/ {sub.get('campaign_keys')} recipients), statuses {sub.get('statuses')}, "
        f"producer retries {sub.get('producer_retries')}",
        f"  suppressed  {result.get('duplicates_suppressed')}  fenced {result.get('fenced_writes')}"
        f"  late receipts {result.get('late_receipts')}",
        f"  states      {result.get('states')}  executions {result.get('executions')}",
        f"  observed    {result.get('observed')}",
        f"  timing      chaos {result.get('chaos_s')}s (window {result.get('chaos_window_s')}s),"
        f" quiescent {result.get('time_to_quiescence_s')}s after healing, "
        f"supervisor restarts {result.get('supervisor_restarts')}",
    ]
    for key, reason in result.get("unknown", {}).items():
        lines.append(f"  UNKNOWN     {key}: {reason}")
    for key, reason in result.get("failed", {}).items():
        lines.append(f"  FAILED      {key}: {reason}")
    for violation in result.get("violations", [])[:20]:
        lines.append(f"  VIOLATION   {violation}")
    if result.get("violations"):
        lines.append(f"  replay with --seed {result['seed']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = command_line("python -m tests.chaos.harness", __doc__, processes=3, quiesce_timeout=180.0)
    p.add_argument("--effects", type=int, default=300)
    p.add_argument("--kills", type=int, default=3, help="worker processes SIGKILLed")
    p.add_argument("--stops", type=int, default=1, help="workers SIGSTOPped past their lease")
    p.add_argument("--redis-restarts", type=int, default=1, help="ledger Redis SIGKILL+restart")
    p.add_argument("--sandbox-restarts", type=int, default=1)
    p.add_argument("--minutes", type=float, default=None, help="chaos window (default N/12 s)")
    p.add_argument("--campaigns", type=int, default=2)
    p.add_argument("--latency-ms", type=float, default=20.0)
    return seeded(p.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as cleanup:
        chaos = Chaos(args, workdir_for(cleanup, args.keep, "chaos-"))
        cleanup.callback(chaos.dep.stop)
        try:
            result = chaos.run()
        except Exception as exc:  # the report still says what broke, and the seed
            result = {"chaos": "error", "seed": args.seed, "violations": [f"harness: {exc!r}"]}
            with contextlib.suppress(Exception):
                print(chaos.stack.log("workers.log")[-3000:], file=sys.stderr)
    return report(result, render)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
