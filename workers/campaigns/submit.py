"""Submitting a campaign: the plan (``plan``) frozen in Redis before the first message is
sent, then the fan-out (``fanout``); see the package docstring."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from dedupe import CampaignStore
from dedupe.campaigns import normalize_campaign_id

from .. import tracing
from ..tool import EffectTool, get_tool
from .fanout import fan_out
from .plan import CampaignReport, Planner, approve, plan_ttl_s, recipient_field

__all__ = ["submit_campaign"]


def submit_campaign(
    campaign_id: str,
    tool: str | EffectTool,
    recipients: Iterable[Any],
    args: dict[str, Any] | None = None,
    *,
    action: str | None = None,
    plan_version: int | None = None,
    progress: Callable[[int], None] | None = None,
    planning: Callable[[int], None] | None = None,
) -> CampaignReport:
    """Freeze the plan for ``recipients`` and fan it out; see the module docstring.

    Streams in two passes, in memory bounded by a batch whatever the list's length:
    ``recipients`` is read once (any iterable: a list, a generator over a file) into plan
    rows staged in Redis and a spool of the derived effects on local disk; the plan is
    approved once complete, and only then is the spool fanned out. ``planning`` is called
    with the recipients read so far per batch, ``progress`` with the recipients fanned out.

    Raises ConflictError for a changed list or changed bound arguments under the same plan
    version, or a plan another submission approved meanwhile; invalid recipients (a value
    the normalizer refuses, a request over the bound a worker enforces) are rejected one
    by one (index and reason; the first ``MAX_REJECTED`` listed, all counted), never dropped
    and never enqueued.
    """
    target = get_tool(tool) if isinstance(tool, str) else tool
    # One campaign whatever the spelling: the id as derive() treats the scope of every key.
    campaign_id = normalize_campaign_id(campaign_id)
    args = dict(args or {})
    recipient = recipient_field(target, args)
    report = CampaignReport(campaign_id, plan_version or 1, 0)
    store = CampaignStore(target.runtime.ledger())
    ttl_s = plan_ttl_s(target)
    with tempfile.TemporaryFile(prefix="effectq-campaign-") as spool:
        planner = Planner(target, campaign_id, args, recipient, action, store, ttl_s, spool)
        plan = planner.run(recipients, plan_version or 1, report, planning)
        try:
            plan = approve(store, plan, plan_version, ttl_s, report)
        except BaseException:
            store.discard(plan)  # the staged rows: no approval names them
            raise
        store.touch(plan, ttl_s)
        report.plan_version = plan.version
        report.recipients = plan.count
        spool.seek(0)
        with tracing.span("fan_out", tool=target.name, producer=True):
            fan_out(target, plan, planner.spooled(), store, report, progress, ttl_s)
    return report
