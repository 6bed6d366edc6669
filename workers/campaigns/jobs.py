"""A campaign job, its writer and its reader in one place. Large campaigns submitted over the
API run as jobs: ``POST /v1/campaigns`` answers 202 with the job's URL at once, and a
thread of the API process (not the request's) plans and fans the campaign out, recording
its phase and progress with the campaign in Redis, where any replica answers
``GET /v1/campaigns/{id}/jobs/{job}``.

While the API process holds a job — queued behind others, or running — it stamps the job
with the ledger's time every ``JOB_BEAT_S`` (a heartbeat); every time a job's record holds
is the ledger's (Redis ``TIME``), so API hosts whose clocks disagree judge it alike
(``read_job``). A job whose process died stops beating; its status then says so
(``lost``), and the campaign is submitted again: re-submission sends only what is not done
(DESIGN §3). A job waiting for its turn is ``queued``, however long it waits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from dedupe import CampaignNotFoundError, CampaignStore, EffectqError, Ledger
from dedupe.campaigns import normalize_campaign_id
from dedupe.errors import code_of

from ..registry import get_tool
from .file import CampaignFile
from .status import campaign_status

if TYPE_CHECKING:
    from ..runtime import Runtime

__all__ = ["JOB_BEAT_S", "JOB_LOST_MS", "JOB_TTL_S", "CampaignJobs", "JobState", "read_job"]

log = logging.getLogger(__name__)

# A job's record outlives its end by a day: long enough to be read, short of piling up.
JOB_TTL_S = 86_400.0
# How often a held job is stamped: well inside the silence that reads as lost
# (``JOB_LOST_MS``, 60 s), a slow Redis round trip or two included.
JOB_BEAT_S = 10.0


class JobState(StrEnum):
    """A campaign job's phase: ``POST /v1/campaigns`` runs a large campaign as a job of an
    API process, and any replica answers ``GET /v1/campaigns/{id}/jobs/{job}`` with it."""

    #: Waiting for its turn in its API process, however long.
    QUEUED = "queued"
    #: Reading the recipients into the plan.
    PLANNING = "planning"
    #: The plan approved: fanning the messages out.
    SENDING = "sending"
    #: Every recipient fanned out (the report says how).
    DONE = "done"
    #: Stopped with an error (the job's ``error`` says which).
    FAILED = "failed"
    #: Its process stopped beating (read only, never written): submit the campaign again.
    LOST = "lost"


# -- the writer: the API process that runs the job ----------------------------------------


class CampaignJobs:
    """The API process's campaign jobs: ``workers`` at a time, the rest queued in order."""

    def __init__(self, rt: Runtime, workers: int = 1, *, beat_s: float = JOB_BEAT_S) -> None:
        self.rt = rt
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="effectq-campaign-job")
        self.beat_s = beat_s
        self._held: set[tuple[str, str]] = set()  # queued or running here
        self._lock = threading.Lock()
        self._beating = False

    def start(self, spec: CampaignFile) -> tuple[str, str]:
        """Queue ``spec``; (campaign id, job id). An unknown tool is refused here."""
        get_tool(spec.tool)
        campaign_id = normalize_campaign_id(spec.campaign_id)
        job_id = secrets.token_hex(8)
        self._write(campaign_id, job_id, state=JobState.QUEUED, recipients=len(spec.recipients),
                    planned=0, sent=0)  # fmt: skip
        self._hold((campaign_id, job_id))
        self.pool.submit(self._run, campaign_id, job_id, spec)
        return campaign_id, job_id

    def _write(self, campaign_id: str, job_id: str, **fields: str | int) -> None:
        ledger = self.rt.ledger()
        # The ledger's clock, not this host's: another API host reads the age.
        fields["updated_ms"] = fields["beat_ms"] = ledger.server_time_ms()
        CampaignStore(ledger).write_job(campaign_id, job_id, fields, JOB_TTL_S)

    # -- the heartbeat of the jobs held here ----------------------------------------------

    def _hold(self, job: tuple[str, str]) -> None:
        with self._lock:
            self._held.add(job)
            if self._beating:
                return
            self._beating = True
        threading.Thread(target=self._beat, name="effectq-campaign-beat", daemon=True).start()

    def _beat(self) -> None:
        """Stamp every held job with the ledger's time, every ``beat_s``, while any is held."""
        while True:
            time.sleep(self.beat_s)
            with self._lock:
                held = sorted(self._held)
                if not held:
                    self._beating = False
                    return
            try:
                ledger = self.rt.ledger()
                now_ms = ledger.server_time_ms()
                store = CampaignStore(ledger)
                for campaign_id, job_id in held:
                    store.write_job(campaign_id, job_id, {"beat_ms": now_ms}, JOB_TTL_S)
            except Exception as exc:
                # A ledger outage: the next beat tries again (the jobs read as lost meanwhile
                # only if it lasts past the threshold).
                log.warning("campaign job heartbeat failed: %s", type(exc).__name__)

    def _run(self, campaign_id: str, job_id: str, spec: CampaignFile) -> None:
        try:
            self._execute(campaign_id, job_id, spec)
        finally:
            with self._lock:
                self._held.discard((campaign_id, job_id))

    def _execute(self, campaign_id: str, job_id: str, spec: CampaignFile) -> None:
        done = {"planned": 0, "sent": 0}

        def advance(what: str, state: JobState) -> Callable[[int], None]:
            def step(n: int) -> None:
                done[what] += n
                self._write(campaign_id, job_id, state=state, **done)

            return step

        # Here, not at the top: the reader (the verbs' door) does not pay for the fan-out.
        from .submit import submit_campaign

        try:
            self._write(campaign_id, job_id, state=JobState.PLANNING)
            report = submit_campaign(
                spec.campaign_id, spec.tool, spec.recipients, spec.args, action=spec.action,
                plan_version=spec.plan_version, planning=advance("planned", JobState.PLANNING),
                progress=advance("sent", JobState.SENDING),
            )  # fmt: skip
        except EffectqError as exc:
            code = code_of(exc)  # the row the API answers this error with
            if code.status >= 500:  # the ledger's or an unmapped error: its kind only
                log.error("campaign job failed: %s", type(exc).__name__)
            self._write(campaign_id, job_id, state=JobState.FAILED, error=code.kind,
                        message=code.says or exc.message)  # fmt: skip
        except Exception as exc:
            # Its kind only: a message or traceback may carry a recipient.
            log.error("campaign job failed: %s", type(exc).__name__)
            self._write(campaign_id, job_id, state=JobState.FAILED, error="internal",
                        message="internal error")  # fmt: skip
        else:
            self._write(
                campaign_id, job_id, state=JobState.DONE, report=json.dumps(report.as_dict())
            )


# -- the reader: any replica --------------------------------------------------------------


#: A job not stamped for this long by the ledger's clock was lost with its process (the
#: process holding it stamps it every ``JOB_BEAT_S``, queued or running).
JOB_LOST_MS = 60_000
_JOB_INTS = ("recipients", "planned", "sent", "updated_ms")


def read_job(
    ledger: Ledger, campaign_id: str, job_id: str, *, lost_after_ms: int | None = None
) -> dict[str, Any]:
    """A campaign job (``GET /v1/campaigns/{id}/jobs/{job}``): its state (queued, planning,
    sending, done, failed, lost), progress, the report or the error, and once its plan is
    approved the campaign's own status (counts, never-sent diff, a first page of
    recipients). CampaignNotFoundError when there is no such job; ``lost_after_ms``
    (default ``JOB_LOST_MS``) is the silence that reads as lost."""
    lost_after_ms = JOB_LOST_MS if lost_after_ms is None else lost_after_ms
    campaign_id = normalize_campaign_id(campaign_id)
    found = CampaignStore(ledger).job(campaign_id, job_id)
    if found is None:
        raise CampaignNotFoundError(f"no job {job_id!r} of campaign {campaign_id!r}")
    document: dict[str, Any] = {"job_id": job_id, "campaign_id": campaign_id}
    document.update({k: int(found.get(k, 0)) for k in _JOB_INTS})
    # "accepted": a queued job as the previous release wrote it.
    state = JobState.QUEUED if found["state"] == "accepted" else JobState(found["state"])
    # Both ends on the ledger's clock: stamped by the API host holding the job, read here
    # (another host, whose clock may disagree). A record without beat_ms predates it.
    beat_ms = max(document["updated_ms"], int(found.get("beat_ms", 0)))
    idle_ms = ledger.server_time_ms() - beat_ms
    if state not in (JobState.DONE, JobState.FAILED) and idle_ms > lost_after_ms:
        state = JobState.LOST
        document["error"] = {"error": "lost", "message": "the process running this job "
                             "stopped; submit the campaign again: only recipients not yet "
                             "done are sent"}  # fmt: skip
    document["state"] = state.value
    if "error" in found:
        document["error"] = {"error": found["error"], "message": found.get("message", "")}
    document["report"] = json.loads(found["report"]) if "report" in found else None
    document["campaign"] = None
    if state in (JobState.SENDING, JobState.DONE, JobState.LOST):
        with contextlib.suppress(CampaignNotFoundError):  # its plan expired since
            document["campaign"] = campaign_status(campaign_id, page_size=10, ledger=ledger)
    return document
