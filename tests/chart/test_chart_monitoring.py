"""The alerts and the dashboard the chart ships are the files the repository tests
(deploy/prometheus/rules.yml is the rules' default render, deploy/grafana/effectq.json is
carried byte for byte), and Prometheus finds the pods."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from tests.chart._chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    ROOT,
    VARIANTS,
    Rendered,
    container,
    helm_template,
    rules_file,
)
from tests.chart.regenerate import RULES, default_rules

REGENERATE = "regenerate it: python -m tests.chart.regenerate"
DASHBOARD = ROOT / "deploy" / "grafana" / "effectq.json"


def test_deploy_rules_file_is_the_default_render(chart: Any) -> None:
    # Prometheus setups without Helm use the file; it must be what the chart ships.
    assert default_rules(chart) == RULES.read_text(), REGENERATE


def test_prometheus_rule_carries_the_rules_and_prometheus_templates_untouched(
    variants: dict[str, Rendered],
) -> None:
    rendered = variants["full"]
    rule = rendered.one("PrometheusRule", "eq-effectq")
    assert rule["spec"] == yaml.safe_load(rules_file(rendered.files))
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    # Prometheus's own templates reach it as written (the template holds them raw).
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert "{{ $labels.tool }}" in alerts["EffectqUnknownEffects"]["annotations"]["summary"]


def test_dashboard_configmap_carries_the_validated_json(variants: dict[str, Rendered]) -> None:
    configmap = variants["full"].one("ConfigMap", "eq-effectq-dashboard")
    assert configmap["data"]["effectq.json"] == DASHBOARD.read_text()
    assert json.loads(configmap["data"]["effectq.json"]) == json.loads(DASHBOARD.read_text())
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "effectq"}


def test_a_packaged_chart_carries_the_rules_and_the_dashboard_not_a_link(
    helm: ModuleType, tmp_path: Path
) -> None:
    # files/ holds the dashboard itself (deploy/grafana/effectq.json links to it).
    archive = helm.package(CHART, destination=tmp_path)
    with helm.Chart.load_archive(Path(archive).read_bytes()) as packaged:
        files, _ = helm_template(
            packaged.render(VARIANTS["full"], name=RELEASE, namespace=NAMESPACE)
        )
    assert rules_file(files) == RULES.read_text()
    (dashboard,) = [
        o for o in yaml.safe_load_all(files["templates/dashboard.yaml"]) if o
    ]  # the dashboard ConfigMap
    assert dashboard["data"]["effectq.json"] == DASHBOARD.read_text()


def test_monitoring_objects_are_opt_in(variants: dict[str, Rendered]) -> None:
    default = variants["default"]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert default.all(kind) == []
    assert [c["metadata"]["name"] for c in default.all("ConfigMap")] == ["eq-effectq"]


def test_service_monitor_scrapes_every_pod_through_the_metrics_service(
    variants: dict[str, Rendered],
) -> None:
    rendered = variants["full"]
    monitor = rendered.one("ServiceMonitor", "eq-effectq")
    service = rendered.one("Service", "eq-effectq-metrics")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9191, "targetPort": "metrics", "protocol": "TCP"}
    ]
    # Unready pods too: during a ledger outage every pod is unready, and its
    # effectq_ledger_up 0 is what EffectqLedgerDown reads.
    assert service["spec"]["publishNotReadyAddresses"] is True
    serving = [
        d for d in rendered.all("Deployment")
        if any(p["name"] == "metrics" for p in container(d)["ports"])
    ]  # fmt: skip
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in serving} == {
        "worker",
        "reconciler",
    }
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in serving]
    assert all(service["spec"]["selector"].items() <= labels.items() for labels in pods)
