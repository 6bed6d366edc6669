"""The image's lock (image-requirements.txt) is current with pyproject.toml, checked offline:
every requirement the image installs (the project's dependencies, its ``fast`` and ``api``
extras, the build backend) has one pinned line with hashes, and the pin satisfies the range
pyproject gives it; the Dockerfile installs from the lock with hashes required.
Refresh: ``python -m tests.image.lock`` (docs/release.md). The build of the image then
proves the rest (``pip check`` after a ``--no-deps`` install: nothing the closure needs is
missing)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.image.lock import COMMAND, EXTRAS, LOCK, PYTHON, ROOT, build_requirements

STALE = f"image-requirements.txt is stale: refresh it with `{COMMAND}` (needs PyPI)"
# The image's interpreter: the markers are evaluated for it, not for the test's.
IMAGE_ENV = {
    **default_environment(),
    "python_version": PYTHON,
    "python_full_version": f"{PYTHON}.2",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def locked() -> dict[str, tuple[Version, list[str]]]:
    """name -> (pinned version, hashes), from the lock's requirement lines."""
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())  # join continued lines
    pins: dict[str, tuple[Version, list[str]]] = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        spec, *options = line.split(" --")
        requirement = Requirement(spec)
        (pin,) = requirement.specifier
        assert pin.operator == "==", f"{line[:80]}: not pinned with =="
        hashes = [o.strip().removeprefix("hash=") for o in options if o.startswith("hash=")]
        pins[canonicalize_name(requirement.name)] = (Version(pin.version), hashes)
    return pins


def image_requirements() -> list[Requirement]:
    """What the image installs, from pyproject: dependencies, the extras (and the extras
    they name of effectq itself), the build backend; those whose markers apply."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional: dict[str, list[str]] = project["optional-dependencies"]
    found = [Requirement(r) for r in project["dependencies"] + build_requirements()]
    todo, seen = list(EXTRAS), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == "effectq":
                todo.extend(requirement.extras)
            else:
                found.append(requirement)
    return [r for r in found if r.marker is None or r.marker.evaluate(IMAGE_ENV)]


def test_every_line_of_the_lock_is_pinned_with_hashes() -> None:
    pins = locked()
    assert len(pins) >= 20, sorted(pins)
    unhashed = [name for name, (_, hashes) in pins.items() if not hashes]
    assert unhashed == [], f"no --hash for {unhashed}: {STALE}"
    assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for _, hs in pins.values() for h in hs)
    assert "effectq" not in pins  # the project itself is installed from the build context


def test_every_requirement_of_the_image_is_locked_within_its_range() -> None:
    pins = locked()
    requirements = image_requirements()
    assert {"redis", "dramatiq", "fastapi", "uvicorn", "hiredis", "setuptools-scm"} <= {
        canonicalize_name(r.name) for r in requirements
    }
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in the lock: {STALE}"
        version = pins[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{requirement}: the lock pins {version}: {STALE}"
        )
        # An extra of a dependency (dramatiq[redis,rabbitmq]) is resolved by the lock's
        # tool; its packages are checked by the image build's `pip check`.


def test_the_dockerfile_installs_from_the_lock_with_hashes_required() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY image-requirements.txt" in dockerfile
    assert "pip install --require-hashes --no-deps -r image-requirements.txt" in dockerfile
    assert "--no-deps --no-build-isolation --no-index" in dockerfile  # the project alone
    assert "!image-requirements.txt" in (ROOT / ".dockerignore").read_text()
    assert Path(LOCK).name == "image-requirements.txt"
