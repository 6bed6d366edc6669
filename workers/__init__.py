"""Dramatiq integration: tool declaration, the producer API, the worker path, the CLI."""

from .producer import Handle, Status, WaitTimeout, submit
from .tool import EffectCall, EffectTool, Envelope, RetryLater, ToolResult, effect_tool, get_tool

__all__ = [
    "EffectCall",
    "EffectTool",
    "Envelope",
    "Handle",
    "RetryLater",
    "Status",
    "ToolResult",
    "WaitTimeout",
    "effect_tool",
    "get_tool",
    "submit",
]
