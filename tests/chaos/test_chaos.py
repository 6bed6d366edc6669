"""CI chaos run: a small seeded configuration of the harness, as a subprocess (its own
Redis servers, sandbox, pool and reconcilers; nothing shared with the session stack).

Replay a failure locally with the printed command (same seed, same schedule).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_chaos_small_configuration_has_no_violation() -> None:
    seed = int(os.environ.get("EFFECTQ_CHAOS_SEED", "20261201"))
    argv = ["--effects", "300", "--seed", str(seed), "--kills", "3", "--stops", "1",
            "--redis-restarts", "1", "--sandbox-restarts", "1", "--quiesce-timeout", "120",
            "--quiet"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "tests.chaos.harness", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=230,
    )
    # The report on stdout: pytest shows it on failure, and with -rA on success.
    print(f"$ python -m tests.chaos.harness {' '.join(argv)}\n{done.stdout}")
    if done.stderr.strip():
        print(done.stderr[-4000:], file=sys.stderr)
    lines = done.stdout.strip().splitlines()
    assert lines, f"no report (exit {done.returncode}):\n{done.stderr[-4000:]}"
    result = json.loads(lines[-1])
    assert result["violations"] == [], f"replay with --seed {seed}"
    assert done.returncode == 0
    assert (
        result["states"].get("DONE", 0)
        + result["states"].get("UNKNOWN", 0)
        + result["states"].get("FAILED", 0)
        == result["submitted"]["keys"]
    )
    assert result["faults"] == {"kill": 3, "stop": 1, "ledger_restart": 1, "sandbox_restart": 1}
    assert result["submitted"]["duplicate_submissions"] > 0
    assert result["executions"] == result["executed_keys"]
