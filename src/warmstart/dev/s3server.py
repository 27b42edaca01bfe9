"""A real S3-protocol server on loopback for the tests and `bench s3`: moto's server mode.

moto is a dev dependency (`.[dev]`); the worker itself never needs it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ..vllm.engine import free_port

MOTO_SERVER = str(Path(sys.executable).parent / "moto_server")


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start on 127.0.0.1:{port}") from None
            time.sleep(0.1)


@contextlib.contextmanager
def moto_server(*, auth: bool = False) -> Iterator[str]:
    """Yield the endpoint URL of a fresh moto server on 127.0.0.1 (stopped on exit). With
    `auth`, moto checks every request's access key against its empty IAM: all are wrong."""
    port = free_port()
    env = dict(os.environ)
    if auth:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    proc = subprocess.Popen(
        [MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port, proc, "moto server")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
