"""The runbooks run: every command docs/runbooks/ gives an on-call, pasted into bash against
a live local stack (real redis-server, the sandbox, the shipped tools), through the pages'
own `eq` shorthand pointed at the local `effectq`. None may be a usage error (exit 2): a
refusal by the state table (8) or "not found" (6) is an answer, a usage error is a broken
page. The `kubectl` lines need a cluster; they are counted, and every line of a command block
is one of the two kinds (or the shorthand's definition)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

from dedupe import ConflictError, State
from tests.support.ledgers import unknown_charge
from workers import runtime
from workers.dev.local import LocalStack

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
PROSE = re.compile(r"`(eq [^`]+)`")
PLACEHOLDER = re.compile(r"\b(KEY|TOOL|REASON|YOU|PREFIX|MESSAGE_ID)\b")


def commands() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(page, command) of every `eq` command and of every `kubectl` line."""
    eq: list[tuple[str, str]] = []
    cluster: list[tuple[str, str]] = []
    for page in sorted(RUNBOOKS.glob("*.md")):
        text = page.read_text()
        for block in FENCE.findall(text):
            for raw in block.replace("\\\n", " ").splitlines():
                command = raw.split("  #")[0].strip()
                if not command or command.startswith("#"):
                    continue
                if command.startswith("eq "):
                    eq.append((page.name, command))
                elif command.startswith("kubectl "):
                    cluster.append((page.name, command))
                else:
                    assert page.name == "README.md" and command.startswith(("NS=", "eq()")), (
                        f"{page.name}: neither an eq command nor a kubectl line: {command}"
                    )
        eq += [(page.name, " ".join(c.split())) for c in PROSE.findall(text)]
    return eq, cluster


def test_every_runbook_command_runs_without_a_usage_error(live: LocalStack) -> None:
    eq, cluster = commands()
    key = unknown_charge(runtime.ledger())
    # A dead letter as the worker's middleware records one (its reason text included).
    conflict = ConflictError("charge: bound fields differ from the recorded effect (DONE)")
    runtime.current().record_dead_letter(
        message_id="m-1", tool="charge", key=key, reason=f"{type(conflict).__name__}: {conflict}",
        kind="conflict",
    )  # fmt: skip
    values = {"KEY": key, "PREFIX": key[:12], "TOOL": "charge", "REASON": "conflict", "YOU": "sre",
              "MESSAGE_ID": str(uuid.uuid4())}  # fmt: skip
    effectq = shlex.quote(str(Path(sys.executable).parent / "effectq"))
    failures: list[str] = []
    for page, command in eq:
        pasted = PLACEHOLDER.sub(lambda m: values[m.group(1)], command)
        if "..." in shlex.split(pasted):
            failures.append(f"{page}: {command}\n  a '...' no one can paste")
            continue
        done = subprocess.run(
            ["bash", "-c", f'eq() {{ {effectq} "$@"; }}\n{pasted}'],
            env=live.env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if done.returncode == 2 or "Traceback" in done.stderr:
            failures.append(f"{page}: {command}\n  exit {done.returncode}: {done.stderr.strip()}")
    print(f"\nrunbooks: {len(eq)} eq commands run, {len(cluster)} kubectl lines (need a cluster)")
    assert not failures, "\n".join(failures)
    assert len(eq) >= 15 and len(cluster) >= 15
    # They ran against the stack: the resolve in the README's rule settled the effect.
    assert runtime.ledger().get(key).state is not State.UNKNOWN  # type: ignore[union-attr]
