"""The tools declared in this process, and the one way to load a tools module.

``@effect_tool`` registers here; the worker entry point, the CLI, the API and the
reconciler load ``EFFECTQ_TOOLS`` through ``load`` and read the specs through ``specs``.
A tool is held as what this floor reads of it (``DeclaredTool``); ``workers.tool.get_tool``
answers the ``EffectTool`` itself.
"""

from __future__ import annotations

import importlib
import re
from typing import Protocol

from dedupe import MessageError, ToolSpec

__all__ = [
    "DeclaredTool",
    "ToolsModuleError",
    "get_tool",
    "load",
    "register",
    "specs",
    "tools",
]


class DeclaredTool(Protocol):
    """What the registry's readers take from a declared tool (``workers.tool.EffectTool``)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> ToolSpec: ...

    @property
    def queue_name(self) -> str | None:
        """The queue its actor is consumed from, once bound (None before)."""
        ...


_TOOLS: dict[str, DeclaredTool] = {}


class ToolsModuleError(MessageError):
    """The tools module cannot be imported (named by module, never by its error's text)."""


def register(tool: DeclaredTool) -> None:
    _TOOLS[tool.name] = tool


def tools() -> list[DeclaredTool]:
    return list(_TOOLS.values())


def get_tool(name: str) -> DeclaredTool:
    try:
        return _TOOLS[name]
    except KeyError:
        raise MessageError(f"unknown tool {name!r} (declared: {sorted(_TOOLS)})") from None


def specs() -> dict[str, ToolSpec]:
    """Each declared tool's spec, by name: what the reconciler and the operator read."""
    return {name: tool.spec for name, tool in _TOOLS.items()}


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,100}")


def load(module: str) -> None:
    """Import the module that declares the tools (``EFFECTQ_TOOLS``). One that cannot be
    imported, or that raises while declaring, is a ``ToolsModuleError`` naming the missing
    module (when it looks like a module name) or the exception's type, never its text: it
    could quote a secret from the module's configuration."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        name = exc.name if exc.name and _MODULE.fullmatch(exc.name) else "a module"
        raise ToolsModuleError(
            f"cannot import the tools module EFFECTQ_TOOLS (missing {name})"
        ) from None
    except Exception as exc:
        raise ToolsModuleError(
            f"the tools module EFFECTQ_TOOLS failed while declaring its tools "
            f"({type(exc).__name__})"
        ) from None
