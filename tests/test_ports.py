"""vLLM's port: chosen below the kernel's ephemeral range, free when chosen (warmstart/engine/ports.py).

A port the kernel handed out as an outgoing connection's local port while vLLM still imported failed a boot
of the suite with `Address already in use` (a loopback S3 restore beside it)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from warmstart.engine.ports import BELOW, LINUX_EPHEMERAL, LOOPBACK, binds, ephemeral_range, free_port


class Scripted(random.Random):
    """Picks the given ports in turn."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__()
        self.ports = list(ports)

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:  # type: ignore[override]
        port = self.ports.pop(0)
        assert stop is not None and start <= port < stop, (start, port, stop)
        return port


def test_the_port_is_below_the_kernels_ephemeral_range_and_binds():
    low, high = ephemeral_range()
    for _ in range(50):
        port = free_port()
        assert low - BELOW <= port < low, (port, low, high)
        assert binds(port)


def test_a_port_with_a_listener_is_passed_over():
    taken = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((LOOPBACK, taken))
        listener.listen()
        assert not binds(taken)
        other = next(p for p in range(taken - 1, taken - BELOW, -1) if binds(p))
        assert free_port(pick=Scripted([taken, other])) == other


def test_an_outgoing_connections_local_port_is_never_the_choice():
    """The failure's premise, checked on this kernel: the local ports it hands to outgoing connections
    (here 200 loopback ones) all lie in the ephemeral range, and no port free_port chooses does."""
    low, high = ephemeral_range()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind((LOOPBACK, 0))
        server.listen(256)
        clients = [socket.create_connection(server.getsockname()) for _ in range(200)]
        try:
            handed = {c.getsockname()[1] for c in clients}
        finally:
            for c in clients:
                c.close()
    chosen = {free_port() for _ in range(200)}
    assert all(low <= port <= high for port in handed), sorted(handed)[:5]
    assert not any(low <= port <= high for port in chosen), sorted(chosen)[-5:]


def test_the_range_file_is_read_and_a_default_stands_in(tmp_path: Path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t50000\n")
    assert ephemeral_range(ranges) == (40000, 50000)
    assert 40000 - BELOW <= free_port(ephemeral=(40000, 50000)) < 40000
    assert ephemeral_range(tmp_path / "absent") == LINUX_EPHEMERAL
    ranges.write_text("garbage\n")
    assert ephemeral_range(ranges) == LINUX_EPHEMERAL


def test_no_room_below_the_range_leaves_the_choice_to_the_kernel():
    port = free_port(ephemeral=(1024, 65535))
    assert 1024 <= port <= 65535 and binds(port)
