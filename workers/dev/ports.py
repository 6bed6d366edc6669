"""Loopback ports for the servers effectq starts itself: the demo's, the tests' and the benches'.

A port is taken outside the kernel's ephemeral range on purpose. A client that connects to a
port in that range before its server listens can be handed that very port as its own source
port and connect to itself (TCP simultaneous open): it then reads its own request back as the
answer. That is how a readiness probe once parsed its own ``HELLO 3`` as the server's reply.
Ports outside the range are never handed out as source ports, so a probe of a server not yet
listening is refused, as it should be.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL = (32768, 60999)
# Below this sit the well-known and commonly configured service ports.
_LOW = 10000
_TRIES = 1000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of source ports (inclusive); Linux's default where it cannot be read."""
    try:
        low, high = (int(part) for part in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def free_port(host: str = "127.0.0.1", *, bus_offset: int | None = None) -> int:
    """A port nobody listens on now, outside the ephemeral range. With ``bus_offset``, the port
    ``port + bus_offset`` is free and outside the range too (a Redis Cluster node's bus port).

    Free when checked: another process may still take it before the server binds, which the
    server's start reports as a failed bind."""
    low, high = ephemeral_range()
    offsets = (0,) if bus_offset is None else (0, bus_offset)
    top = 65535 - max(offsets)
    for _ in range(_TRIES):
        port = random.randint(_LOW, top)
        if any(low <= port + offset <= high for offset in offsets):
            continue
        try:
            for offset in offsets:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((host, port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError(
        f"no free port on {host} outside the ephemeral range {low}-{high} after {_TRIES} tries"
    )
