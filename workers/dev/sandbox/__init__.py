"""The sandbox provider (DESIGN §5): a real HTTP service that stands in for an e-mail or
payment API and counts what it really executed — ``service`` (the endpoints, the fault
switches, the execution log) and ``process`` (it as a child process: ``SandboxProcess``, and
``python -m workers.dev.sandbox``)."""

from __future__ import annotations

from .process import SandboxProcess, main
from .service import MAX_BODY_BYTES, Execution, Receipt, SandboxConfig, create_app, serve

__all__ = [
    "MAX_BODY_BYTES",
    "Execution",
    "Receipt",
    "SandboxConfig",
    "SandboxProcess",
    "create_app",
    "main",
    "serve",
]
