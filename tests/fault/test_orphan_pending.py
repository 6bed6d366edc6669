"""A producer killed between its pending marker and the broker's enqueue leaves no message:
the marker is only a reservation until the broker accepted the message, which never answers
"pending", so the next submission sends it at once (and the reservation lapses within
seconds by itself: issue 15, item 8)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.stack import DRAINED, broker_messages, wait_for
from workers import get_tool, runtime
from workers.dev.local import LocalStack
from workers.producer import Status, submit

# Long, so that nothing here passes by the reservation lapsing.
RESERVATION_S = "600"


def _killed_at_mark(stack: LocalStack, *args: str) -> None:
    """Run an ``effectq`` producer command that SIGKILLs itself right after its marker."""
    env = stack.env(
        EFFECTQ_FAILPOINTS="after_submit_mark=kill", EFFECTQ_PENDING_RESERVATION_S=RESERVATION_S
    )
    command = [sys.executable, "-m", "workers", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr


def test_a_producer_killed_between_marker_and_enqueue_leaves_nothing_pending(
    live: LocalStack,
) -> None:
    args = {"recipient": "orphan@example.com", "subject": "hi"}
    key = get_tool("send_email").derive("order-orphan", args).key
    _killed_at_mark(
        live, "submit", "send_email", "--scope", "order-orphan",
        "--arg", "recipient=orphan@example.com", "--arg", "subject=hi",
    )  # fmt: skip
    assert broker_messages(live)["live"] == 0  # the producer died before the enqueue
    assert runtime.ledger().has_pending(key)  # the dead producer's reservation
    handle = submit("send_email", scope="order-orphan", **args)
    assert handle.status is Status.ENQUEUED and handle.key == key
    live.start_workers(1, 2)
    assert handle.wait(30)["key"] == key
    wait_for(lambda: broker_messages(live) == DRAINED, what="drained")
    assert live.stats()["executions"] == {key: 1}


def test_a_campaign_producer_killed_between_marker_and_enqueue_leaves_nothing_pending(
    live: LocalStack, tmp_path: Path
) -> None:
    people = [f"p{i}@example.com" for i in range(5)]
    path = tmp_path / "campaign.json"
    path.write_text(json.dumps({"campaign_id": "orphan-c", "tool": "send_email",
                                "args": {"subject": "hi"}, "recipients": people}))  # fmt: skip
    _killed_at_mark(live, "campaign", "submit", str(path))
    assert broker_messages(live)["live"] == 0
    tool = get_tool("send_email")
    keys = [tool.derive("orphan-c", {"recipient": p}).key for p in people]
    ledger = runtime.ledger()
    assert all(ledger.has_pending(k) for k in keys)  # the dead producer's reservations
    # The plan's effects are submitted by hand, one call each: a reservation is no message.
    handles = [submit(tool, scope="orphan-c", recipient=p, subject="hi") for p in people]
    assert {h.status for h in handles} == {Status.ENQUEUED}
    live.start_workers(1, 2)
    for handle in handles:
        handle.wait(30)
    wait_for(lambda: broker_messages(live) == DRAINED, what="drained")
    assert live.stats()["executions"] == dict.fromkeys(keys, 1)
    assert all(r is not None for r in ledger.get_many(keys).values())
