"""What a real tool needs in its pods (a provider key from a Secret, a private CA bundle,
its own environment), where the pods run (spread, priority, affinity), how they roll, the
probes, and the optional API/console Deployment."""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import pytest

from tests.chart._chart import API, RECONCILER, Render, Rendered, container, worker_name

_CA = {"name": "redis-ca", "mountPath": "/etc/effectq/redis-ca", "readOnly": True}
_PROVIDER = {
    "name": "PROVIDER_TOKEN",
    "valueFrom": {"secretKeyRef": {"name": "provider", "key": "token"}},
}


def _pod(deployment: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def _volume(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (volume,) = [v for v in _pod(deployment)["volumes"] if v["name"] == name]
    return volume


def test_a_secret_key_and_a_ca_bundle_reach_the_pools_the_reconciler_and_the_api(
    variants: dict[str, Rendered],
) -> None:
    full = variants["full"]
    names = {d["metadata"]["name"] for d in full.all("Deployment")}
    assert names == {worker_name("default"), RECONCILER, API}
    for deployment in full.all("Deployment"):
        spec = container(deployment)
        assert _PROVIDER in spec["env"]
        assert _CA in spec["volumeMounts"]
        assert _volume(deployment, "redis-ca") == {
            "name": "redis-ca",
            "secret": {"secretName": "redis-ca"},
        }
    # The reconciler's own envFrom comes after the settings ConfigMap.
    reconciler = container(full.one("Deployment", RECONCILER))
    assert reconciler["envFrom"] == [
        {"configMapRef": {"name": "eq-effectq"}},
        {"configMapRef": {"name": "lookup-settings"}},
    ]


def test_a_pool_adds_its_own_environment_and_files_to_the_global_ones(
    variants: dict[str, Rendered],
) -> None:
    rendered = variants["two-pools"]
    payments = rendered.one("Deployment", worker_name("payments"))
    spec = container(payments)
    assert {"name": "PAYMENTS_REGION", "value": "eu"} in spec["env"]
    assert spec["envFrom"][1:] == [{"secretRef": {"name": "payments-keys"}}]
    assert {"name": "payments-cert", "mountPath": "/etc/psp", "readOnly": True} in spec[
        "volumeMounts"
    ]
    assert _volume(payments, "payments-cert")["secret"] == {"secretName": "psp-client"}
    # The other pool has none of it.
    email = container(rendered.one("Deployment", worker_name("email")))
    assert "PAYMENTS_REGION" not in {e["name"] for e in email["env"]}
    assert len(email["envFrom"]) == 1


def test_pods_spread_softly_over_nodes_by_default(variants: dict[str, Rendered]) -> None:
    for deployment in variants["default"].all("Deployment"):
        (spread,) = _pod(deployment)["topologySpreadConstraints"]
        assert spread == {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            # Its own pods only: a pool's spread ignores the other pools and the reconciler.
            "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
        }
        assert "priorityClassName" not in _pod(deployment)
        assert "affinity" not in _pod(deployment)
        assert deployment["spec"]["revisionHistoryLimit"] == 5
        assert container(deployment)["imagePullPolicy"] == "IfNotPresent"


def test_priority_affinity_spread_and_rollout_come_from_values(
    variants: dict[str, Rendered], render: Render
) -> None:
    full = variants["full"]
    for deployment in full.all("Deployment"):
        assert _pod(deployment)["priorityClassName"] == "effectq"
        assert deployment["spec"]["revisionHistoryLimit"] == 3
    payments = variants["two-pools"].one("Deployment", worker_name("payments"))
    pod = _pod(payments)
    assert pod["priorityClassName"] == "payments-critical"
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert "nodeAffinity" in pod["affinity"]
    assert payments["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    unspread = render({"topologySpread": {"enabled": False}})
    assert all("topologySpreadConstraints" not in _pod(d) for d in unspread.all("Deployment"))


def test_probes_ask_the_health_endpoints_and_startup_waits_for_the_boot(
    variants: dict[str, Rendered],
) -> None:
    for deployment in variants["full"].all("Deployment"):
        spec = container(deployment)
        port = "http" if deployment["metadata"]["name"] == API else "metrics"
        assert spec["startupProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        assert spec["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        assert spec["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
        startup = spec["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] == 180


def test_the_api_deployment_its_service_ingress_and_tokens(variants: dict[str, Rendered]) -> None:
    full = variants["full"]
    api = full.one("Deployment", API)
    spec = container(api)
    assert spec["args"] == ["api", "--host", "0.0.0.0", "--port", "8080"]
    assert spec["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    tokens = next(e for e in spec["env"] if e["name"] == "EFFECTQ_API_TOKENS")
    assert tokens["valueFrom"]["secretKeyRef"] == {
        "name": "effectq-api-tokens",
        "key": "EFFECTQ_API_TOKENS",
    }
    service = full.one("Service", API)
    assert service["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    ingress = full.one("Ingress", API)
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "effectq-tls", "hosts": ["effectq.example"]}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "effectq.example"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": API, "port": {"name": "http"}}
    assert full.one("PodDisruptionBudget", API)["spec"]["selector"] == api["spec"]["selector"]
    # Only the API's port is opened to apiFrom, and only when the API is on.
    (policy,) = full.all("NetworkPolicy")
    assert policy["spec"]["ingress"][1] == {
        "ports": [{"port": "http", "protocol": "TCP"}],
        "from": [{"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}}],
    }
    assert len(variants["default"].all("NetworkPolicy")[0]["spec"]["ingress"]) == 1


def test_the_api_is_off_by_default_and_its_token_secret_is_the_charts_unless_given(
    variants: dict[str, Rendered], render: Render
) -> None:
    default = variants["default"]
    assert API not in {d["metadata"]["name"] for d in default.all("Deployment")}
    assert default.all("Ingress") == []
    token = "ops:" + "t" * 24 + ":read,operate"
    own = render({"api": {"enabled": True, "tokens": {"value": token}}})
    assert own.one("Secret", API)["stringData"] == {"EFFECTQ_API_TOKENS": token}
    env = container(own.one("Deployment", API))["env"]
    ref = next(e for e in env if e["name"] == "EFFECTQ_API_TOKENS")["valueFrom"]
    assert ref["secretKeyRef"]["name"] == API
    assert own.all("Ingress") == []
    assert [s["metadata"]["name"] for s in variants["full"].all("Secret")] == []


@pytest.mark.parametrize(
    ("values", "where"),
    [
        # The chart sets the URLs itself, from its Secret.
        ({"env": [{"name": "EFFECTQ_REDIS_URL", "value": "redis://x"}]}, "/env/0/name"),
        ({"env": [{"name": "A", "value": "1", "valueFrom": {}}]}, "/env/0"),
        (
            {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
            "/env/0/valueFrom/secretKeyRef",
        ),
        ({"envFrom": [{"secret": {"name": "s"}}]}, "/envFrom/0"),
        ({"extraVolumes": [{"name": "ca"}]}, "/extraVolumes/0"),
        (
            {"extraVolumeMounts": [{"name": "ca", "mountPath": "/tmp"}]},
            "/extraVolumeMounts/0/mountPath",
        ),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"priorityClassName": "High Priority"}, "/priorityClassName"),
        ({"topologySpread": {"whenUnsatisfiable": "Maybe"}}, "/topologySpread/whenUnsatisfiable"),
        ({"api": {"port": 80}}, "/api/port"),
        (
            {"pools": [{"name": "p", "queues": ["q"], "strategy": {"type": "BlueGreen"}}]},
            "/pools/0/strategy/type",
        ),
        (
            {"metrics": {"prometheusRule": {"alerts": {"EffectqLedgerDown": {"for": "soon"}}}}},
            "/metrics/prometheusRule/alerts/EffectqLedgerDown/for",
        ),
        (
            {"metrics": {"prometheusRule": {"alerts": {"EffectqTypo": {}}}}},
            "/metrics/prometheusRule/alerts",
        ),
    ],
)
def test_the_schema_refuses_nonsense(
    helm: ModuleType, render: Render, values: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=f"at '{re.escape(where)}'"):
        render(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ca"}]},
            'extraVolumeMounts: "ca" names no volume of extraVolumes',
        ),
        (
            {"extraVolumes": [{"name": "tmp", "emptyDir": {}}]},
            'extraVolumes: the name "tmp" is used twice or is the chart\'s own',
        ),
        ({"api": {"enabled": True}}, "api.tokens.value (or api.tokens.existingSecret)"),
        (
            {
                "api": {
                    "enabled": True,
                    "tokens": {"existingSecret": "t"},
                    "ingress": {"enabled": True},
                }
            },
            "api.ingress.host is required",
        ),
    ],
)
def test_impossible_pod_values_fail_the_render(
    helm: ModuleType, render: Render, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(values)
