"""What the chart renders: a Deployment per pool, the reconciler, autoscaling, budgets,
the settings and the Secret, the NOTES."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.chart._chart import (
    API,
    CHART,
    NAMESPACE,
    RECONCILER,
    VARIANTS,
    Render,
    Rendered,
    container,
    option,
    worker_name,
)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_strict_lint_is_clean(helm: ModuleType, variant: str) -> None:
    report = helm.lint(
        CHART, VARIANTS[variant], strict=True, namespace=NAMESPACE, kube_version="v1.30.0"
    )
    # Severity 1 is information ("icon is recommended"); 2 and 3 are warnings and errors.
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_defaults_render_one_pool_and_one_reconciler(variants: dict[str, Rendered]) -> None:
    default = variants["default"]
    assert {d["metadata"]["name"] for d in default.all("Deployment")} == {
        worker_name("default"),
        RECONCILER,
    }
    worker = default.one("Deployment", worker_name("default"))
    args = container(worker)["args"]
    assert args[0] == "worker"
    assert option(args, "--processes") == ["2"]
    assert option(args, "--threads") == ["8"]
    assert option(args, "--queues") == ["effectq"]
    assert worker["spec"]["replicas"] == 2
    reconciler = default.one("Deployment", RECONCILER)
    assert container(reconciler)["args"] == ["reconciler", "--interval", "1"]
    assert reconciler["spec"]["replicas"] == 1
    assert default.all("HorizontalPodAutoscaler") == default.all("ScaledObject") == []


def test_each_pool_is_its_own_deployment(variants: dict[str, Rendered]) -> None:
    rendered = variants["two-pools"]
    payments = container(rendered.one("Deployment", worker_name("payments")))
    assert option(payments["args"], "--processes") == ["4"]
    assert option(payments["args"], "--threads") == ["2"]
    assert option(payments["args"], "--queues") == ["payments"]
    assert payments["resources"]["limits"] == {"cpu": "4", "memory": "2Gi"}
    email = container(rendered.one("Deployment", worker_name("email")))
    # A pool leaves out what poolDefaults give it.
    assert option(email["args"], "--processes") == ["2"]
    assert option(email["args"], "--queues") == ["email", "email-bulk"]
    assert email["resources"]["requests"] == {"cpu": "250m", "memory": "512Mi"}
    selectors = [
        d["spec"]["selector"]["matchLabels"] for d in rendered.all("Deployment")
    ]  # no pool's selector may match another pool's pods
    assert len({tuple(sorted(s.items())) for s in selectors}) == len(selectors) == 3


def test_hpa_variant_scales_every_pool_by_cpu_and_drops_replicas(
    variants: dict[str, Rendered],
) -> None:
    rendered = variants["hpa"]
    hpa = rendered.one("HorizontalPodAutoscaler", worker_name("default"))
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": worker_name("default"),
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 10)
    target = hpa["spec"]["metrics"][0]["resource"]
    assert target == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}
    assert "replicas" not in rendered.one("Deployment", worker_name("default"))["spec"]
    assert rendered.all("ScaledObject") == []


def test_keda_variant_scales_on_each_queue_and_wakes_for_its_delay_queue(
    variants: dict[str, Rendered],
) -> None:
    rendered = variants["keda"]
    scaled = rendered.one("ScaledObject", worker_name("default"))
    assert scaled["spec"]["scaleTargetRef"] == {"name": worker_name("default")}
    redis = {"address": "effectq-broker:6379", "databaseIndex": "0", "enableTLS": "false"}
    assert scaled["spec"]["triggers"] == [
        {
            "type": "redis",
            "name": "effectq",
            "metadata": redis
            | {"listName": "dramatiq:effectq", "listLength": "50", "activationListLength": "0"},
        },
        {
            # Retries waiting in Dramatiq's delay queue: one replica, not one per 50.
            "type": "redis",
            "name": "effectq-delayed",
            "metadata": redis
            | {
                "listName": "dramatiq:effectq.DQ",
                "listLength": "1000000",
                "activationListLength": "0",
            },
        },
    ]
    assert "advanced" not in scaled["spec"]
    assert "replicas" not in rendered.one("Deployment", worker_name("default"))["spec"]
    assert rendered.all("HorizontalPodAutoscaler") == []


def test_keda_advanced_is_passed_through(render: Render) -> None:
    advanced = {
        "restoreToOriginalReplicaCount": True,
        "horizontalPodAutoscalerConfig": {
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}
        },
    }
    values = VARIANTS["keda"] | {"keda": VARIANTS["keda"]["keda"] | {"advanced": advanced}}
    scaled = render(values).one("ScaledObject", worker_name("default"))
    assert scaled["spec"]["advanced"] == advanced


def test_pools_choose_their_own_autoscaler(variants: dict[str, Rendered]) -> None:
    rendered = variants["two-pools"]
    assert [h["metadata"]["name"] for h in rendered.all("HorizontalPodAutoscaler")] == [
        worker_name("payments")
    ]
    assert [s["metadata"]["name"] for s in rendered.all("ScaledObject")] == [worker_name("email")]
    email = rendered.one("ScaledObject", worker_name("email"))["spec"]
    # minReplicas 0 survives the merge over poolDefaults' 1: KEDA may park an idle pool.
    assert (email["minReplicaCount"], email["maxReplicaCount"]) == (0, 10)
    assert [t["metadata"]["listName"] for t in email["triggers"]] == [
        "dramatiq:email",
        "dramatiq:email.DQ",
        "dramatiq:email-bulk",
        "dramatiq:email-bulk.DQ",
    ]
    assert [t["metadata"]["listLength"] for t in email["triggers"]] == ["200", "1000000"] * 2
    for pool in ("payments", "email"):
        assert "replicas" not in rendered.one("Deployment", worker_name(pool))["spec"]


def test_keda_on_rabbitmq_reads_both_queues_through_the_pods_broker_url(
    variants: dict[str, Rendered],
) -> None:
    scaled = variants["full"].one("ScaledObject", worker_name("default"))
    common = {"protocol": "amqp", "mode": "QueueLength", "hostFromEnv": "EFFECTQ_BROKER_URL"}
    auth = {"authenticationRef": {"name": "effectq-rabbitmq"}}
    assert scaled["spec"]["triggers"] == [
        {
            "type": "rabbitmq",
            "name": "effectq",
            "metadata": common | {"value": "50", "activationValue": "0", "queueName": "effectq"},
        }
        | auth,
        {
            "type": "rabbitmq",
            "name": "effectq-delayed",
            "metadata": common
            | {"value": "1000000", "activationValue": "0", "queueName": "effectq.DQ"},
        }
        | auth,
    ]
    # KEDA reads hostFromEnv from the scale target's container.
    worker = container(variants["full"].one("Deployment", worker_name("default")))
    assert "EFFECTQ_BROKER_URL" in {e["name"] for e in worker["env"]}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_deployment_has_a_pdb_selecting_exactly_its_pods(
    variants: dict[str, Rendered], variant: str
) -> None:
    rendered = variants[variant]
    budgets = {p["metadata"]["name"]: p for p in rendered.all("PodDisruptionBudget")}
    for deployment in rendered.all("Deployment"):
        budget = budgets.pop(deployment["metadata"]["name"])
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budgets == {}


def test_settings_become_the_effectq_environment(variants: dict[str, Rendered]) -> None:
    full = variants["full"]
    data = full.one("ConfigMap", "eq-effectq")["data"]
    assert data == {
        "EFFECTQ_ALLOW_VOLATILE_LEDGER": "false",
        "EFFECTQ_NAMESPACE": "effectq",
        "EFFECTQ_TOOLS": "workers.examples",
        "EFFECTQ_PROVIDER_URL": "https://provider.example",
        # Helm holds numbers as float64; toString would have printed 1e+06.
        "EFFECTQ_MAX_RETRIES": "1000000",
    }
    for deployment in full.all("Deployment"):
        spec = container(deployment)
        assert spec["envFrom"][0] == {"configMapRef": {"name": "eq-effectq"}}
        if deployment["metadata"]["name"] == API:
            continue  # no metrics port: it serves HTTP on its own
        metrics_port = next(e for e in spec["env"] if e["name"] == "EFFECTQ_METRICS_PORT")
        assert metrics_port["value"] == "9191" == str(spec["ports"][0]["containerPort"])


def test_urls_come_from_the_chart_secret_or_an_existing_one(
    variants: dict[str, Rendered],
) -> None:
    secret = variants["default"].one("Secret", "eq-effectq")
    assert secret["stringData"] == {
        "EFFECTQ_REDIS_URL": "redis://effectq-ledger:6379/0",
        "EFFECTQ_BROKER_URL": "redis://effectq-broker:6379/0",
    }
    assert variants["full"].all("Secret") == []
    for variant, name in (("default", "eq-effectq"), ("full", "effectq-urls")):
        for deployment in variants[variant].all("Deployment"):
            refs = {
                e["name"]: e["valueFrom"]["secretKeyRef"]
                for e in container(deployment)["env"]
                if e["name"] in ("EFFECTQ_REDIS_URL", "EFFECTQ_BROKER_URL")
            }
            assert refs == {
                "EFFECTQ_REDIS_URL": {"name": name, "key": "EFFECTQ_REDIS_URL"},
                "EFFECTQ_BROKER_URL": {"name": name, "key": "EFFECTQ_BROKER_URL"},
            }


def _checksums(rendered: Rendered) -> dict[str, dict[str, str]]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]
        for d in rendered.all("Deployment")
    }


def test_a_settings_or_secret_change_rolls_every_pod(render: Render) -> None:
    before = _checksums(render({}))
    settings = _checksums(render({"settings": {"maxRetries": 3}}))
    secret = _checksums(render({"secret": {"redisUrl": "redis://other:6379/0"}}))
    assert before.keys() == settings.keys() == secret.keys() == {worker_name("default"), RECONCILER}
    for name, sums in before.items():
        assert settings[name]["checksum/config"] != sums["checksum/config"]
        assert settings[name]["checksum/secret"] == sums["checksum/secret"]
        assert secret[name]["checksum/secret"] != sums["checksum/secret"]
        assert secret[name]["checksum/config"] == sums["checksum/config"]
    # A Secret the chart does not render has no checksum here: roll it yourself.
    assert all("checksum/secret" not in a for a in _checksums(render(VARIANTS["full"])).values())


def test_notes_tell_where_the_metrics_and_the_unknown_effects_are(
    variants: dict[str, Rendered],
) -> None:
    notes = variants["default"].notes
    assert "Service eq-effectq-metrics" in notes
    assert "/metrics on port 9191" in notes
    assert f"exec deploy/{RECONCILER} -- effectq list --state unknown" in notes
    assert "No ServiceMonitor" in notes
    full = variants["full"].notes
    assert "ServiceMonitor: eq-effectq" in full
    assert "PrometheusRule eq-effectq" in full
    assert "ConfigMap eq-effectq-dashboard" in full
