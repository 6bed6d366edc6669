"""What a test needs from the machine: skipped with a clear reason on a laptop that lacks
it, a failure under CI=true (CI installs everything; a skip there would hide a gap)."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true requires it", pytrace=False)
    pytest.skip(reason)


def need_binary(binary: str, hint: str) -> str:
    path = shutil.which(binary)
    if path is None:
        unavailable(f"{binary} not on PATH ({hint})")
    return path
