"""Writes deploy/prometheus/rules.yml: the chart's PrometheusRule spec rendered with the
default values (`python -m tests.chart.regenerate`). test_chart_monitoring holds the two
equal, so that Prometheus setups without Helm get the rules the chart ships."""

from __future__ import annotations

from typing import Any

from tests.chart._chart import CHART, NAMESPACE, RELEASE, ROOT, helm_template, rules_file

RULES = ROOT / "deploy" / "prometheus" / "rules.yml"


def default_rules(chart: Any) -> str:
    manifests = chart.render(
        {"metrics": {"prometheusRule": {"enabled": True}}},
        name=RELEASE, namespace=NAMESPACE, is_install=True,
    )  # fmt: skip
    files, _ = helm_template(manifests)
    return rules_file(files)


def main() -> None:
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        RULES.write_text(default_rules(chart))


if __name__ == "__main__":
    main()
