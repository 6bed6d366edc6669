"""Health of real processes: what ``/healthz`` and ``/readyz`` of a worker pool's supervisor
and of a reconciler say, and what ``effectq worker`` does with a tools module it cannot
import (docs/observability.md).

A stalled child is made by SIGSTOP of a real Dramatiq worker process: its heartbeat thread
stops with it, and the supervisor's liveness fails once the heartbeat is older than
EFFECTQ_HEALTH_STALL_S (2 s here); SIGCONT brings it back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import wait_for
from workers.cli import reconciler_liveness
from workers.dev.local import LocalStack
from workers.dev.ports import free_port
from workers.lifeline import Heartbeat
from workers.metrics import ReconcilerMetrics

ROOT = Path(__file__).resolve().parents[2]


def probe(port: int, path: str) -> tuple[int, str]:
    """(status, body) of a probe; (0, reason) while nothing answers on the port yet."""
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__
    return answer.status_code, answer.text


def wait_status(port: int, path: str, status: int, *, timeout: float = 60.0) -> str:
    """Poll ``path`` until it answers ``status``; its body then."""
    seen: list[tuple[int, str]] = []

    def reached() -> bool:
        seen.append(probe(port, path))
        return seen[-1][0] == status

    try:
        wait_for(reached, timeout=timeout, what=f"{path} answering {status}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer {seen[-1] if seen else None}") from None
    return seen[-1][1]


def restarts(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "effectq_worker_restarts_total":
                return sample.value
    raise AssertionError("effectq_worker_restarts_total not served")


# -- the tools module ------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["broken_tools", "no_such_tools_module"])
def test_a_tools_module_that_cannot_be_imported_makes_effectq_worker_exit_2(
    tmp_path: Path, module: str
) -> None:
    (tmp_path / "broken_tools.py").write_text("raise RuntimeError('tools under repair')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "EFFECTQ_TOOLS": module,
        "EFFECTQ_METRICS_PORT": "0",
        # Nothing listens here: the tools are imported before anything is connected to.
        "EFFECTQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "workers", "worker", "-p", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effectq: "), done.stderr
    assert "EFFECTQ_TOOLS" in lines[0] and "Traceback" not in done.stderr


# -- the heartbeat ---------------------------------------------------------------------------


def test_a_heartbeat_is_withheld_while_every_worker_thread_is_stuck_or_a_thread_died(
    tmp_path: Path,
) -> None:
    # Dramatiq calls these hooks from the threads themselves; so do these two.
    beat = Heartbeat(tmp_path / "heartbeat-0", stall_s=0.3)
    go, release, quit_consumer = threading.Event(), threading.Event(), threading.Event()
    entered = threading.Event()

    def consume() -> None:
        beat.after_consumer_thread_boot(None, threading.current_thread())  # type: ignore[arg-type]
        quit_consumer.wait()

    def work() -> None:  # one worker thread, stuck in its message until released
        beat.after_worker_thread_boot(None, threading.current_thread())  # type: ignore[arg-type]
        go.wait()
        beat.before_process_message(None, None)  # type: ignore[arg-type]
        entered.set()
        release.wait()
        beat.after_process_message(None, None)  # type: ignore[arg-type]
        quit_consumer.wait()

    assert not beat.progressing()  # nothing consumes yet: not ready
    consumer = threading.Thread(target=consume, daemon=True)
    for thread in (consumer, threading.Thread(target=work, daemon=True)):
        thread.start()
    beat.after_worker_boot(None, None)  # type: ignore[arg-type]
    wait_for(beat.path.exists, timeout=10, what="the first heartbeat")
    go.set()
    assert entered.wait(10)
    assert beat.progressing()  # it just started a message: progress
    wait_for(lambda: not beat.progressing(), timeout=10, what="the stuck thread withholding it")
    release.set()
    wait_for(beat.progressing, timeout=10, what="progress again")
    quit_consumer.set()  # the consumer thread ends: the queue is no longer read
    consumer.join(10)
    assert not beat.progressing()


# -- a worker pool ---------------------------------------------------------------------------


@pytest.fixture
def pool_port(live: LocalStack) -> Iterator[tuple[LocalStack, int]]:
    port = free_port()
    yield live, port


def test_a_stalled_child_makes_healthz_fail_until_it_runs_again(
    pool_port: tuple[LocalStack, int],
) -> None:
    stack, port = pool_port
    pool = stack.start_workers(
        processes=2, threads=2, EFFECTQ_METRICS_PORT=str(port), EFFECTQ_HEALTH_STALL_S="2"
    )
    assert wait_status(port, "/readyz", 200) == "ok\n"
    assert probe(port, "/healthz") == (200, "ok\n")
    frozen = stack.worker_processes(pool)[0]
    os.kill(frozen, signal.SIGSTOP)
    try:
        body = wait_status(port, "/healthz", 503, timeout=30)
        assert "stalled: no heartbeat for" in body and body.count("\n") == 1, body
    finally:
        os.kill(frozen, signal.SIGCONT)
    assert wait_status(port, "/healthz", 200, timeout=30) == "ok\n"
    assert restarts(port) == 0


def test_restarts_are_counted_and_too_many_make_healthz_fail(
    pool_port: tuple[LocalStack, int],
) -> None:
    stack, port = pool_port
    pool = stack.start_workers(
        processes=1, threads=1, EFFECTQ_METRICS_PORT=str(port), EFFECTQ_HEALTH_MAX_RESTARTS="1"
    )
    for n in (1, 2):
        wait_status(port, "/readyz", 200)  # the (restarted) child consumes
        os.kill(stack.worker_processes(pool)[0], signal.SIGKILL)
        wait_for(lambda n=n: restarts(port) == n, timeout=60, what=f"restart {n} counted")
    body = wait_status(port, "/healthz", 503, timeout=10)
    assert "2 restarts within 300s (limit 1)" in body, body
    # The restarted child consumes again: ready, though no longer live.
    wait_status(port, "/readyz", 200)


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[LocalStack]:
    """A deployment of this test's own: its ledger's redis-server is stopped and started
    again, which must not take the session's stack (and every later test) down with it
    should the restart fail on a loaded machine."""
    with LocalStack(workdir=tmp_path) as stack:
        yield stack


def test_readyz_fails_while_the_ledger_does_not_answer(own_stack: LocalStack) -> None:
    stack, port = own_stack, free_port()
    stack.start_workers(processes=1, threads=1, EFFECTQ_METRICS_PORT=str(port))
    wait_status(port, "/readyz", 200)
    assert stack.redis is not None
    stack.redis.stop()
    try:
        body = wait_status(port, "/readyz", 503, timeout=30)
        assert "ledger unavailable" in body and "redis://" not in body, body
    finally:
        stack.stop_processes()
        stack.redis.start()


# -- a reconciler ----------------------------------------------------------------------------


def test_reconciler_liveness_fails_when_its_loop_stops_turning() -> None:
    observer = ReconcilerMetrics()
    check = reconciler_liveness(observer, 0.2)
    assert check().ok  # the first turn is due 0.2 s after the start
    wait_for(lambda: not check().ok, timeout=10, what="liveness failing")
    assert "the reconciler's loop has not turned for" in check().reasons[0]
    observer.pass_attempted()  # a pass that failed (the ledger down) is a turn all the same
    assert check().ok
    assert observer.last_pass is None  # ... but no finished pass: that is the alert's


def test_a_reconciler_stays_live_through_a_ledger_outage_and_is_not_ready(
    own_stack: LocalStack,
) -> None:
    """Kubernetes must not restart a reconciler because Redis is down: a restart cures
    nothing, and CrashLoopBackOff delays the recovery. Liveness is the loop turning; the
    ledger is readiness's (and EffectqReconcilerStalled's, on the last finished pass)."""
    port = free_port()
    own_stack.start_reconciler(
        interval=0.1, EFFECTQ_METRICS_PORT=str(port), EFFECTQ_HEALTH_STALL_S="0.5"
    )
    assert wait_status(port, "/healthz", 200) == "ok\n"
    assert wait_status(port, "/readyz", 200) == "ok\n"
    assert own_stack.redis is not None
    own_stack.redis.stop()  # every pass now fails: none finishes
    try:
        body = wait_status(port, "/readyz", 503, timeout=30)
        assert "ledger unavailable" in body, body
        # Six times the liveness limit (0.5 s here; 5 times the interval, at least the stall time)
        # without a finished pass: still live, every answer.
        answers: list[tuple[int, str]] = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            answers.append(probe(port, "/healthz"))
            time.sleep(0.1)
        assert answers and all(a == (200, "ok\n") for a in answers), answers
    finally:
        own_stack.redis.start()
    assert wait_status(port, "/readyz", 200, timeout=30) == "ok\n"
