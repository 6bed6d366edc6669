"""Large campaigns submitted over the API run as jobs: ``POST /v1/campaigns`` answers 202
with the job's URL at once, and a thread of the API process (not the request's) plans and
fans the campaign out, recording its phase and progress with the campaign in Redis, where
any replica answers ``GET /v1/campaigns/{id}/jobs/{job}``.

While the API process holds a job — queued behind others, or running — it stamps the job
with the ledger's time every ``JOB_BEAT_S`` (a heartbeat); every time a job's record holds
is the ledger's (Redis ``TIME``), so API hosts whose clocks disagree judge it alike
(``verbs.campaign_job``). A job whose process died stops beating; its status then says so
(``lost``), and the campaign is submitted again: re-submission sends only what is not done
(DESIGN §3). A job waiting for its turn is ``queued``, however long it waits.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from dedupe import CampaignStore, EffectqError
from dedupe.campaigns import normalize_campaign_id

from ..campaign import CampaignFile, JobState, submit_campaign
from ..registry import get_tool
from ..runtime import Runtime
from .problems import problem_of

__all__ = ["JOB_BEAT_S", "JOB_TTL_S", "CampaignJobs"]

log = logging.getLogger(__name__)

# A job's record outlives its end by a day: long enough to be read, short of piling up.
JOB_TTL_S = 86_400.0
# How often a held job is stamped: well inside the silence that reads as lost
# (verbs.JOB_LOST_MS, 60 s), a slow Redis round trip or two included.
JOB_BEAT_S = 10.0


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

        try:
            self._write(campaign_id, job_id, state=JobState.PLANNING)
            report = submit_campaign(
                spec.campaign_id, spec.tool, spec.recipients, spec.args, action=spec.action,
                plan_version=spec.plan_version, planning=advance("planned", JobState.PLANNING),
                progress=advance("sent", JobState.SENDING),
            )  # fmt: skip
        except EffectqError as exc:
            problem = problem_of(exc)
            self._write(campaign_id, job_id, state=JobState.FAILED, error=problem.error,
                        message=problem.message)  # fmt: skip
        except Exception as exc:
            # Its kind only: a message or traceback may carry a recipient.
            log.error("campaign job failed: %s", type(exc).__name__)
            self._write(campaign_id, job_id, state=JobState.FAILED, error="internal",
                        message="internal error")  # fmt: skip
        else:
            self._write(
                campaign_id, job_id, state=JobState.DONE, report=json.dumps(report.as_dict())
            )
