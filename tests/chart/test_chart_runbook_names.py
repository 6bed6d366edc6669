"""The runbooks' kubectl lines name objects the chart really makes, whatever the release is
called: the shorthand's variables as NOTES.txt prints them for the release, substituted
into every `deploy/...` the pages name. A release named `effectq` makes `effectq-reconciler`,
not `effectq-effectq-reconciler`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart._chart import helm_template

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
DEPLOY = re.compile(r'deploy[/ ]"?(\$[A-Z]+"?-[A-Za-z0-9$"-]*)')


def _named(text: str, variables: dict[str, str]) -> str:
    name = text.replace('"', "").replace("POOL", "default")
    for var, value in variables.items():
        name = name.replace(f"${var}", value)
    return name


@pytest.mark.parametrize("release", ["eq", "effectq", "effectq-prod"])
def test_every_deployment_a_runbook_names_exists_for_the_release(chart: Any, release: str) -> None:
    manifests = chart.render({}, name=release, namespace="ops", is_install=True)
    files, notes = helm_template(manifests)
    deployments = {
        o["metadata"]["name"]
        for text in files.values()
        for o in yaml.safe_load_all(text)
        if o and o["kind"] == "Deployment"
    }
    shorthand = re.search(r"^\s*NS=(\S+) RELEASE=(\S+) NAME=(\S+)$", notes, re.M)
    assert shorthand is not None, notes
    variables = dict(zip(("NS", "RELEASE", "NAME"), shorthand.groups(), strict=True))
    assert variables["NS"] == "ops" and variables["RELEASE"] == release
    named = [
        (page.name, _named(m, variables))
        for page in sorted(RUNBOOKS.glob("*.md"))
        for m in DEPLOY.findall(page.read_text())
    ]
    assert any(page == "README.md" for page, _ in named)  # the eq() shorthand itself
    assert len(named) >= 7
    for page, name in named:
        assert name in deployments, f"{page}: deploy/{name} (release {release}): {deployments}"


def test_the_readme_example_is_what_the_chart_prints_for_its_release(chart: Any) -> None:
    line = next(
        line for line in (RUNBOOKS / "README.md").read_text().splitlines() if line.startswith("NS=")
    )
    release = re.search(r"RELEASE=(\S+)", line)
    assert release is not None
    manifests = chart.render({}, name=release.group(1), namespace="effectq", is_install=True)
    _, notes = helm_template(manifests)
    assert f"  {line}\n" in notes, notes
