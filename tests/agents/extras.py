"""What the agent tests need: the optional extras (``require``: skipped on a laptop without
them, a failure under CI=true, where ``.[dev]`` includes them; called at a test module's
top, so unlike ``tests.support.requires.unavailable`` it skips the whole module), and the
environment that keeps CrewAI offline."""

from __future__ import annotations

import importlib.util
import os

import pytest

# CrewAI's telemetry, tracing and version check, off before CrewAI is imported.
OFFLINE_ENV = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
}


def require(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is not None:
        return
    reason = f"{module} is not installed: pip install -e '.[{extra}]'"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true requires it", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
