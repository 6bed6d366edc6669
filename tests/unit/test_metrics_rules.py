"""deploy/prometheus: promtool checks the rules (the chart's default render, see
tests/chart/regenerate.py) and runs their unit tests; every alert has a test; the rules
and the Grafana dashboard name only series effectq exposes. The dashboard round-trips
through grafana-foundation-sdk's 11.x models (no field unknown to the schema).

promtool comes with Debian's ``prometheus`` package (.ci/run installs it); without it these
tests skip, except with CI=true, where they fail."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.requires import need_binary
from workers import metrics
from workers.metrics import collector

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "effectq.json"
SERIES = re.compile(r"\beffectq_[a-z_]+")


def need(binary: str) -> str:
    return need_binary(binary, "apt-get install prometheus")


def exposed_series() -> set[str]:
    """Every sample name an effectq endpoint can show."""
    import workers.examples  # noqa: F401  (binds the per-tool children)

    names: set[str] = set()
    local = [f for f in metrics.REGISTRY.collect() if f.name.startswith("effectq_")]
    counts = {("CLAIMED", "charge"): 1, ("dup_submit", "charge"): 1}
    supervisor = list(metrics.WorkerRestarts().collect())  # served by a pool's supervisor
    for family in [*local, *collector._ledger_families(counts, 0, None, 0), *supervisor]:
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
    names.add("effectq_queue_messages")  # needs a Redis broker to be collected
    names.add("effectq_ledger_up")
    names.add("effectq_paused")  # read from the ledger's pause state
    return names


def test_promtool_checks_the_rules() -> None:
    promtool = need("promtool")
    done = subprocess.run(
        [promtool, "check", "rules", "rules.yml"], cwd=PROMETHEUS, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_runs_the_rule_unit_tests() -> None:
    promtool = need("promtool")
    done = subprocess.run(
        [promtool, "test", "rules", "rules_test.yml"], cwd=PROMETHEUS, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_test() -> None:
    rules = (PROMETHEUS / "rules.yml").read_text()
    tests = (PROMETHEUS / "rules_test.yml").read_text()
    alerts = set(re.findall(r"^\s*- alert: (\w+)", rules, re.M))
    assert len(alerts) >= 6
    # A firing expectation: the alertname, then a non-empty exp_alerts list.
    firing = set(re.findall(r"alertname: (\w+)\n\s*exp_alerts:\n", tests))
    assert alerts <= firing, f"alerts without a firing test: {sorted(alerts - firing)}"


def test_rules_and_dashboard_name_only_exposed_series() -> None:
    exposed = exposed_series()
    for path in (PROMETHEUS / "rules.yml", DASHBOARD):
        named = set(SERIES.findall(path.read_text()))
        assert named, path
        assert named <= exposed, f"{path.name}: unknown series {sorted(named - exposed)}"


def _sdk() -> tuple[type, type]:
    try:
        from grafana_foundation_sdk.cog.encoder import JSONEncoder
        from grafana_foundation_sdk.cog.plugins import register_default_plugins
        from grafana_foundation_sdk.models.dashboard import Dashboard
    except ImportError as exc:
        reason = f"grafana-foundation-sdk not installed ({exc}): pip install -e '.[dev]'"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI=true requires it", pytrace=False)
        pytest.skip(reason)
    register_default_plugins()
    return Dashboard, JSONEncoder


def test_dashboard_round_trips_through_the_grafana_11_schema() -> None:
    dashboard_model, encoder = _sdk()
    original = json.loads(DASHBOARD.read_text())
    model = dashboard_model.from_json(original)  # type: ignore[attr-defined]
    again = json.loads(json.dumps(model, cls=encoder))
    # Nothing dropped, renamed or defaulted differently: every field is the schema's.
    assert again == original
    assert original["schemaVersion"] >= 39  # Grafana 11


def test_dashboard_shows_what_an_sre_needs() -> None:
    board = json.loads(DASHBOARD.read_text())
    panels = {p["title"]: p for p in board["panels"] if p["type"] != "row"}
    exprs = {t: " ".join(q["expr"] for q in p.get("targets", [])) for t, p in panels.items()}
    wanted = {
        "Suppression ratio by stage": "effectq_duplicates_suppressed_total",
        "Claim outcomes": "effectq_claims_total",
        "Effect latency quantiles": "histogram_quantile(0.99",
        "Unknown / expired backlog": "effectq_expired_claims",
        "Reconciler resolutions": "effectq_reconciler_resolutions_total",
        "Fenced writes": "effectq_fenced_writes_total",
    }
    for title, needle in wanted.items():
        assert needle in exprs.get(title, ""), title
    assert "effectq_unknown_effects" in exprs["Unknown / expired backlog"]
    for panel in panels.values():
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel.get("description"), panel["title"]
        for target in panel["targets"]:
            # Ledger-derived series are global: aggregated with max, never summed per target.
            for name in ("effectq_duplicates_suppressed_total", "effectq_unknown_effects"):
                if name in target["expr"]:
                    assert re.search(rf"max by \([a-z, ]+\) \((rate\()?{name}", target["expr"])
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["tool"]["query"] == "label_values(effectq_claims_total, tool)"


def test_dashboard_opens_with_a_health_row() -> None:
    board = json.loads(DASHBOARD.read_text())
    first, *rest = board["panels"]
    assert (first["type"], first["title"], first["gridPos"]["y"]) == ("row", "Health", 0)
    row = [p for p in rest if p["gridPos"]["y"] == 1]
    exprs = {p["title"]: p["targets"][0]["expr"] for p in row}
    wanted = {
        "Ledger up": "effectq_ledger_up",
        "UNKNOWN backlog": "effectq_unknown_effects",
        "UNKNOWN backlog not empty for": "effectq_unknown_effects",
        "Dead letters (1 h)": "effectq_dead_letters_total",
        "Worker restarts (1 h)": "effectq_worker_restarts_total",
        "Last reconciler pass": "effectq_reconciler_last_pass_timestamp_seconds",
    }
    for title, needle in wanted.items():
        assert needle in exprs[title], title
    # Every other panel sits below the row.
    assert all(p["gridPos"]["y"] > 1 for p in rest if p not in row)


# -- the rule tests start from what the code exports -------------------------------------

_PROCESS_LOCAL = re.compile(
    r"series: (effectq_(?:claims|effects|fenced_writes|dead_letters|reconciler_resolutions"
    r"|worker_restarts)_total)\{.*\n\s*values: '?(\S+)"
)


def _exported(name: str, labels: dict[str, str]) -> str:
    """A sample as a promtool value: '_' when this process exports no such series."""
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return "_" if value is None else f"{value:g}"


def test_the_first_dead_letter_of_a_tool_and_reason_pages(tmp_path: Path) -> None:
    """promtool's input is what a pod exports: the series as declaring a tool leaves it,
    then after that pod's first dead letter. A series born at 1 has no increase to alert on."""
    promtool = need("promtool")
    tool, labels = "first_dead_letter", {"tool": "first_dead_letter", "reason": "conflict"}
    metrics.for_tool(tool)  # what declaring the tool does in every process
    before = _exported("effectq_dead_letters_total", labels)
    metrics.dead_letter(tool, "conflict")
    after = _exported("effectq_dead_letters_total", labels)
    target = 'namespace="prod",instance="worker-a:9191",job="effectq-workers"'
    alert = {"severity": "warning", "namespace": "prod", **labels}
    description = (
        f"1 {tool} messages went to the dead-letter queue for conflict in the last 10m. None of "
        "them will run again by itself; retries_exhausted is an effect that never ran."
    )
    tests = {
        "rule_files": [str(PROMETHEUS / "rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'effectq_dead_letters_total{{tool="{tool}",'
                        f'reason="conflict",{target}}}',
                        "values": f"{before}x4 {after}x10",
                    }
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "6m",
                        "alertname": "EffectqDeadLetters",
                        "exp_alerts": [
                            {
                                "exp_labels": alert,
                                "exp_annotations": {
                                    "summary": f"{tool} messages dead-lettered (conflict)",
                                    "description": description,
                                    "runbook_url": "docs/runbooks/EffectqDeadLetters.md",
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "first_test.yml").write_text(json.dumps(tests))
    done = subprocess.run(
        [promtool, "test", "rules", "first_test.yml"], cwd=tmp_path, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"exported {before} then {after}: " + done.stdout + done.stderr


def test_every_bounded_label_set_of_a_declared_tool_is_exported_at_zero() -> None:
    tool = "zero_born"
    metrics.for_tool(tool)
    for reason in metrics.DEAD_LETTER_REASONS:
        assert _exported("effectq_dead_letters_total", {"tool": tool, "reason": reason}) == "0"
    for resolution in metrics.LABEL_VALUES["resolution"]:
        labels = {"tool": tool, "resolution": resolution}
        assert _exported("effectq_reconciler_resolutions_total", labels) == "0"


def test_the_rule_tests_start_process_local_counters_at_zero() -> None:
    """Every process-local counter is pre-initialised (a pod exports it at 0 from its
    start): a rule test whose series starts anywhere else tests what never happens."""
    starts = _PROCESS_LOCAL.findall((PROMETHEUS / "rules_test.yml").read_text())
    assert starts
    for name, values in starts:
        assert re.match(r"0(\D|$)", values), f"{name} starts at {values}"
