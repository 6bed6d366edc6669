"""The processes under ``effectq worker`` die with their parent: a SIGKILLed Dramatiq main
process takes its worker processes with it (they drain, as on any shutdown signal, and
stop consuming), while the supervisor starts its replacement and says what it found."""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil

from dedupe import State
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import runtime, submit
from workers.dev.local import LocalStack
from workers.dev.ports import free_port


def _charge(scope: str) -> str:
    return submit("charge", scope=scope, customer="c-9", amount="12.50", currency="usd").key


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (an adopter that does not reap keeps those)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _main_of(worker: int) -> int:
    return psutil.Process(worker).ppid()


def test_a_sigkilled_dramatiq_main_process_takes_its_worker_process_with_it(
    live: LocalStack,
) -> None:
    pool = live.start_workers(1, 2)
    [worker] = live.wait_for_workers(1)
    main = _main_of(worker)
    assert main != pool.pid  # supervisor -> dramatiq main process -> worker process
    os.kill(main, signal.SIGKILL)
    killed = time.monotonic()
    # Not left consuming beside its replacement with PPID 1.
    wait_for(lambda: _gone(worker), what="the orphaned worker process gone", timeout=20)
    print(f"orphaned worker process gone {time.monotonic() - killed:.1f}s after the kill")
    wait_for(
        lambda: any(p != worker for p in live.worker_processes(pool)),
        what="the supervisor's replacement worker process",
        timeout=30,
    )
    # The replacement consumes, and it alone.
    key = _charge("order-after-main-kill")
    wait_states(runtime.ledger(), [key], timeout=30)
    assert live.stats()["executions"] == {key: 1}
    assert pool.poll() is None


def test_an_orphaned_worker_process_drains_its_call_and_the_supervisor_reports_it(
    fenceless: LocalStack,
) -> None:
    fenceless.sandbox.configure(latency_ms=3000)
    port = free_port()
    pool = fenceless.start_workers(1, 2, EFFECTQ_METRICS_PORT=str(port))
    [worker] = fenceless.wait_for_workers(1)
    key = _charge("order-orphaned-mid-call")
    ledger = runtime.ledger()
    wait_states(ledger, [key], {State.CLAIMED}, timeout=30)
    os.kill(_main_of(worker), signal.SIGKILL)
    # The parent-death signal is a shutdown like any other: the call in flight finishes,
    # is committed and acked; it is never killed, never run twice.
    wait_states(ledger, [key], timeout=30)
    wait_for(lambda: _gone(worker), what="the orphaned worker process gone", timeout=30)
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="message acked", timeout=30)
    assert fenceless.stats()["executions"] == {key: 1}
    # The supervisor saw the orphan (still draining when it looked) and counted it.
    wait_for(
        lambda: "stray process" in fenceless.log("workers.log"),
        what="the supervisor's stray line",
        timeout=10,
    )
    log = fenceless.log("workers.log")
    assert f"{worker}" in log.split("stray process", 1)[1].splitlines()[0], log[-3000:]
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert "effectq_worker_strays_total 1.0" in scraped.splitlines()
    assert pool.poll() is None
