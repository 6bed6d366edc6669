"""Large campaigns submitted over the API run as jobs: ``POST /v1/campaigns`` answers 202
with the job's URL at once, and a thread of the API process (not the request's) plans and
fans the campaign out, recording its phase and progress with the campaign in Redis, where
any replica answers ``GET /v1/campaigns/{id}/jobs/{job}``.

A job whose process died stops being updated; its status then says so (``lost``), and the
campaign is submitted again: re-submission sends only what is not done (DESIGN §3).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from dedupe import CampaignStore, EffectqError
from dedupe.campaigns import normalize_campaign_id

from ..campaign import CampaignFile, submit_campaign
from ..registry import get_tool
from ..runtime import Runtime
from .problems import problem_of

__all__ = ["JOB_TTL_S", "CampaignJobs"]

log = logging.getLogger(__name__)

# A job's record outlives its end by a day: long enough to be read, short of piling up.
JOB_TTL_S = 86_400.0


class CampaignJobs:
    """The API process's campaign jobs: ``workers`` at a time, the rest queued in order."""

    def __init__(self, rt: Runtime, workers: int = 1) -> None:
        self.rt = rt
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="effectq-campaign-job")

    def start(self, spec: CampaignFile) -> tuple[str, str]:
        """Queue ``spec``; (campaign id, job id). An unknown tool is refused here."""
        get_tool(spec.tool)
        campaign_id = normalize_campaign_id(spec.campaign_id)
        job_id = secrets.token_hex(8)
        self._write(campaign_id, job_id, state="accepted", recipients=len(spec.recipients),
                    planned=0, sent=0)  # fmt: skip
        self.pool.submit(self._run, campaign_id, job_id, spec)
        return campaign_id, job_id

    def _write(self, campaign_id: str, job_id: str, **fields: str | int) -> None:
        fields["updated_ms"] = int(time.time() * 1000)
        CampaignStore(self.rt.ledger()).write_job(campaign_id, job_id, fields, JOB_TTL_S)

    def _run(self, campaign_id: str, job_id: str, spec: CampaignFile) -> None:
        done = {"planned": 0, "sent": 0}

        def advance(what: str, state: str) -> Callable[[int], None]:
            def step(n: int) -> None:
                done[what] += n
                self._write(campaign_id, job_id, state=state, **done)

            return step

        try:
            self._write(campaign_id, job_id, state="planning")
            report = submit_campaign(
                spec.campaign_id, spec.tool, spec.recipients, spec.args, action=spec.action,
                plan_version=spec.plan_version, planning=advance("planned", "planning"),
                progress=advance("sent", "sending"),
            )  # fmt: skip
        except EffectqError as exc:
            problem = problem_of(exc)
            self._write(campaign_id, job_id, state="failed", error=problem.error,
                        message=problem.message)  # fmt: skip
        except Exception as exc:
            # Its kind only: a message or traceback may carry a recipient.
            log.error("campaign job failed: %s", type(exc).__name__)
            self._write(campaign_id, job_id, state="failed", error="internal",
                        message="internal error")  # fmt: skip
        else:
            self._write(campaign_id, job_id, state="done", report=json.dumps(report.as_dict()))
