"""Shutdown alignment: one value per pool drives Dramatiq's --worker-shutdown-timeout and
the pod's grace period, and the preStop hook drains the pool before Kubernetes' SIGTERM.

The live tests run the rendered worker command as PID 1 of a fresh PID namespace (as in
a container) and the rendered preStop hook inside it, then send the SIGTERM the kubelet
sends once the hook returns."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import redis

from tests.chart._chart import VARIANTS, Rendered, container, option, worker_name
from tests.support.requires import need_binary, unavailable
from workers.dev.redis_server import RedisServer

# (variant, pool) -> (shutdownTimeoutSeconds, terminationGraceMarginSeconds) as set in
# VARIANTS, or the chart's defaults (60, 15).
ALIGNED = {
    ("default", "default"): (60, 15),
    ("hpa", "default"): (60, 15),
    ("keda", "default"): (60, 15),
    ("full", "default"): (60, 15),
    ("two-pools", "payments"): (120, 20),
    ("two-pools", "email"): (60, 15),
}


def test_every_pool_of_every_variant_is_checked(variants: dict[str, Rendered]) -> None:
    workers = {
        (variant, d["metadata"]["labels"]["effectq.io/pool"])
        for variant, rendered in variants.items()
        for d in rendered.all("Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    }
    assert workers == set(ALIGNED)
    assert VARIANTS["two-pools"]["pools"][0]["shutdownTimeoutSeconds"] == 120


@pytest.mark.parametrize(("variant", "pool"), sorted(ALIGNED))
def test_one_value_drives_dramatiq_and_the_grace_period(
    variants: dict[str, Rendered], variant: str, pool: str
) -> None:
    timeout_s, margin_s = ALIGNED[(variant, pool)]
    deployment = variants[variant].one("Deployment", worker_name(pool))
    worker = container(deployment)
    assert option(worker["args"], "--shutdown-timeout-ms") == [str(timeout_s * 1000)]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == timeout_s + margin_s
    # The margin covers the consumers' stop (up to Dramatiq's 5 s Redis poll), the requeue
    # of prefetched messages and the exit; the schema refuses less than 10 s.
    assert grace - timeout_s >= 10
    command = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    assert "os.kill(1, signal.SIGTERM)" in command[2]


# -- live -------------------------------------------------------------------------------


@dataclass
class Pod:
    """The worker container's process tree, PID 1 of its own PID namespace."""

    namespace: subprocess.Popen[str]
    init: psutil.Process
    log: list[str] = field(default_factory=list)

    def wait_for(self, text: str, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while sum(text in line for line in self.log) < count:
            assert self.namespace.poll() is None, "\n".join(self.log[-30:])
            assert time.monotonic() < deadline, "\n".join(self.log[-30:])
            time.sleep(0.05)

    def exec(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        """What the kubelet does with an exec hook: run it inside the container."""
        return subprocess.run(
            ["nsenter", "--target", str(self.init.pid), "--pid", "--mount", "--", *command],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    def kubelet_sigterm(self) -> None:
        # The pool may have exited already: the kubelet then finds a stopped container.
        with contextlib.suppress(psutil.NoSuchProcess):
            self.init.send_signal(signal.SIGTERM)


@pytest.fixture
def pod(
    variants: dict[str, Rendered],
    shared_redis_server: RedisServer,
    shared_redis: redis.Redis,
    tmp_path: Path,
) -> Iterator[Pod]:
    """The default pool's rendered command (`effectq worker ...`), two Dramatiq
    processes up and idle, on a server emptied first (``shared_redis``): other tests leave
    ledgers of their own namespaces there, and a worker refuses the default namespace on a
    ledger that holds only others' records and no version record."""
    unshare = need_binary("unshare", "util-linux")
    need_binary("nsenter", "util-linux")
    args = container(variants["default"].one("Deployment", worker_name("default")))["args"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EFFECTQ_", "PROMETHEUS_"))}
    env |= {
        "EFFECTQ_REDIS_URL": shared_redis_server.url,
        "EFFECTQ_BROKER_URL": shared_redis_server.url.rsplit("/", 1)[0] + "/1",
        "EFFECTQ_METRICS_PORT": "0",
        "EFFECTQ_METRICS_DIR": str(tmp_path / "metrics"),
    }
    effectq = shutil.which("effectq", path=str(Path(sys.executable).parent))
    assert effectq is not None
    namespace = subprocess.Popen(
        [unshare, "--pid", "--fork", "--mount-proc", effectq, *args],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert namespace.stderr is not None
    stderr = namespace.stderr
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(line.rstrip() for line in stderr))
    reader.start()
    try:
        time.sleep(0.5)
        if namespace.poll() is not None:
            reader.join(5)
            unavailable(f"unshare cannot make a PID namespace here: {' '.join(log)[-300:]}")
        (init,) = psutil.Process(namespace.pid).children()
        running = Pod(namespace, init, log)
        running.wait_for("Worker process is ready for action", 2, timeout_s=60)
        yield running
    finally:
        if namespace.poll() is None:
            namespace.kill()  # unshare's child, PID 1, takes the whole namespace with it
        namespace.wait(30)
        reader.join(5)


def _prestop(variants: dict[str, Rendered]) -> list[str]:
    worker = container(variants["default"].one("Deployment", worker_name("default")))
    command: list[str] = worker["lifecycle"]["preStop"]["exec"]["command"]
    # The image's python with nothing but the standard library (-S: no site-packages, -I:
    # no user site, no PYTHONPATH): the image installs the core and its extras only, and
    # this shell has every dev package (psutil among them), which hid a hook that imported
    # one the image lacks.
    return [sys.executable, "-I", "-S", *command[1:]]


def test_prestop_drains_the_pool_before_the_kubelets_sigterm(
    variants: dict[str, Rendered], pod: Pod
) -> None:
    hook = pod.exec(_prestop(variants))
    # The hook returned because the Dramatiq processes had exited (or it went down with
    # PID 1, when the supervisor exits first: harmless, the drain was over either way).
    assert hook.returncode in (0, 128 + signal.SIGKILL), hook.stderr
    pod.kubelet_sigterm()
    assert pod.namespace.wait(30) == 0
    time.sleep(0.2)  # the last log lines
    log = "\n".join(pod.log)
    assert log.count("Stopping worker process") == 2
    assert log.count("Worker has been shut down") == 2
    assert "Killing worker process" not in log


def test_a_second_sigterm_during_the_drain_does_not_kill_the_workers(pod: Pod) -> None:
    # A hook that returns at once lets the kubelet's SIGTERM reach the pool while it drains.
    # Dramatiq's worker process takes a second SIGTERM as "exit now"; effectq's counts only
    # the first, so the drain goes on (the hook's wait stays: it keeps the order plain).
    hook = pod.exec(["kill", "-TERM", "1"])
    assert hook.returncode == 0, hook.stderr
    pod.wait_for("Stopping worker process", 2, timeout_s=10)
    pod.kubelet_sigterm()
    assert pod.namespace.wait(30) == 0
    time.sleep(0.2)
    log = "\n".join(pod.log)
    assert "Killing worker process" not in log
    assert log.count("Worker has been shut down") == 2
