"""The container image the Helm chart runs, built from the repository's Dockerfile and run
the way the chart runs it: uid 10001, a read-only root filesystem, /tmp and the metrics
directory as tmpfs. The base is Debian bookworm made here (mmdebstrap + podman import: no
registry is needed), reproducibly, and checked against its pinned SHA-256 (``BASE_SHA256``,
docs/release.md), so the Dockerfile is built with ``--build-arg BASE=…`` and the
repository's version (``--build-arg VERSION=…``, setuptools-scm).

In the image: ``effectq --version`` (the repository's version, as ``effectq_build_info``
on both metrics endpoints below); then ``effectq worker`` and ``effectq reconciler``
(host network) against a redis-server and the sandbox provider this test started, until
real effects are DONE — submitted ones by the worker pool, claims whose holder "died" by the
reconciler, found at the provider —, each executed once; then SIGTERM drains the pool with
calls in flight and both exit 0.

Needs podman, runc and mmdebstrap (Debian packages; .ci/run installs them) and takes
minutes: set EFFECTQ_TEST_BASE_TARBALL to a path outside the repository to keep the base
tarball between local runs (CI builds it fresh)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dedupe import Ledger, State
from tests.support.requires import need_binary
from tests.support.stack import wait_for, wait_states
from workers.dev.local import LocalStack
from workers.dev.ports import free_port

REPO = Path(__file__).resolve().parents[2]
# crun refuses this kind of machine's cgroups; the default ulimits are refused too.
PODMAN = ["--runtime", "runc", "--cgroup-manager=cgroupfs"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
METRICS_DIR = "/var/run/effectq/metrics"  # the chart's emptyDir for the pool's metrics
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def podman(*args: str, timeout: float = 60, check: bool = True) -> str:
    done = subprocess.run(
        [need_binary("podman", "apt-get install podman runc"), *PODMAN, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {args[0]}: exit {done.returncode}: {done.stderr[-3000:]}")
    return done.stdout


# The base, pinned by its content (docs/release.md): bookworm from deb.debian.org, made
# reproducible by a fixed SOURCE_DATE_EPOCH, so the same suite gives the same tarball.
BASE_SUITE = ("bookworm", "http://deb.debian.org/debian")
BASE_EPOCH = "1735689600"
BASE_SHA256 = "25b819cb4c8131bd0b56a6c4384b6fbac3eb5ed2ec1c875e64ab139e14edef9a"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _base_tarball(tmp: Path) -> Path:
    cached = os.environ.get("EFFECTQ_TEST_BASE_TARBALL")
    path = Path(cached) if cached else tmp / "rootfs.tar"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.tar")
        subprocess.run(
            [
                need_binary("mmdebstrap", "apt-get install mmdebstrap"),
                "--variant=apt", "--include=python3,python3-venv", BASE_SUITE[0],
                str(partial), BASE_SUITE[1],
            ],
            check=True, capture_output=True, timeout=900, stdin=subprocess.DEVNULL,
            env={**os.environ, "SOURCE_DATE_EPOCH": BASE_EPOCH},
        )  # fmt: skip
        partial.rename(path)
    made = _sha256(path)
    assert made == BASE_SHA256, (
        f"the base's content changed (sha256 {made}, pinned {BASE_SHA256}): Debian moved "
        f"{BASE_SUITE[0]} (a point release) or mmdebstrap changed; review it and record the "
        "new digest (docs/release.md)"
    )
    return path


def repo_version() -> str:
    """The version setuptools-scm gives this checkout (the image's VERSION)."""
    done = subprocess.run(
        [sys.executable, "-m", "setuptools_scm"], cwd=REPO, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    need_binary("runc", "apt-get install runc")
    tag = uuid.uuid4().hex[:8]
    base, built = f"localhost/effectq-test-base:{tag}", f"localhost/effectq-test:{tag}"
    started = time.monotonic()
    podman("import", str(_base_tarball(tmp_path_factory.mktemp("base"))), base, timeout=300)
    # A machine behind a TLS-inspecting proxy trusts it in the system bundle; pip in the
    # image's venv is handed that bundle (a build argument, not kept in the image).
    certs = (
        ["-v", f"{CA_BUNDLE.parent}:/host-certs:ro", "--build-arg",
         f"PIP_CERT=/host-certs/{CA_BUNDLE.name}"]
        if CA_BUNDLE.exists() else []
    )  # fmt: skip
    try:
        podman(
            "build", "--network", "host", "--build-arg", f"BASE={base}", *certs,
            "--build-arg", f"VERSION={repo_version()}",
            "-t", built, str(REPO), timeout=1200,
        )  # fmt: skip
        size = json.loads(podman("image", "inspect", built))[0]["Size"]
        print(f"\nimage {built}: {size / 1e6:.0f} MB, built in {time.monotonic() - started:.0f} s")
        yield built
    finally:
        podman("rmi", "-f", built, base, check=False)


def run_args(name: str, stack: LocalStack, **env: str) -> list[str]:
    """``podman run`` as the chart runs the pod (securityContext, volumes, env)."""
    environment = {
        "EFFECTQ_REDIS_URL": stack.ledger_url,
        "EFFECTQ_BROKER_URL": stack.broker_url,
        "EFFECTQ_PROVIDER_URL": stack.sandbox.url,
        "EFFECTQ_METRICS_HOST": "127.0.0.1",
        **env,
    }
    return [
        "run", "--name", name, *LIMITS, "--user", "10001:10001", "--read-only",
        "--tmpfs", "/tmp:rw,mode=1777", "--tmpfs", f"{METRICS_DIR}:rw,mode=1777",
        "--network", "host", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        *(arg for key, value in environment.items() for arg in ("-e", f"{key}={value}")),
    ]  # fmt: skip


SUBMIT = """
import json, os, sys, time
import httpx
from dedupe import derive
from workers import get_tool, runtime, submit
import workers.examples

tag = sys.argv[4]
keys = [submit("send_email", scope=f"{tag}-{i}", recipient=f"u{i}@example.com",
               subject="s").key for i in range(int(sys.argv[1]))]
keys += [submit("charge", scope=f"{tag}-c{i}", customer=f"c{i}", amount="1.00",
                currency="eur").key for i in range(int(sys.argv[2]))]
# Claims whose holder died after the provider executed the call: the reconciler's work.
orphans = []
provider = httpx.Client(base_url=os.environ["EFFECTQ_PROVIDER_URL"])
for i in range(int(sys.argv[3])):
    effect = derive(get_tool("charge").spec, f"{tag}-dead-{i}",
                    {"customer": f"d{i}", "amount": "2.00", "currency": "eur"})
    claim = runtime.ledger().claim(effect, lease_s=0.5, holder="dead/1")
    headers = {"Idempotency-Key": claim.idempotency_key, "Fencing-Token": str(claim.token)}
    provider.post("/v1/effects", json={"i": i}, headers=headers).raise_for_status()
    orphans.append(effect.key)
print(json.dumps({"keys": keys, "orphans": orphans}))
"""


def submit(
    stack: LocalStack, tag: str, emails: int, charges: int = 0, orphans: int = 0
) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", SUBMIT, str(emails), str(charges), str(orphans), tag],
        env=stack.env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return result


def prestop_hook() -> list[str]:
    """The worker pods' preStop command as the chart renders it by default."""
    import helm_python
    import yaml

    from tests.chart._chart import CHART, NAMESPACE, RELEASE, helm_template, worker_name

    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render({}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    files, _ = helm_template(manifests)
    for document in yaml.safe_load_all("".join(files.values())):
        if document and (document["kind"], document["metadata"]["name"]) == (
            "Deployment",
            worker_name("default"),
        ):
            spec = document["spec"]["template"]["spec"]
            command: list[str] = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
            return command
    raise AssertionError("no default worker Deployment rendered")


def test_the_image_runs_as_the_chart_runs_it(image: str, tmp_path: Path) -> None:
    version = podman(
        "run", "--rm", *LIMITS, "--user", "10001:10001", "--read-only", "--tmpfs", "/tmp",
        image, "--version",
    )  # fmt: skip
    # The version the repository gives (setuptools-scm), handed to the build.
    assert version == f"effectq {repo_version()}\n", version
    names = {role: f"effectq-test-{role}-{uuid.uuid4().hex[:6]}" for role in ("pool", "rec")}
    pool_port, rec_port = free_port(), free_port()
    with LocalStack(embedded=False, workdir=tmp_path) as stack:
        ledger = Ledger.from_url(stack.ledger_url)
        try:
            podman(
                *run_args(names["pool"], stack, EFFECTQ_METRICS_PORT=str(pool_port),
                          EFFECTQ_METRICS_DIR=METRICS_DIR),
                "-d", image, "worker", "--processes", "2", "--threads", "4",
                "--shutdown-timeout-ms", "60000",
            )  # fmt: skip
            podman(
                *run_args(names["rec"], stack, EFFECTQ_EXAMPLE_SETTLE_S="0.5"),
                "-d", image, "reconciler", "--interval", "0.3", "--metrics-port", str(rec_port),
            )  # fmt: skip
            work = submit(stack, "first", emails=20, charges=10, orphans=4)
            records = wait_states(ledger, work["keys"] + work["orphans"], timeout=180)
            for key in work["orphans"]:
                assert "found at the provider" in (records[key].reason or ""), records[key]
            executions = stack.stats()["executions"]
            assert executions == {key: 1 for key in records}, executions

            # Both metrics endpoints answer (the pool's from its tmpfs multiprocess dir).
            build_info = f'effectq_build_info{{version="{repo_version()}"}} 1.0'
            for port, series in ((pool_port, "effectq_claims_total"), (rec_port, "effectq_")):
                body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                assert series in body, (port, body[:500])
                assert build_info in body, (port, build_info)

            # SIGTERM with calls in flight: the pool finishes them, then exits 0.
            stack.sandbox.configure(latency_ms=1500)
            slow = submit(stack, "in-flight", emails=4)["keys"]
            wait_for(
                lambda: all(
                    (r := ledger.get(k)) is not None and r.state is State.CLAIMED for k in slow
                ),
                what="in flight",
                timeout=60,
            )
            # The pool as Kubernetes stops it: the chart's preStop hook, run in the container
            # (it returns once the pool has drained), then the kubelet's SIGTERM.
            hook = subprocess.run(
                ["podman", *PODMAN, "exec", names["pool"], *prestop_hook()],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            # 0, or killed with the container when PID 1 exits first (the drain was over);
            # an import the image lacks is exit 1 and a traceback (FailedPreStopHook).
            assert hook.returncode in (0, 137) and not hook.stderr.strip(), hook
            for name in names.values():
                podman("kill", "--signal", "TERM", name, check=False)  # the pool may be gone
            for name in names.values():
                assert podman("wait", name, timeout=120).strip() == "0", podman("logs", name)
            wait_states(ledger, slow, timeout=10)
            assert all(stack.stats()["executions"].get(k) == 1 for k in slow)
            for name in names.values():
                logs = podman("logs", name)
                for trouble in ("Traceback", "Read-only file system", "Permission denied"):
                    assert trouble not in logs, (name, logs[-3000:])
        finally:
            podman("rm", "-f", *names.values(), check=False)
            ledger.client.close()
