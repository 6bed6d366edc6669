"""Dramatiq integration: tool declaration, the producer API, the worker path, the CLI."""

from .campaign import CampaignReport, campaign_status, submit_campaign
from .producer import Handle, Status, WaitTimeout, submit
from .tool import EffectCall, EffectTool, Envelope, RetryLater, ToolResult, effect_tool, get_tool

__all__ = [
    "CampaignReport",
    "EffectCall",
    "EffectTool",
    "Envelope",
    "Handle",
    "RetryLater",
    "Status",
    "ToolResult",
    "WaitTimeout",
    "campaign_status",
    "effect_tool",
    "get_tool",
    "submit",
    "submit_campaign",
]
