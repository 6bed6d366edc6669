"""The crash-point matrix: every failpoint of the worker path and of the reconciler
(DESIGN §9) x {kill, stop past the lease, raise}, one effect per cell, against the sandbox
with its own idempotency off (only effectq prevents a second execution).

Each cell: a pool (or reconciler) armed with the failpoint meets one effect; once the
failpoint fired, a clean pool and a clean reconciler take over; a SIGSTOPped holder is
SIGCONTed only after its lease expired and the effect was resolved. The end state is
asserted per cell: the provider's own execution count, the ledger's state, token and
history, late receipts and fenced writes of a holder that woke up, the message acked.

By default a representative subset runs; ``EFFECTQ_FULL_MATRIX=1`` runs all 21 cells.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import psutil
import pytest

from dedupe import EffectRecord, Ledger, State
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import runtime, submit
from workers.dev.local import LocalStack

WORKER_POINTS = ("after_claim", "before_effect", "after_effect", "before_commit", "after_commit")
RECONCILER_POINTS = ("before_lookup", "after_lookup")
ACTIONS = ("kill", "stop", "raise")
# Where the effect stands when the worker's failpoint fires: executed at the provider?
EXECUTED_AT = {"after_claim": 0, "before_effect": 0, "after_effect": 1, "before_commit": 1,
               "after_commit": 1}  # fmt: skip
# A reconciler frozen or dead holds its takeover for this long (default 30 s).
RECONCILER_LEASE_S = "3"

SUBSET = {
    ("after_claim", "kill"), ("after_claim", "raise"), ("before_effect", "stop"),
    ("after_effect", "kill"), ("after_effect", "stop"), ("before_commit", "raise"),
    ("before_commit", "stop"), ("after_commit", "kill"), ("after_commit", "stop"),
    ("before_lookup", "kill"), ("before_lookup", "stop"), ("after_lookup", "stop"),
    ("after_lookup", "raise"),
}  # fmt: skip
FULL = os.environ.get("EFFECTQ_FULL_MATRIX", "") not in ("", "0")


def _cells() -> list[Any]:
    # Cells outside the subset are not collected (rather than skipped) unless FULL.
    return [
        pytest.param(point, action, id=f"{point}-{action}")
        for point in (*WORKER_POINTS, *RECONCILER_POINTS)
        for action in ACTIONS
        if FULL or (point, action) in SUBSET
    ]


@dataclass
class Frozen:
    procs: list[psutil.Process]

    def resume(self) -> None:
        for proc in self.procs:
            proc.resume()


def _stopped(pids: list[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_STOPPED:
                procs.append(proc)
        except psutil.NoSuchProcess:
            continue
    return procs


def _charge(scope: str) -> str:
    return submit("charge", scope=scope, customer="c-7", amount="3.10", currency="eur").key


def _notes(record: EffectRecord) -> list[str]:
    return [h.note for h in record.history]


def _fired_raise(stack: LocalStack, ledger: Ledger, key: str, log: str) -> bool:
    record = ledger.get(key)
    in_history = record is not None and any("FailpointError" in n for n in _notes(record))
    return in_history or "FailpointError" in stack.log(log)


def _wait_fired(
    stack: LocalStack,
    ledger: Ledger,
    key: str,
    action: str,
    *,
    armed: subprocess.Popen[bytes],
    pids: list[int] | None,
    log: str,
) -> Frozen | None:
    """Until the armed failpoint acted; returns the frozen processes of a ``stop``."""
    if action == "kill":
        if pids is None:  # a reconciler: no supervisor, it stays dead
            wait_for(lambda: armed.poll() is not None, what="reconciler SIGKILLed")
        else:
            wait_for(lambda: "restarting in" in stack.log(log), what="worker SIGKILLed")
        return None
    if action == "stop":
        targets = pids if pids is not None else [armed.pid]

        def procs() -> list[psutil.Process]:
            return _stopped(targets)

        wait_for(procs, what="holder SIGSTOPped")
        return Frozen(procs())
    wait_for(lambda: _fired_raise(stack, ledger, key, log), what="failpoint raised")
    return None


def _ran_past_stop(stack: LocalStack, ledger: Ledger, key: str, point: str) -> None:
    """The frozen holder must stand exactly at its failpoint (tests/fault/test_failpoint_stop.py
    pins the thread-directed SIGSTOP this relies on)."""
    time.sleep(0.3)
    record = ledger.get(key)
    executions = stack.stats()["executions"].get(key, 0)
    done_early = point != "after_commit" and record is not None and record.state is State.DONE
    assert not done_early and executions <= EXECUTED_AT[point], (
        f"the holder ran past its stop at {point}: {record and record.state}, {executions} runs"
    )


@pytest.mark.slow
@pytest.mark.parametrize(("point", "action"), _cells())
def test_crash_point(fenceless: LocalStack, point: str, action: str) -> None:
    ledger = runtime.ledger()
    reconciler_cell = point in RECONCILER_POINTS
    key = f"{point}-{action}"
    frozen: Frozen | None = None
    # -- phase 1: the failpoint acts ----------------------------------------------------
    if not reconciler_cell:
        armed = fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS=f"{point}={action}")
        key = _charge(f"matrix-{point}-{action}")
        frozen = _wait_fired(
            fenceless, ledger, key, action, armed=armed,
            pids=fenceless.wait_for_workers(1, pool=armed), log="workers.log",
        )  # fmt: skip
        executed = EXECUTED_AT[point]
        if frozen is not None:
            _ran_past_stop(fenceless, ledger, key, point)
        assert fenceless.stats()["executions"].get(key, 0) == executed
        if frozen is None:
            fenceless.stop_pool(armed)  # the dead holder's pool; a frozen one stays frozen
    else:
        # A worker dies holding the claim (before executing, or after), then the armed
        # reconciler meets the expired claim.
        worker_point = "after_claim" if point == "before_lookup" else "after_effect"
        executed = EXECUTED_AT[worker_point]
        pool = fenceless.start_workers(1, 2, EFFECTQ_FAILPOINTS=f"{worker_point}=kill")
        key = _charge(f"matrix-{point}-{action}")
        wait_for(lambda: "restarting in" in fenceless.log("workers.log"), what="worker killed")
        fenceless.stop_pool(pool)
        armed = fenceless.start_reconciler(
            EFFECTQ_FAILPOINTS=f"{point}={action}", EFFECTQ_RECONCILER_LEASE_S=RECONCILER_LEASE_S
        )
        frozen = _wait_fired(
            fenceless, ledger, key, action, armed=armed, pids=None, log="reconciler.log"
        )
        assert fenceless.stats()["executions"].get(key, 0) == executed
        record = ledger.get(key)
        assert record is not None and record.state in (State.RECONCILING, State.CLAIMED)
        if action == "raise":
            # FailpointError is no EffectqError: it ends the reconciler process, which holds
            # its takeover until the reconciler lease runs out (like a kill).
            wait_for(lambda: armed.poll() is not None, what="reconciler exited", timeout=15)
    # -- phase 2: a clean pool and a clean reconciler take over ---------------------------
    fenceless.start_workers(1, 2)
    fenceless.start_reconciler(EFFECTQ_RECONCILER_LEASE_S=RECONCILER_LEASE_S)
    [record] = wait_states(ledger, [key], timeout=60).values()
    assert record is not None
    if frozen is not None:
        # Woken only after its lease expired and the effect was resolved by others; one
        # frozen after its commit, once the broker redelivered its message elsewhere.
        if point == "after_commit":
            wait_for(
                lambda: ledger.counts().get(("dup_claim", "charge"), 0) >= 1,
                what="redelivered to the clean pool",
                timeout=30,
            )
        before = ledger.counts()
        frozen.resume()
        if not reconciler_cell and point in ("after_effect", "before_commit"):
            # It executed before freezing: its commit is fenced, its receipt kept as evidence.
            try:
                wait_for(lambda: ledger.get(key).late_receipts, what="late receipt")  # type: ignore[union-attr]
            except AssertionError:
                print(ledger.get(key), fenceless.log("workers.log")[-6000:])
                raise
        elif point != "after_commit":

            def fenced() -> int:
                counts = ledger.counts().items()
                return sum(v - before.get(k, 0) for k, v in counts if k[0] == "fenced")

            wait_for(lambda: fenced() >= 1, what="the woken holder's write fenced")
    wait_for(lambda: broker_messages(fenceless) == DRAINED, what="message acked", timeout=60)
    # -- the end state -------------------------------------------------------------------
    record = ledger.get(key)
    assert record is not None and record.state is State.DONE, record
    assert fenceless.stats()["executions"] == {key: 1}, "executed other than exactly once"
    settles = [h for h in record.history if h.state == "DONE"]
    assert len(settles) == 1, record.history
    notes = _notes(record)
    if point == "after_commit":
        # Committed before the crash: nothing to reconcile, the redelivery is a duplicate.
        assert record.token == 1 and not any("reconciled" in n for n in notes), notes
        assert ledger.counts().get(("dup_claim", "charge"), 0) >= 1
    elif executed:
        assert any("found at the provider" in n for n in notes), notes
        assert not any("not found after the settle window" in n for n in notes), notes
        assert record.receipt is not None and record.receipt["token"] == 1
    else:
        # Never executed by the crashed holder: reconciled FAILED, then executed once by
        # the message's next delivery under a newer token.
        assert any("not found after the settle window" in n for n in notes), notes
        assert record.receipt is not None and record.receipt["token"] == record.token > 1
    if frozen is not None and not reconciler_cell and point in ("after_effect", "before_commit"):
        assert [lr["token"] for lr in record.late_receipts] == [1]
        assert ledger.counts().get(("fenced", "commit"), 0) >= 1
    if frozen is not None and reconciler_cell and point == "after_lookup":
        # The woken reconciler's write under its old takeover token changed nothing.
        assert record.token > 2
