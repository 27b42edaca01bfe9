"""Real S3-protocol servers on loopback: moto's server mode (the tests) and s3rver (`bench s3`).

moto is a dev dependency (`.[dev]`), s3rver an npm package (`make bench-tools`); the worker
itself needs neither.
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

from warmstart.engine.ports import free_port

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
def serving(proc: subprocess.Popen[bytes], port: int, what: str) -> Iterator[str]:
    """Yield a started server's endpoint URL once it listens; terminate it (kill after 10 s) on exit."""
    try:
        wait_for_port(port, proc, what)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
    with serving(proc, port, "moto server") as url:
        yield url


S3RVER_VERSION = "3.7.1"
S3RVER_DIR = ".s3rver"  # `make bench-tools` installs it here (npm)
S3RVER_FLAGS = ("--allow-mismatched-signatures", "--no-vhost-buckets")  # any credentials, path-style


def find_s3rver() -> str:
    """The s3rver executable: $WARMSTART_S3RVER, else ./.s3rver (made by `make bench-tools`)."""
    configured = os.environ.get("WARMSTART_S3RVER")
    candidate = Path(configured) if configured else Path(S3RVER_DIR) / "node_modules" / ".bin" / "s3rver"
    if not candidate.exists():
        raise RuntimeError(
            f"no s3rver at {candidate}: run `make bench-tools` (npm install s3rver@{S3RVER_VERSION}) "
            "or set WARMSTART_S3RVER"
        )
    return str(candidate.resolve())


@contextlib.contextmanager
def s3rver_server(data_dir: Path) -> Iterator[str]:
    """Yield the endpoint URL of s3rver (Node, objects as files under `data_dir`) on 127.0.0.1.

    `bench s3` uses it rather than moto: moto materialises the whole object for every ranged
    GET (its responses slice `key.value`), so a ranged restore of a 491 MB bundle measures
    moto, not the restore. s3rver streams ranges from the file. It ignores `If-None-Match`
    on PUT, so publishing to it takes the read-after-write lease path.
    """
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [find_s3rver(), "-d", str(data_dir), "-a", "127.0.0.1", "-p", str(port), "--silent", *S3RVER_FLAGS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with serving(proc, port, "s3rver") as url:
        yield url
