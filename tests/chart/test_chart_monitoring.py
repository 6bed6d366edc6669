"""The alerts and the dashboard the chart ships are the files the repository tests
(deploy/prometheus/rules.yml, deploy/grafana/effectq.json), and Prometheus finds the pods."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import yaml

from tests.chart._chart import CHART, NAMESPACE, RELEASE, ROOT, VARIANTS, Rendered, helm_template

RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "effectq.json"


def _block(document: str, key: str, indent: int) -> str:
    """The text under `key:` (a top-level key of `document`), dedented by `indent`."""
    lines = document.split("\n")
    start = lines.index(f"{key}:") + 1
    block = []
    for line in lines[start:]:
        if line and not line.startswith(" " * indent):
            break
        block.append(line[indent:])
    return "\n".join(block).rstrip("\n") + "\n"


def _rule_document(files: dict[str, str]) -> str:
    """The PrometheusRule's text, as rendered."""
    (document,) = [d for d in files["templates/prometheusrule.yaml"].split("---\n") if d]
    return document


def test_prometheus_rule_carries_the_tested_rules_file_byte_for_byte(
    variants: dict[str, Rendered],
) -> None:
    rendered = variants["full"]
    assert _block(_rule_document(rendered.files), "spec", 2).encode() == RULES.read_bytes()
    rule = rendered.one("PrometheusRule", "eq-effectq")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    # Prometheus's own templates reach it untouched (Helm does not template .Files).
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert "{{ $labels.tool }}" in alerts["EffectqUnknownEffects"]["annotations"]["summary"]


def test_dashboard_configmap_carries_the_validated_json(variants: dict[str, Rendered]) -> None:
    configmap = variants["full"].one("ConfigMap", "eq-effectq-dashboard")
    assert configmap["data"]["effectq.json"] == DASHBOARD.read_text()
    assert json.loads(configmap["data"]["effectq.json"]) == json.loads(DASHBOARD.read_text())
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "effectq"}


def test_a_packaged_chart_carries_the_files_not_links(helm: ModuleType, tmp_path: Path) -> None:
    # files/ holds symlinks into deploy/; `helm package` must store their contents.
    archive = helm.package(CHART, destination=tmp_path)
    with helm.Chart.load_archive(Path(archive).read_bytes()) as packaged:
        files, _ = helm_template(
            packaged.render(VARIANTS["full"], name=RELEASE, namespace=NAMESPACE)
        )
    assert _block(_rule_document(files), "spec", 2).encode() == RULES.read_bytes()


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
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in rendered.all("Deployment")]
    assert len(pods) == 2
    assert all(service["spec"]["selector"].items() <= labels.items() for labels in pods)
