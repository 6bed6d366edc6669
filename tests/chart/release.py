"""The release command: ``python -m tests.chart.release X.Y.Z`` stamps the chart's
``version`` and ``appVersion`` with X.Y.Z, commits Chart.yaml and tags that commit vX.Y.Z
(annotated). The package's version is the tag's (setuptools-scm), so the package, the
chart, the image built from the tag (``--build-arg VERSION=X.Y.Z``), its pods' labels and
``effectq_build_info`` say the same version. docs/release.md has the whole procedure;
test_chart_release runs this command in a clone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.chart._chart import CHART

# A plain release: the chart's version must be SemVer, the image tag and the label value
# may not carry a PEP 440 local part ("+").
RELEASE = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")


def stamp(chart_yaml: Path, version: str) -> None:
    """Rewrite the two version lines of Chart.yaml in place (its comments stay)."""
    text = chart_yaml.read_text()
    text, charts = re.subn(r"(?m)^version: .*$", f"version: {version}", text)
    text, apps = re.subn(r"(?m)^appVersion: .*$", f'appVersion: "{version}"', text)
    if (charts, apps) != (1, 1):
        raise SystemExit(f"{chart_yaml}: expected one version and one appVersion line")
    chart_yaml.write_text(text)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not RELEASE.fullmatch(argv[0]):
        sys.stderr.write("usage: python -m tests.chart.release X.Y.Z (a plain release version)\n")
        return 2
    version = argv[0]
    chart_yaml = CHART / "Chart.yaml"
    root = CHART.parents[1]

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(root), *args], check=True)

    stamp(chart_yaml, version)
    git("commit", "-m", f"Release {version}: the chart's version and appVersion", "--",
        str(chart_yaml.relative_to(root)))  # fmt: skip
    git("tag", "-a", f"v{version}", "-m", f"effectq {version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
