"""The adapters are optional: the core never imports a framework, and an adapter imported
without its extra says which extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("adapter", "framework", "extra"),
    [
        ("crewai", "crewai", "crewai"),
        ("langchain", "langchain_core", "langchain"),
        ("langchain_agent", "langchain", "langchain-agent"),
        ("mcp", "mcp", "mcp"),
        ("upstream", "mcp", "mcp"),
    ],
)
def test_an_adapter_without_its_extra_says_which_extra_to_install(
    adapter: str, framework: str, extra: str
) -> None:
    # None in sys.modules makes any import of the framework fail, as if not installed.
    blocked = f"import sys; sys.modules[{framework!r}] = None; "
    done = _python(f"{blocked}import workers.agents.{adapter}")
    assert done.returncode == 1
    assert f"ImportError: workers.agents.{adapter} needs" in done.stderr
    assert f"pip install 'effectq[{extra}]'" in done.stderr


def test_the_core_and_the_guard_import_no_agent_framework() -> None:
    done = _python(
        "import sys, workers, workers.guard, workers.agents, workers.agents.resume; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'crewai', 'langchain_core', 'langchain', 'langgraph', 'mcp'}))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
