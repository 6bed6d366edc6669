"""Campaign batches: one logical send to many recipients, one message per recipient.

On approval the plan (recipient → effect key) is frozen in Redis before the first message
is sent; the campaign id is the scope of every key, so no clock enters one. Re-submitting
sends only what is not DONE (nor held by a live claim). A different recipient list or
changed bound arguments under the same campaign id is a conflict, unless it comes as an
explicit new ``plan_version``, whose diff is reported: added recipients are sent, removed
ones are listed, never "un-sent".

A campaign's walk, one module a step: ``file`` (the campaign file read and checked),
``plan`` (pass 1: the plan staged and approved), ``fanout`` (pass 2: the messages sent),
``submit`` (the two passes in order), ``status`` (what became of each recipient), and
``jobs`` (a campaign run as a job of an API process: written there, read by any replica).
The names below are imported on first use (PEP 562), so reading a status or a job does not
pay for Dramatiq.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dedupe.lazy import lazy_exports

if TYPE_CHECKING:
    from .file import CampaignFile as CampaignFile
    from .file import CampaignSource as CampaignSource
    from .jobs import JobState as JobState
    from .plan import CampaignReport as CampaignReport
    from .status import campaign_status as campaign_status
    from .submit import submit_campaign as submit_campaign

_WHERE = {
    "CampaignFile": "file",
    "CampaignSource": "file",
    "JobState": "jobs",
    "CampaignReport": "plan",
    "campaign_status": "status",
    "submit_campaign": "submit",
}
__all__ = sorted(_WHERE)


__getattr__ = lazy_exports(__name__, _WHERE)
