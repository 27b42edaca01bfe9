"""What both fronts share once vLLM serves: its watchdog, and the cold-start warning.

vLLM dying while serving is not something the worker can fix by itself (a GPU engine that
crashed usually crashed for a reason that a restart inside the same container will not fix):
the watchdog notices, the front stops taking work (the queue worker's concurrency modifier
turns 0, the load-balancing worker's /ping turns 503), requests get a clear error, and the
worker exits with EXIT_ENGINE for Runpod to replace it.

Death is vLLM's process exiting, or its engine dying under an API server that lives on
(VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1): vLLM's /health then answers 503 (vLLM 0.32 and 0.33,
entrypoints/serve/instrumentator/health.py: `except EngineDeadError: return Response(status_code=503)`),
so the watchdog asks /health every HEALTH_EVERY_S. No answer, or a late one, is not death: a busy
vLLM may answer late.
"""

from __future__ import annotations

import http.client
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import log
from ..boot import Boot
from ..errors import EXIT_ENGINE
from ..limits import RUNPOD_INIT_TIMEOUT_S
from ..settings import Settings


def init_timeout_warning(settings: Settings, ready_times: list[float]) -> str | None:
    """A warning when boots recorded for this key come near Runpod's cold-start limit."""
    if not ready_times:
        return None
    limit = settings.runpod_init_timeout_s or RUNPOD_INIT_TIMEOUT_S
    longest = max(ready_times)
    if longest < 0.8 * limit:
        return None
    source = "RUNPOD_INIT_TIMEOUT" if settings.runpod_init_timeout_s else "Runpod's default (RUNPOD_INIT_TIMEOUT unset)"
    suggest = int(longest * 1.5 + 60)
    return (
        f"boots of this key took up to {longest:.0f} s, close to or over the {limit:.0f} s cold-start limit of "
        f"{source}: a cold worker may be marked unhealthy and killed mid-boot; set RUNPOD_INIT_TIMEOUT={suggest}"
    )


HEALTH_EVERY_S = 2.0


def health_status(base_url: str, timeout_s: float = 5.0) -> int | None:
    """The status vLLM's GET /health answers, or None when it does not answer in time."""
    host, _, port = base_url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port or 80), timeout=timeout_s)
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


class EngineWatchdog:
    """Notices vLLM's death while serving; stops new work; exits the worker non-zero."""

    def __init__(
        self,
        boot: Boot,
        *,
        grace_s: float = 3.0,
        exit_fn: Callable[[int], Any] = os._exit,
        poll_s: float = 0.25,
        before_exit: Callable[[], Any] | None = None,
        health_every_s: float = HEALTH_EVERY_S,
    ) -> None:
        self.boot = boot
        self.before_exit = before_exit  # the final publish: what vLLM compiled while serving
        self.grace_s = grace_s
        self.exit_fn = exit_fn
        self.poll_s = poll_s
        self.health_every_s = health_every_s
        self.failure: str | None = None
        self.stopping = False
        self._thread = threading.Thread(target=self._watch, name="vllm-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def failure_message(self) -> str | None:
        """The error for jobs, from the first moment vLLM is gone (not only once the thread saw it)."""
        if self.failure is None and not self.stopping and self.boot.engine is not None:
            code = self.boot.engine.returncode()
            if code is not None:
                return self._message(code)
        return self.failure

    @staticmethod
    def _message(code: int) -> str:
        return f"vLLM stopped serving (exit code {code}); this worker is exiting so that Runpod replaces it; retry"

    def concurrency(self, limit: int) -> Callable[[int], int]:
        """Runpod's concurrency modifier: `limit` while vLLM lives, 0 (take nothing) after."""
        return lambda _current: 0 if self.failure_message() else limit

    def _watch(self) -> None:
        engine = self.boot.engine
        assert engine is not None
        failure = None
        next_health = time.monotonic() + self.health_every_s
        while not self.stopping:
            code = engine.returncode()
            if code is not None:
                failure = self._message(code)
                break
            if time.monotonic() >= next_health:
                if health_status(engine.base_url) == 503 and engine.returncode() is None and not self.stopping:
                    failure = (
                        "vLLM's engine is dead (its /health answers 503; its API server lives on, as "
                        "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH lets it); this worker is exiting so that Runpod "
                        "replaces it; retry"
                    )
                    break
                next_health = time.monotonic() + self.health_every_s
            time.sleep(self.poll_s)
        if self.stopping or failure is None:
            return
        self.failure = failure
        log.error("engine", "%s", self.failure)
        for line in list(engine.tail)[-20:]:
            log.error("engine", "%s", line)
        # Requests to a dead vLLM fail at once; the grace lets jobs in flight (and jobs that
        # arrive meanwhile) return that error and have it delivered before the process goes.
        time.sleep(self.grace_s)
        self.boot.stop()
        if self.before_exit is not None:
            try:
                self.before_exit()
            except Exception as exc:  # the exit must happen whatever the store does
                log.warning("publish", "final publish failed: %s", self.boot.redactor.text(str(exc)))
        logging.shutdown()
        self.exit_fn(EXIT_ENGINE)
