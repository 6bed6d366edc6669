"""Every rendered variant through the validators: kubernetes-validate (strict, Kubernetes
1.30), checkov (no failed check; skips only from the chart's own annotations), yamllint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.chart._chart import VARIANTS, Rendered
from tests.support.requires import unavailable

KUBERNETES = "1.30"
# Custom resources: kubernetes-validate has no schema for them (their operators' CRDs do).
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "ScaledObject"}
# checkov checks the chart skips, each with its reason in the annotation (docs/helm.md).
SKIPPED = {"CKV_K8S_15", "CKV_K8S_35", "CKV_K8S_43"}


def _tool(name: str) -> ModuleType:
    try:
        return __import__(name)
    except ImportError as exc:
        unavailable(f"{name} is not installed ({exc}; pip install -e '.[chart-test]')")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kubernetes_validate_strict_accepts_every_object(
    variants: dict[str, Rendered], variant: str
) -> None:
    validate = _tool("kubernetes_validate")
    without_schema = set()
    for obj in variants[variant].objects:
        try:
            assert validate.validate(obj, KUBERNETES, strict=True) == KUBERNETES
        except validate.SchemaNotFoundError:
            without_schema.add(obj["kind"])
        except validate.ValidationError as exc:
            where = ".".join(map(str, exc.path))
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {exc.message}")
    # A misspelt built-in apiVersion would land here too: only the custom kinds may.
    assert without_schema <= CUSTOM_KINDS


def test_strict_validation_catches_an_unknown_field(variants: dict[str, Rendered]) -> None:
    validate = _tool("kubernetes_validate")
    deployment = json.loads(json.dumps(variants["default"].all("Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["secutiryContext"] = {}
    with pytest.raises(validate.ValidationError, match="secutiryContext"):
        validate.validate(deployment, KUBERNETES, strict=True)


@pytest.fixture(scope="module")
def checkov(rendered_dir: Path) -> dict[str, Any]:
    """One checkov run over every variant (it takes a few seconds to start)."""
    _tool("checkov")
    run = subprocess.run(
        [sys.executable, "-m", "checkov.main", "--directory", str(rendered_dir),
         "--framework", "kubernetes", "--output", "json", "--skip-download", "--compact"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stderr[-2000:]  # 1: some check failed
    report: dict[str, Any] = json.loads(run.stdout)
    return report


def _variant(result: dict[str, Any]) -> str:
    return Path(result["file_path"]).parts[1]


def test_checkov_finds_nothing(checkov: dict[str, Any]) -> None:
    failed = [
        f"{_variant(r)}: {r['check_id']} {r['check_name']} ({r['resource']})"
        for r in checkov["results"]["failed_checks"]
    ]
    assert failed == []
    assert checkov["summary"]["passed"] > 0
    # Every variant was scanned.
    assert {_variant(r) for r in checkov["results"]["passed_checks"]} == set(VARIANTS)


def test_checkov_skips_only_what_the_chart_annotates_with_a_reason(
    checkov: dict[str, Any], variants: dict[str, Rendered]
) -> None:
    skipped = checkov["results"]["skipped_checks"]
    assert {r["check_id"] for r in skipped} == SKIPPED
    assert all(len(r["check_result"]["suppress_comment"]) > 20 for r in skipped)
    # The digest and pull-policy skips go away once the image is pinned by digest, and
    # both checks pass.
    for check in ("CKV_K8S_43", "CKV_K8S_15"):
        assert not [r for r in skipped if r["check_id"] == check and _variant(r) == "full"]
        passed = [
            r for r in checkov["results"]["passed_checks"]
            if r["check_id"] == check and _variant(r) == "full"
        ]  # fmt: skip
        assert len(passed) == len(variants["full"].all("Deployment")), check


_YAMLLINT = """
extends: default
rules:
  # Helm's toYaml writes block sequences unindented, the templates indent theirs.
  indentation: {spaces: 2, indent-sequences: whatever}
  line-length:
    max: 120
    # The dashboard's JSON is carried byte for byte, long descriptions included.
    ignore: ["dashboard.yaml"]
"""


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_yamllint_is_clean(rendered_dir: Path, variant: str) -> None:
    _tool("yamllint")
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    config = YamlLintConfig(_YAMLLINT)
    problems = []
    for path in sorted((rendered_dir / variant).rglob("*.yaml")):
        relative = path.relative_to(rendered_dir)
        problems += [
            f"{relative}:{p.line}:{p.column} {p.rule}: {p.desc}"
            for p in linter.run(path.read_text(), config, str(relative))
        ]
    assert problems == []
