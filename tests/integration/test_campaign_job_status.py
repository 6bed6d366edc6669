"""A campaign job's status is judged on the ledger's clock, from its runner's heartbeat: a
job queued behind another is ``queued`` however long it waits and however wrong the API
hosts' clocks are; ``lost`` is a job whose runner stopped beating. Real Redis (the session
stack); the API process's job runner in this process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from dedupe import CampaignStore
from tests.support.stack import wait_for
from workers import runtime, verbs
from workers.campaigns import CampaignFile
from workers.campaigns.jobs import JOB_TTL_S, CampaignJobs
from workers.dev.local import LocalStack

SPEC = CampaignFile(
    campaign_id="spring-queued",
    tool="send_email",
    args={"subject": "Spring sale", "body": "Hello!"},
    recipients=["ana@example.com"],
)


def _skew(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This host's wall clock off by ``seconds`` (time.time, as every reader of it sees)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


@pytest.fixture
def busy(live: LocalStack) -> Iterator[CampaignJobs]:
    """An API process's job runner whose one slot is taken: a job started now is queued."""
    jobs = CampaignJobs(runtime.current(), beat_s=0.1)
    release = threading.Event()
    jobs.pool.submit(release.wait)
    yield jobs
    release.set()
    jobs.pool.shutdown(wait=True)  # the queued job runs (one recipient), its beat ends


def _state(job: tuple[str, str], lost_after_ms: int = 60_000) -> str:
    document = verbs.campaign_job(verbs.operator(), *job, lost_after_ms=lost_after_ms)
    state: str = document["state"]
    return state


@pytest.mark.parametrize("writer_skew", [-61.0, 0.0])
def test_a_queued_job_is_queued_whatever_the_api_hosts_clocks_say(
    busy: CampaignJobs, monkeypatch: pytest.MonkeyPatch, writer_skew: float
) -> None:
    # Written by an API host whose clock is behind, read by one whose clock is ahead.
    _skew(monkeypatch, writer_skew)
    job = busy.start(SPEC)
    monkeypatch.undo()
    _skew(monkeypatch, 61.0)
    assert _state(job) == "queued"


def test_a_job_queued_longer_than_the_threshold_stays_queued_while_its_runner_beats(
    busy: CampaignJobs,
) -> None:
    job = busy.start(SPEC)
    started = time.monotonic()
    while time.monotonic() - started < 1.5:  # three thresholds of 0.5 s
        assert _state(job, lost_after_ms=500) == "queued"
        time.sleep(0.1)


@pytest.mark.parametrize("state", ["queued", "sending"])
def test_a_job_whose_runner_stopped_beating_is_lost_by_the_ledgers_clock(
    live: LocalStack, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    # The record a killed API process leaves: its beat stopped now.
    ledger = runtime.ledger()
    now_ms = ledger.server_time_ms()
    fields = {"state": state, "recipients": 1, "planned": 0, "sent": 0,
              "updated_ms": now_ms, "beat_ms": now_ms}  # fmt: skip
    job = ("spring-queued", "00000000000000aa")
    CampaignStore(ledger).write_job(*job, fields, JOB_TTL_S)
    _skew(monkeypatch, -3600.0)  # a reader whose clock is an hour behind sees it all the same
    assert _state(job, lost_after_ms=300) == state
    wait_for(
        lambda: _state(job, lost_after_ms=300) == "lost",
        timeout=5,
        what=f"a {state} job without a runner reported lost",
    )
