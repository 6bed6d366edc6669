"""Release hygiene of the chart: one version everywhere, and a chart Helm packages as is.

* A clone tagged by the release command (``python -m tests.chart.release X.Y.Z``) builds
  package version X.Y.Z (setuptools-scm), and its chart renders X.Y.Z as the image tag, the
  ``app.kubernetes.io/version`` label of every object and every pod, and the appVersion.
  (``effectq_build_info`` and ``effectq --version`` read the package's version:
  tests/unit/test_build_info.py; the image: tests/image.)
* The chart holds no symlink (Helm warns about them and a packaged chart must carry
  contents): the dashboard is the chart's own file, deploy/grafana's is a link to it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from tests.chart._chart import CHART, NAMESPACE, RELEASE, ROOT, VARIANTS, helm_template

VERSION_LABEL = "app.kubernetes.io/version"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "release test",
    "GIT_AUTHOR_EMAIL": "release@example.invalid",
    "GIT_COMMITTER_NAME": "release test",
    "GIT_COMMITTER_EMAIL": "release@example.invalid",
}


def run(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **GIT_ENV},
    )  # fmt: skip
    assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def rendered_objects(helm: ModuleType, chart_dir: Path, values: dict[str, Any]) -> list[Any]:
    with helm.Chart.load(chart_dir) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    files, _ = helm_template(manifests)
    return [o for text in files.values() for o in yaml.safe_load_all(text) if o]


def test_a_tagged_release_has_one_version_in_package_chart_image_and_labels(
    helm: ModuleType, tmp_path: Path
) -> None:
    clone = tmp_path / "clone"
    run("git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone), cwd=tmp_path)
    run(sys.executable, "-m", "tests.chart.release", "9.8.7", cwd=clone)
    assert run("git", "describe", "--tags", "--exact-match", cwd=clone).strip() == "v9.8.7"
    assert run(sys.executable, "-m", "setuptools_scm", cwd=clone).strip() == "9.8.7"

    chart = yaml.safe_load((clone / "charts" / "effectq" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == ("9.8.7", "9.8.7")
    # Everything on (the API too), the image by tag: what a release installs.
    values = {**VARIANTS["full"], "image": {}}
    objects = rendered_objects(helm, clone / "charts" / "effectq", values)
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    assert {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            for d in deployments} >= {"worker", "reconciler", "api"}  # fmt: skip
    for obj in objects:
        assert obj["metadata"]["labels"][VERSION_LABEL] == "9.8.7", obj["metadata"]
    for deployment in deployments:
        pod = deployment["spec"]["template"]
        assert pod["metadata"]["labels"][VERSION_LABEL] == "9.8.7", deployment["metadata"]
        for container in pod["spec"]["containers"]:
            assert container["image"] == "effectq:9.8.7", container["image"]


def test_the_version_label_follows_an_image_tag_set_in_values(helm: ModuleType) -> None:
    objects = rendered_objects(helm, CHART, {"image": {"tag": "1.2.3+local.1"}})
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]
        # "+" is not allowed in a label value; the image keeps the tag as given.
        assert pod["metadata"]["labels"][VERSION_LABEL] == "1.2.3_local.1"
        assert pod["spec"]["containers"][0]["image"] == "effectq:1.2.3+local.1"


def test_the_committed_chart_carries_the_last_tagged_version() -> None:
    """Forgetting the release command between two tags shows here: the chart's appVersion is
    the last v-tag's version (0.1.0, the last release before tags, while there is none)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["appVersion"]), chart["appVersion"]
    assert chart["version"] == chart["appVersion"]
    described = subprocess.run(
        ["git", "describe", "--tags", "--abbrev=0", "--match", "v[0-9]*"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    last = described.stdout.strip()[1:] if described.returncode == 0 else "0.1.0"
    assert chart["appVersion"] == last, (chart["appVersion"], last)


def test_the_chart_holds_no_symlink_and_the_dashboard_is_its_own_file() -> None:
    links = [str(p.relative_to(CHART)) for p in CHART.rglob("*") if p.is_symlink()]
    assert links == [], f"Helm warns about links and packages contents: {links}"
    dashboard = CHART / "files" / "effectq.json"
    assert dashboard.is_file() and not dashboard.is_symlink()
    # Setups without Helm read deploy/grafana/effectq.json: the same bytes.
    assert (ROOT / "deploy" / "grafana" / "effectq.json").read_bytes() == dashboard.read_bytes()


def test_the_release_command_refuses_anything_but_a_plain_release_version() -> None:
    before = (CHART / "Chart.yaml").read_text()
    for version in ("0.3", "v0.3.0", "0.3.0+local", "0.3.0rc1", "01.2.3"):
        done = subprocess.run(
            [sys.executable, "-m", "tests.chart.release", version],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2 and "X.Y.Z" in done.stderr, (version, done)
    assert (CHART / "Chart.yaml").read_text() == before  # nothing stamped
