"""Agent-runtime tests: real CrewAI and LangChain, offline, against the real stack.

CrewAI's telemetry, tracing and version check are switched off here, before anything
imports it, and every test runs with outbound connections refused except to loopback (the
stack's Redis, broker and sandbox): a test that reached the network would fail, not hang.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from tests.agents.extras import OFFLINE_ENV

os.environ.update(OFFLINE_ENV)

_LOOPBACK = ("127.", "::1", "localhost")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    connect = socket.socket.connect

    def loopback_only(sock: socket.socket, address: Any) -> None:
        host = address[0] if isinstance(address, tuple) else str(address)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not host.startswith(_LOOPBACK):
            raise ConnectionRefusedError(f"test is offline: connection to {host} refused")
        connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
