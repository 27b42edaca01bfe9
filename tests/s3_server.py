"""A real S3-protocol server for the tests: moto's server mode, started as a loopback process."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from warmstart.vllm.engine import free_port

MOTO_SERVER = str(Path(sys.executable).parent / "moto_server")
# Any credentials do for moto without authentication; these are what the tests set.
ACCESS_KEY = "AKIAWARMSTARTTEST0001"
SECRET_KEY = "warmstart-test-secret-value-0123456789"


@contextlib.contextmanager
def moto_server(*, auth: bool = False) -> Iterator[str]:
    """Yield the endpoint URL of a fresh moto server on 127.0.0.1. With `auth`, moto checks
    every request's access key against its (empty) IAM: all credentials are wrong."""
    port = free_port()
    env = dict(os.environ)
    if auth:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    proc = subprocess.Popen(
        [MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def s3_env(endpoint: str) -> dict[str, str]:
    """The standard AWS variables a worker gets, pointing at the test server."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "WARMSTART_S3_ENDPOINT_URL": endpoint,
    }
