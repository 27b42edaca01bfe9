"""One `warmstart serve` process in load_balancer mode (WARMSTART_ENDPOINT_TYPE), driven over HTTP.

From the moment it is started, a thread polls `GET /ping` every 50 ms and records each status
with its time since the process was launched, until the process exits; at the first 200 it asks
`/v1/models` through the front at once and keeps that status too (`/ping` must not say 200 before
the API answers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.client import HTTPException
from pathlib import Path
from typing import Any

from helpers.run import WARMSTART, base_env, engine_pid
from warmstart.engine.ports import free_port


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 60) -> tuple:
    """(status, headers, parsed JSON or bytes) of one request; an HTTP error status is an answer too."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            status, got, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        status, got, raw = exc.code, dict(exc.headers), exc.read()
    try:
        return status, got, json.loads(raw) if raw else None
    except ValueError:
        return status, got, raw


def assert_unhealthy_from_the_signal_on(after: list[tuple[float, int, float]], drained: float) -> None:
    """`after`: /ping's answers from a SIGTERM to the exit, as (seconds after the signal when the answer
    came, status, seconds after the signal when it was asked; status 0 for no answer). A 503 within a
    second of the signal, while the request in flight was still served (`drained`: when it ended); never
    200 to a ping asked after that 503 came, and only 200 before it. A ping asked before the 503 came may
    be answered 200 after it: a run of `make test` saw the poller's 200 come at 0.029 s, in flight when the
    test's own 503 came at 0.003 s; ordering by arrival alone failed it at random."""
    first_503 = next((t for t, status, _ in after if status == 503), None)
    assert first_503 is not None and first_503 < min(1.0, drained), after
    assert {status for _, status, asked in after if asked >= first_503} <= {503, 0}, after
    assert {status for t, status, _ in after if t < first_503} <= {200}, after


class LbWorker:
    """`warmstart serve` with WARMSTART_ENDPOINT_TYPE=load_balancer on loopback, and its log."""

    def __init__(
        self, volume: Path, home: Path, vllm_python: str, name: str, *, health_port: bool = False, **extra_env: str
    ) -> None:
        self.port = free_port()
        self.health_port = free_port() if health_port else self.port
        self.log_path = home / f"{name}.log"
        env = base_env(
            volume,
            vllm_python,
            home,
            **{
                "MAX_MODEL_LEN": "512",
                "WARMSTART_EXIT_GRACE_S": "3",
                "WARMSTART_ENDPOINT_TYPE": "load_balancer",
                "WARMSTART_HTTP_HOST": "127.0.0.1",
                "PORT": str(self.port),
                **({"PORT_HEALTH": str(self.health_port)} if health_port else {}),
                **extra_env,
            },
        )
        self.pings: list[tuple[float, int]] = []  # (seconds since launch, /ping status); 0: no answer
        self.asked: list[float] = []  # when each of `pings` was asked (seconds since launch)
        self.models_at_first_200: int | None = None
        self._polling = True
        self._logfile = open(self.log_path, "wb")  # closed in stop()
        self.launched = time.monotonic()
        self.proc = subprocess.Popen(
            [WARMSTART, "serve"], env=env, stdout=self._logfile, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ping(self, timeout: float = 2) -> int:
        try:
            return http("GET", f"http://127.0.0.1:{self.health_port}/ping", timeout=timeout)[0]
        except (urllib.error.URLError, HTTPException, OSError):  # no answer (a cut one too)
            return 0

    def _poll(self) -> None:
        while self._polling and self.proc.poll() is None:
            asked = time.monotonic() - self.launched
            status = self.ping(timeout=1)
            self.asked.append(asked)
            self.pings.append((time.monotonic() - self.launched, status))
            if status == 200 and self.models_at_first_200 is None:
                self.models_at_first_200 = self.get("/v1/models", timeout=10)[0]
            time.sleep(0.05)

    def first(self, status: int) -> float | None:
        """Seconds from launch to the first /ping answer with this status."""
        return next((t for t, s in self.pings if s == status), None)

    def pings_until_exit(self, sent: float, timeout: float = 120) -> list[tuple[float, int, float]]:
        """The /ping answers from a signal sent at `sent` (seconds since launch) to the worker's exit,
        as (seconds after the signal when it came, status, seconds after the signal when it was asked).
        It waits for the exit first: read while the worker still drains (a stream may end well within a
        second of the signal), the list lacks what is to come."""
        self.proc.wait(timeout)
        self._poller.join(5)
        return [
            (at - sent, status, asked - sent)
            for (at, status), asked in zip(self.pings, self.asked, strict=False)
            if at > sent
        ]

    def get(self, path: str, timeout: float = 60) -> tuple:
        return http("GET", self.url + path, timeout=timeout)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 300) -> tuple:
        return http("POST", self.url + path, body, headers, timeout=timeout)

    def wait_serving(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log[-4000:]}")
            if self.first(200) is not None and self.models_at_first_200 is not None:
                return
            time.sleep(0.2)
        raise AssertionError(f"worker not serving after {timeout} s:\n{self.log[-4000:]}")

    def vllm_pgid(self) -> int:
        return engine_pid(self.log)

    def stop(self) -> None:
        self._polling = False
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._logfile.close()
