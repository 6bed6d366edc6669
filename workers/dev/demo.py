"""``effectq demo``: the whole pipeline on this machine, under a worker crash.

Embedded durable Redis (unless ``EFFECTQ_REDIS_URL`` is set), the sandbox provider with
faults and its own idempotency switched off (so effectq alone must prevent duplicates), a
pool of two worker processes, a reconciler; a few hundred calls with ~30 % duplicate
submissions and a few conflicting ones; one worker process SIGKILLed mid-run. Then it
waits for every effect to settle and checks the invariants against the provider's own
count of executions.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from dedupe.states import AT_REST

from .local import LocalStack
from .sandbox import SandboxConfig

__all__ = ["run_demo"]

SETTLED = {state.value for state in AT_REST}


def _calls(n_unique: int, rng: random.Random) -> list[tuple[str, str, dict[str, Any]]]:
    calls: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(n_unique):
        kind = i % 3
        if kind == 0:
            args: dict[str, Any] = {"recipient": f"user{i}@example.com", "subject": "Your receipt"}
            calls.append(("send_email", f"order-{i}", args))
        elif kind == 1:
            args = {
                "customer": f"cus_{i}",
                "amount": f"{rng.randint(1, 500)}.00",
                "currency": "usd",
            }
            calls.append(("charge", f"order-{i}", args))
        else:
            calls.append(("set_value", f"op-{i}", {"target": f"acct-{i}", "value": i}))
    return calls


def run_demo(
    *, calls: int = 300, duplicate_rate: float = 0.3, seed: int = 7, console: Console
) -> dict[str, Any]:
    rng = random.Random(seed)
    started = time.monotonic()
    sandbox = SandboxConfig(
        fail_rate=0.03, drop_ack_rate=0.02, latency_ms=50, provider_idempotency=False, seed=seed
    )
    with LocalStack(redis_url=os.environ.get("EFFECTQ_REDIS_URL"), sandbox=sandbox) as stack:
        runtime = stack.apply_env()
        from dedupe import State

        from .. import examples  # noqa: F401  (declares the tools in this process)
        from ..producer import Status, submit

        pool = stack.start_workers(processes=2, threads=8)
        stack.start_reconciler()
        stack.wait_for_workers(2)
        console.print(
            f"ledger {stack.ledger_url}, sandbox {stack.sandbox.url}, 2 workers x 8 threads"
        )

        n_unique = max(3, round(calls * (1 - duplicate_rate)))
        unique = _calls(n_unique, rng)
        order = unique + [rng.choice(unique) for _ in range(calls - n_unique)]
        rng.shuffle(order)
        at_submit: Counter[str] = Counter()
        keys: set[str] = set()
        killed: list[int] = []
        # A live line on a terminal (nothing when stderr is a pipe or a file).
        live = console.status("submitting")
        live.start()
        for i, (tool, scope, args) in enumerate(order):
            if tool == "send_email":  # a re-worded replay is still the same effect
                args = {**args, "subject": rng.choice(["Your receipt", "Receipt enclosed"])}
            handle = submit(tool, scope=scope, **args)
            at_submit[handle.status.value] += 1
            keys.add(handle.key)
            if i == len(order) // 3 and not killed:
                victim = stack.worker_processes(pool)[0]
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)
                console.print(f"SIGKILLed worker process {victim} after {i} submissions")
            if i % 10 == 0:
                live.update(f"submitting {i + 1}/{len(order)}: {_words(at_submit)}")
        conflicts = 0
        for tool, scope, args in unique[1::3][:5]:  # the same orders, another amount
            handle = submit(tool, scope=scope, **{**args, "amount": "999.00"})
            conflicts += handle.status is Status.CONFLICT
        ledger = runtime.ledger()
        deadline = time.monotonic() + 120
        states: Counter[str] = Counter()
        records = {}
        while time.monotonic() < deadline:
            records = {key: ledger.get(key) for key in keys}
            states = Counter(r.state.value if r else "ABSENT" for r in records.values())
            live.update(f"settling {len(keys)} effects: {_words(states)}")
            if set(states) <= SETTLED and not states.get("FAILED"):
                break
            time.sleep(0.5)
        live.stop()
        stats = stack.stats()
        executions: dict[str, int] = stats["executions"]
        counts = ledger.counts()
        violations: list[str] = []
        twice = [k for k, n in executions.items() if n > 1]
        if twice:
            violations.append(f"{len(twice)} effects executed more than once")
        for key, record in records.items():
            if record is not None and record.state is State.DONE and executions.get(key) != 1:
                violations.append(f"{key[:12]} DONE but executed {executions.get(key, 0)} times")
        stuck = {k: r for k, r in records.items() if r is None or r.state.value not in SETTLED}
        if stuck:
            violations.append(f"{len(stuck)} effects not settled after the deadline")
        unresolved = [
            {"key": k, "state": r.state.value if r else "ABSENT", "reason": r.reason if r else ""}
            for k, r in records.items()
            if r is None or r.state is not State.DONE
        ]
        summary = {
            "submitted": len(order) + 5,
            "unique_effects": len(keys),
            "at_submit": dict(at_submit),
            "executed_at_provider": stats["total"],
            "keys_executed": len(executions),
            "max_executions_per_key": max(executions.values(), default=0),
            "duplicates_suppressed": {
                "submit": sum(v for (k, _), v in counts.items() if k == "dup_submit"),
                "claim": sum(v for (k, _), v in counts.items() if k == "dup_claim"),
            },
            "conflicts_refused": conflicts,
            "fenced_writes": sum(v for (k, _), v in counts.items() if k == "fenced"),
            "reconciled": sum(
                any("reconciled" in h.note for h in r.history) for r in records.values() if r
            ),
            "final_states": dict(states),
            "workers_killed": len(killed),
            "unresolved": unresolved,
            "violations": violations,
            "seconds": round(time.monotonic() - started, 1),
        }
    _print(summary, console)
    return summary


def _words(counts: Mapping[str, Any]) -> str:
    """``{'enqueued': 210, 'pending': 90}`` as ``enqueued 210, pending 90``."""
    return ", ".join(f"{name} {value}" for name, value in sorted(counts.items())) or "none"


def _print(summary: dict[str, Any], console: Console) -> None:
    table = Table(title="effectq demo", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for name in (
        "submitted", "unique_effects", "at_submit", "executed_at_provider",
        "max_executions_per_key", "duplicates_suppressed", "conflicts_refused",
        "fenced_writes", "reconciled", "final_states", "workers_killed", "seconds",
    ):  # fmt: skip
        value = summary[name]
        table.add_row(
            name.replace("_", " "), _words(value) if isinstance(value, dict) else str(value)
        )
    console.print(table)
    for item in summary["unresolved"]:
        console.print(f"unresolved {item['key'][:16]}… {item['state']}: {item['reason']}")
    if summary["violations"]:
        for violation in summary["violations"]:
            console.print(f"[bold red]VIOLATION[/] {violation}")
    else:
        console.print("[bold green]invariants hold[/]: no effect executed twice, none lost")
