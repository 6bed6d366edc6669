"""What the chart tests share: the values variants they render, a render's objects, and
the names the chart gives them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "effectq"
RELEASE = "eq"
NAMESPACE = "effectq"

_KEDA_REDIS = {"redis": {"address": "effectq-broker:6379", "databaseIndex": 0}}

# What the tests render: the defaults, each autoscaler, two pools that differ in
# everything a pool can set, and everything optional switched on.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "hpa": {"poolDefaults": {"autoscaling": {"kind": "hpa"}}},
    "keda": {"poolDefaults": {"autoscaling": {"kind": "keda"}}, "keda": _KEDA_REDIS},
    "two-pools": {
        "pools": [
            {
                "name": "payments",
                "queues": ["payments"],
                "processes": 4,
                "threads": 2,
                "replicas": 3,
                "shutdownTimeoutSeconds": 120,
                "terminationGraceMarginSeconds": 20,
                "resources": {
                    "requests": {"cpu": "500m", "memory": "1Gi"},
                    "limits": {"cpu": "4", "memory": "2Gi"},
                },
                "autoscaling": {"kind": "hpa", "minReplicas": 2, "maxReplicas": 6},
                "env": [{"name": "PAYMENTS_REGION", "value": "eu"}],
                "envFrom": [{"secretRef": {"name": "payments-keys"}}],
                "extraVolumes": [{"name": "payments-cert", "secret": {"secretName": "psp-client"}}],
                "extraVolumeMounts": [
                    {"name": "payments-cert", "mountPath": "/etc/psp", "readOnly": True}
                ],
                "priorityClassName": "payments-critical",
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "In", "values": ["payments"]}
                                    ]
                                }
                            ]
                        }
                    }
                },
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"effectq.io/pool": "payments"}},
                    }
                ],
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                },
            },
            {
                "name": "email",
                "queues": ["email", "email-bulk"],
                "autoscaling": {"kind": "keda", "minReplicas": 0, "messagesPerReplica": 200},
            },
        ],
        "keda": _KEDA_REDIS,
    },
    "full": {
        "image": {"digest": "sha256:" + "ab" * 32},
        "secret": {"existingSecret": "effectq-urls"},
        "settings": {"providerUrl": "https://provider.example", "maxRetries": 1_000_000},
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
            "dashboard": {"enabled": True, "annotations": {"grafana_folder": "effectq"}},
        },
        "poolDefaults": {"autoscaling": {"kind": "keda"}},
        "keda": {"broker": "rabbitmq", "authenticationRef": "effectq-rabbitmq"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "env": [
            {
                "name": "PROVIDER_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "provider", "key": "token"}},
            },
        ],
        "extraVolumes": [{"name": "redis-ca", "secret": {"secretName": "redis-ca"}}],
        "extraVolumeMounts": [
            {"name": "redis-ca", "mountPath": "/etc/effectq/redis-ca", "readOnly": True}
        ],
        "priorityClassName": "effectq",
        "revisionHistoryLimit": 3,
        "reconciler": {"envFrom": [{"configMapRef": {"name": "lookup-settings"}}]},
        "api": {
            "enabled": True,
            "tokens": {"existingSecret": "effectq-api-tokens"},
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "host": "effectq.example",
                "tls": [{"secretName": "effectq-tls", "hosts": ["effectq.example"]}],
            },
        },
        "tolerations": [{"key": "workload", "operator": "Equal", "value": "effectq"}],
        "networkPolicy": {
            "metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}},
            ],
            "apiFrom": [{"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}}],
            "egress": {
                "ledger": {
                    "to": [{"podSelector": {"matchLabels": {"app": "ledger-redis"}}}],
                    "ports": [{"port": 6379, "protocol": "TCP"}],
                },
                "broker": {
                    "to": [
                        {
                            "podSelector": {
                                "matchExpressions": [
                                    {"key": "app", "operator": "In", "values": ["rabbitmq"]}
                                ]
                            }
                        }
                    ],
                    "ports": [{"port": 5672, "protocol": "TCP"}],
                },
                "provider": {
                    "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}],
                    "ports": [{"port": 443, "protocol": "TCP"}],
                },
                "dns": {
                    "to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
                    "ports": [{"port": 53, "protocol": "UDP"}],
                },
            },
        },
    },
}


@dataclass(frozen=True)
class Rendered:
    """One render: each template's output (`files`, as `helm template` prints them) and
    the Kubernetes objects in them."""

    files: dict[str, str]
    objects: list[dict[str, Any]]
    notes: str

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def text(self, template: str) -> str:
        return self.files[f"templates/{template}"]


Render = Callable[[dict[str, Any]], Rendered]

_SEPARATOR = re.compile(r"^---\s*$", re.MULTILINE)


def helm_template(manifests: dict[str, str]) -> tuple[dict[str, str], str]:
    """Helm's `template` output: each document of each template, trimmed, after a
    `---` line and a `# Source:` comment; templates that render nothing are left out."""
    files: dict[str, str] = {}
    notes = ""
    for path, text in sorted(manifests.items()):
        relative = path.split("/", 1)[1]
        if relative.endswith("NOTES.txt"):
            notes = text
            continue
        documents = [d.strip() for d in _SEPARATOR.split(text) if d.strip()]
        if documents:
            files[relative] = "".join(f"---\n# Source: {path}\n{d}\n" for d in documents)
    return files, notes


RECONCILER = f"{RELEASE}-effectq-reconciler"
API = f"{RELEASE}-effectq-api"


def worker_name(pool: str) -> str:
    return f"{RELEASE}-effectq-worker-{pool}"


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    only: dict[str, Any] = containers[0]
    return only


def block(document: str, key: str, indent: int) -> str:
    """The text under `key:` (a top-level key of `document`), dedented by `indent`."""
    lines = document.split("\n")
    start = lines.index(f"{key}:") + 1
    kept = []
    for line in lines[start:]:
        if line and not line.startswith(" " * indent):
            break
        kept.append(line[indent:])
    return "\n".join(kept).rstrip("\n") + "\n"


def rules_file(files: dict[str, str]) -> str:
    """The rendered PrometheusRule's spec, as a Prometheus rules file."""
    (document,) = [d for d in files["templates/prometheusrule.yaml"].split("---\n") if d]
    return block(document, "spec", 2)


def option(args: list[str], flag: str) -> list[str]:
    """Every value given to `flag` in a container's args."""
    return [args[i + 1] for i, arg in enumerate(args) if arg == flag]
