"""The ports effectq picks for the servers it starts stay out of the kernel's ephemeral range,
so a probe of a server that is not listening yet is refused instead of connecting to itself."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from workers.dev import ports


def test_picked_ports_are_never_in_the_ephemeral_range() -> None:
    low, high = ports.ephemeral_range()
    for _ in range(300):
        port = ports.free_port()
        assert not low <= port <= high
        assert port >= 10000


def test_a_cluster_node_and_its_bus_port_both_stay_out_of_the_range() -> None:
    low, high = ports.ephemeral_range()
    for _ in range(300):
        port = ports.free_port(bus_offset=10000)
        assert not low <= port <= high
        assert not low <= port + 10000 <= high
        assert port + 10000 <= 65535


def test_the_range_the_kernel_is_configured_with_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    narrowed = tmp_path / "ip_local_port_range"
    narrowed.write_text("10000\t60000\n")
    monkeypatch.setattr(ports, "_RANGE_FILE", narrowed)
    assert all(ports.free_port() > 60000 for _ in range(100))
    with pytest.raises(RuntimeError, match="outside the ephemeral range 10000-60000"):
        ports.free_port(bus_offset=10000)


def test_without_proc_the_linux_default_range_is_avoided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "_RANGE_FILE", tmp_path / "absent")
    assert ports.ephemeral_range() == (32768, 60999)


def test_a_port_someone_listens_on_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", ports.free_port())) as taken:
        busy = taken.getsockname()[1]
        real = ports.random.randint
        picks = iter([busy, busy])  # the taken port first, twice; then random ones again
        monkeypatch.setattr(ports.random, "randint", lambda a, b: next(picks, None) or real(a, b))
        assert ports.free_port() != busy
        assert next(picks, None) is None  # both were tried


def test_a_probe_of_a_picked_port_nobody_listens_on_is_refused() -> None:
    # In the ephemeral range, thousands of connects to an even port nobody listens on end in
    # one that connected to itself (seen on this kernel within ~1,500 tries).
    port = ports.free_port()
    for _ in range(3000):
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))
