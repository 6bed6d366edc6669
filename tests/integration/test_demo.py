"""`effectq demo` end to end, as a user runs it: no EFFECTQ_* environment, embedded Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_demo_runs_end_to_end_and_reports_no_violation() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECTQ_")}
    done = subprocess.run(
        [sys.executable, "-m", "workers", "demo", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["violations"] == []
    assert summary["workers_killed"] == 1
    assert summary["final_states"] == {"DONE": summary["unique_effects"]}
    assert summary["executed_at_provider"] == summary["unique_effects"] == 210
    assert summary["max_executions_per_key"] == 1
    assert summary["duplicates_suppressed"]["submit"] >= 90
    assert summary["conflicts_refused"] == 5
    assert "invariants hold" in done.stderr
    assert "{'" not in done.stderr  # the summary in words, not Python reprs
    assert "\x1b[" not in done.stderr + done.stdout  # no terminal codes into a pipe
