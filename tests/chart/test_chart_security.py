"""The restricted pod security profile on every pod, and a NetworkPolicy that lets in only
metrics scrapes and out only the ledger, the broker, the provider and DNS."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart._chart import VARIANTS, Render, Rendered, container

RESTRICTED_CONTAINER = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_pod_runs_restricted(variants: dict[str, Rendered], variant: str) -> None:
    rendered = variants[variant]
    account = rendered.one("ServiceAccount", "eq-effectq")
    assert account["automountServiceAccountToken"] is False
    for deployment in rendered.all("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "eq-effectq"
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container(deployment)["securityContext"] == RESTRICTED_CONTAINER


def _writable(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """mount path -> the volume behind it."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in container(deployment)["volumeMounts"]}


def test_a_read_only_root_leaves_tmp_and_the_metrics_directory_writable(
    variants: dict[str, Rendered],
) -> None:
    for deployment in variants["two-pools"].all("Deployment"):
        # What values add (a Secret's files) is read-only; the rest is the chart's scratch.
        mounts = {p: v for p, v in _writable(deployment).items() if "secret" not in v}
        assert mounts["/tmp"]["emptyDir"] == {"sizeLimit": "64Mi"}
        if deployment["metadata"]["labels"]["app.kubernetes.io/component"] != "worker":
            assert set(mounts) == {"/tmp"}
            continue
        # The supervisor's prometheus-client multiprocess directory, where its Dramatiq
        # processes write their counters.
        env = {e["name"]: e.get("value") for e in container(deployment)["env"]}
        assert mounts[env["EFFECTQ_METRICS_DIR"]]["emptyDir"] == {"sizeLimit": "256Mi"}
        assert set(mounts) == {"/tmp", env["EFFECTQ_METRICS_DIR"]}


def test_network_policy_defaults_allow_only_the_needed_ports(
    variants: dict[str, Rendered],
) -> None:
    (policy,) = variants["default"].all("NetworkPolicy")
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "effectq",
        "app.kubernetes.io/instance": "eq",
    }
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    assert [rule["ports"] for rule in spec["egress"]] == [
        [{"port": 6379, "protocol": "TCP"}],  # ledger
        [{"port": 6379, "protocol": "TCP"}],  # broker
        [{"port": 443, "protocol": "TCP"}],  # provider
        [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],  # DNS
    ]
    assert spec["egress"][3]["to"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
    ]


def test_network_policy_peers_come_from_values(variants: dict[str, Rendered]) -> None:
    (policy,) = variants["full"].all("NetworkPolicy")
    spec = policy["spec"]
    network = VARIANTS["full"]["networkPolicy"]
    assert spec["ingress"][0]["from"] == network["metricsFrom"]
    expected = [network["egress"][k] for k in ("ledger", "broker", "provider", "dns")]
    assert spec["egress"] == expected


def test_network_policy_can_be_left_to_the_cluster(render: Render) -> None:
    assert render({"networkPolicy": {"enabled": False}}).all("NetworkPolicy") == []
