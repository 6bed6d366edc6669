"""Dramatiq integration: tool declaration, the producer API, the worker path, the CLI.

The names below are imported on first use (PEP 562), so ``effectq --help`` and the
operator verbs do not pay for Dramatiq, the campaign code and the metrics they never run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dedupe.lazy import lazy_exports

if TYPE_CHECKING:
    from .campaigns import CampaignReport as CampaignReport
    from .campaigns import campaign_status as campaign_status
    from .campaigns import submit_campaign as submit_campaign
    from .producer import Handle as Handle
    from .producer import Status as Status
    from .producer import WaitTimeout as WaitTimeout
    from .producer import submit as submit
    from .tool import EffectCall as EffectCall
    from .tool import EffectTool as EffectTool
    from .tool import Envelope as Envelope
    from .tool import RetryLater as RetryLater
    from .tool import ToolResult as ToolResult
    from .tool import effect_tool as effect_tool
    from .tool import get_tool as get_tool

_WHERE = {
    "CampaignReport": "campaigns",
    "campaign_status": "campaigns",
    "submit_campaign": "campaigns",
    "Handle": "producer",
    "Status": "producer",
    "WaitTimeout": "producer",
    "submit": "producer",
    "EffectCall": "tool",
    "EffectTool": "tool",
    "Envelope": "tool",
    "RetryLater": "tool",
    "ToolResult": "tool",
    "effect_tool": "tool",
    "get_tool": "tool",
}
__all__ = sorted(_WHERE)


__getattr__ = lazy_exports(__name__, _WHERE)
