"""Writes image-requirements.txt, the lock file the Dockerfile installs from:
``python -m tests.image.lock`` (needs PyPI; uv, from the dev extra).

Every distribution the image installs, pinned with its hashes: the ``fast`` and ``api``
extras' closure (what ``effectq worker``, ``reconciler`` and ``api`` import) and the build
backend (pyproject's ``[build-system] requires``: the project itself is built in the image
without build isolation, so nothing is fetched unpinned). For the image's Python, 3.11 on
x86-64 glibc Linux (Debian bookworm, python:3.11-slim). test_lock checks offline that the
lock still satisfies pyproject."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "image-requirements.txt"
#: The extras `pip install` gives the project in the Dockerfile.
EXTRAS = ("fast", "api")
PYTHON = "3.11"
PLATFORM = "x86_64-manylinux_2_36"  # bookworm's glibc 2.36
COMMAND = "python -m tests.image.lock"


def build_requirements() -> list[str]:
    requires: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"][
        "requires"
    ]
    return requires


def main() -> int:
    extras = [arg for extra in EXTRAS for arg in ("--extra", extra)]
    done = subprocess.run(
        [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "pyproject.toml", "-",
         *extras, "--generate-hashes", "--python-version", PYTHON, "--python-platform",
         PLATFORM, "--custom-compile-command", COMMAND, "--output-file", str(LOCK)],
        input="\n".join(build_requirements()) + "\n", text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
