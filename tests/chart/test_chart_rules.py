"""promtool runs against the rules the chart renders (the PrometheusRule's groups, written
out as a rules file): the repository's unit tests against the default render (a ledger
outage that keeps UNKNOWN firing, dead letters, ...), and tuned values against their own."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.chart._chart import ROOT, Render, rules_file
from tests.support.requires import need_binary

UNIT_TESTS = ROOT / "deploy" / "prometheus" / "rules_test.yml"


def _promtool_test(rules: str, tests: str, where: Path) -> subprocess.CompletedProcess[str]:
    promtool = need_binary("promtool", "apt-get install prometheus")
    (where / "rules.yml").write_text(rules)
    (where / "rules_test.yml").write_text(tests)
    return subprocess.run(
        [promtool, "test", "rules", "rules_test.yml"], cwd=where, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


def _alerts(rules: str) -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(rules)["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_the_rendered_rules_pass_the_unit_tests(render: Render, tmp_path: Path) -> None:
    rules = rules_file(render({"metrics": {"prometheusRule": {"enabled": True}}}).files)
    done = _promtool_test(rules, UNIT_TESTS.read_text(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The scenarios the issue asks for are among them.
    names = {t["name"] for t in yaml.safe_load(UNIT_TESTS.read_text())["tests"]}
    assert any("UNKNOWN alert stays firing" in n for n in names)
    assert "dead letters by tool and reason" in names


_TUNED = {
    "metrics": {
        "prometheusRule": {
            "enabled": True,
            "runbookBaseUrl": "https://runbooks.example/effectq",
            "alerts": {
                "EffectqReconcilerLag": {"thresholdSeconds": 300, "severity": "warning"},
                "EffectqConflicts": {"enabled": False},
            },
        }
    }
}

_LAG = "expired claims wait longer than a lease for a reconciler"


def test_thresholds_severities_switches_and_runbook_urls_come_from_values(
    render: Render, tmp_path: Path
) -> None:
    rules = rules_file(render(_TUNED).files)
    alerts = _alerts(rules)
    assert "EffectqConflicts" not in alerts
    assert all(
        a["annotations"]["runbook_url"] == f"https://runbooks.example/effectq/{name}.md"
        for name, a in alerts.items()
    )
    lag = {"namespace": "prod", "instance": "reconciler:9192", "job": "effectq-reconciler"}
    labels = ",".join(f'{k}="{v}"' for k, v in lag.items())
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "a lag of 2 minutes is under the tuned 300 s; 10 minutes is not",
                "interval": "1m",
                "input_series": [
                    {
                        "series": f"effectq_reconciler_lag_seconds{{{labels}}}",
                        "values": "120x9 600x10",
                    },
                    {"series": f"effectq_ledger_up{{{labels}}}", "values": "1x19"},
                ],
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": "EffectqReconcilerLag", "exp_alerts": []},
                    {
                        "eval_time": "15m",
                        "alertname": "EffectqReconcilerLag",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "namespace": "prod"},
                                "exp_annotations": {
                                    "summary": _LAG,
                                    "description": "The oldest expired lease has waited more "
                                    "than 300 s: no reconciler is running, or it is behind. "
                                    "Their messages retry as blocked until it catches up.",
                                    "runbook_url": "https://runbooks.example/effectq/"
                                    "EffectqReconcilerLag.md",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    done = _promtool_test(rules, yaml.safe_dump(tests, sort_keys=False), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_can_be_switched_off(render: Render) -> None:
    names = _alerts(rules_file(render({"metrics": {"prometheusRule": {"enabled": True}}}).files))
    off = {name: {"enabled": False} for name in names}
    rules = rules_file(
        render({"metrics": {"prometheusRule": {"enabled": True, "alerts": off}}}).files
    )
    assert _alerts(rules) == {}
    assert [g["name"] for g in yaml.safe_load(rules)["groups"]] == ["effectq.recording"]


RUNBOOKS = ROOT / "docs" / "runbooks"


def test_every_alert_has_a_runbook_that_its_url_names(render: Render) -> None:
    alerts = _alerts(rules_file(render({"metrics": {"prometheusRule": {"enabled": True}}}).files))
    for name, alert in alerts.items():
        assert alert["annotations"]["runbook_url"] == f"docs/runbooks/{name}.md"
        page = (RUNBOOKS / f"{name}.md").read_text()
        assert page.startswith(f"# {name}\n"), name
        for section in ("## Impact", "## First commands", "## Resolve", "## Escalation"):
            assert section in page, f"{name}: {section}"
        assert f"**Severity: {alert['labels']['severity']}.**" in page, name
    pages = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == set(alerts), "a runbook without an alert, or the reverse"
    index = (RUNBOOKS / "README.md").read_text()
    assert all(f"[{name}.md]({name}.md)" in index for name in alerts)
