"""values.schema.json and the chart's own checks: wrong types, unknown keys and
impossible combinations are refused at render time, with the offending key named."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.chart._chart import CHART, NAMESPACE, RELEASE, Render
from workers.examples import ExampleSettings
from workers.settings import Settings

_POOL = {"name": "default", "queues": ["effectq"]}


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"poolDefaults": {"processes": "2"}}, "/poolDefaults/processes"),
        ({"pools": [{"name": "default", "queues": "effectq"}]}, "/pools/0/queues"),
        ({"metrics": {"port": "9191"}}, "/metrics/port"),
        ({"settings": {"maxRetries": "many"}}, "/settings/maxRetries"),
        ({"settings": {"allowVolatileLedger": "yes"}}, "/settings/allowVolatileLedger"),
        ({"networkPolicy": {"enabled": "true"}}, "/networkPolicy/enabled"),
        ({"reconciler": {"replicas": 0}}, "/reconciler/replicas"),
        ({"pools": [{"name": "Payments_1", "queues": ["q"]}]}, "/pools/0/name"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        (
            {"poolDefaults": {"terminationGraceMarginSeconds": 2}},
            "/poolDefaults/terminationGraceMarginSeconds",
        ),
    ],
)
def test_wrong_types_and_values_are_rejected(
    helm: ModuleType, render: Render, values: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=f"at '{re.escape(where)}': "):
        render(values)


@pytest.mark.parametrize(
    ("values", "where", "key"),
    [
        ({"replicaCount": 3}, "", "replicaCount"),
        ({"pools": [_POOL | {"replica": 3}]}, "/pools/0", "replica"),
        (
            {"poolDefaults": {"autoscaling": {"enabled": True}}},
            "/poolDefaults/autoscaling",
            "enabled",
        ),
        # The URLs belong in the Secret, failpoints in tests: neither is a setting here.
        ({"settings": {"redisUrl": "redis://x"}}, "/settings", "redisUrl"),
        ({"settings": {"failpoints": "after_claim=kill"}}, "/settings", "failpoints"),
        ({"networkPolicy": {"egress": {"smtp": {}}}}, "/networkPolicy/egress", "smtp"),
        ({"metrics": {"dashboard": {"folder": "x"}}}, "/metrics/dashboard", "folder"),
    ],
)
def test_unknown_keys_are_rejected(
    helm: ModuleType, render: Render, values: dict[str, Any], where: str, key: str
) -> None:
    expected = rf"at '{re.escape(where)}': additional properties '{key}' not allowed"
    with pytest.raises(helm.HelmValuesError, match=expected):
        render(values)


@pytest.mark.parametrize(
    "autoscaling",
    [
        {"kind": "both"},
        # The shape other charts use: two switches that can both be on.
        {"hpa": {"enabled": True}, "keda": {"enabled": True}},
    ],
)
def test_one_autoscaler_per_pool_is_all_the_schema_admits(
    helm: ModuleType, render: Render, autoscaling: dict[str, Any]
) -> None:
    with pytest.raises(helm.HelmValuesError, match="/poolDefaults/autoscaling"):
        render({"poolDefaults": {"autoscaling": autoscaling}})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"pools": [_POOL, _POOL]}, 'the name "default" is used by two pools'),
        (
            {"pools": [_POOL | {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}]},
            "minReplicas above maxReplicas",
        ),
        (
            {"pools": [_POOL | {"autoscaling": {"kind": "hpa", "minReplicas": 0}}]},
            "an HPA needs minReplicas >= 1",
        ),
        ({"poolDefaults": {"autoscaling": {"kind": "keda"}}}, "keda.redis.address"),
        ({"secret": {"redisUrl": ""}}, "secret.redisUrl"),
    ],
)
def test_impossible_combinations_fail_the_render(
    helm: ModuleType, render: Render, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(values)


_SCHEMA_TYPES = {"string": str, "boolean": bool, "integer": int, "number": float}


def test_every_setting_is_one_of_effectq_settings_with_its_type() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    settings = schema["properties"]["settings"]["properties"]
    # The core settings, and the shipped example tools' own (their provider, lease, settle).
    fields = {**Settings.model_fields, **ExampleSettings.model_fields}
    # The chart sets these itself (the Secret, the metrics port and directory); the
    # failpoints are for tests.
    owned = {"redis_url", "broker_url", "metrics_port", "metrics_host", "metrics_dir", "failpoints"}
    for key, spec in settings.items():
        field = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()  # maxRetries -> max_retries
        assert field in fields, f"settings.{key}: no effectq setting {field}"
        assert field not in owned, f"settings.{key} is set by the chart itself"
        assert fields[field].annotation is _SCHEMA_TYPES[spec["type"]], f"settings.{key}"


def test_the_chart_works_as_a_dependency_of_another(helm: ModuleType, tmp_path: Path) -> None:
    # A parent chart hands its subcharts `global`: the schema must let it through.
    parent = tmp_path / "parent"
    shutil.copytree(CHART, parent / "charts" / "effectq", symlinks=False)
    (parent / "templates").mkdir()
    # The chart's own version: the release command stamps it (tests/chart/release.py).
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: parent\nversion: 1.0.0\n"
        f"dependencies:\n  - name: effectq\n    version: {version}\n"
    )
    (parent / "values.yaml").write_text("global:\n  environment: staging\n")
    with helm.Chart.load(parent) as chart:
        manifests = chart.render(name=RELEASE, namespace=NAMESPACE)
    assert "parent/charts/effectq/templates/worker-deployment.yaml" in manifests
