"""`warmstart serve`: the container entrypoint. Boot as `warmstart boot` does, then serve jobs.

No job is taken before vLLM answers /health: the Runpod SDK is started only after the
boot. If vLLM dies while serving, the worker cannot recover by itself (a GPU engine that
crashed usually crashed for a reason that a restart inside the same container will not
fix), so it stops taking jobs, answers the jobs in flight with a clear error, and exits
non-zero for Runpod to replace it.

Shutdown: until the SDK starts, SIGTERM/SIGINT unwind the boot (boot.exit_on_signals;
run_boot stops vLLM's group, removes the marker, gives back the lease). The Runpod SDK then
replaces those handlers with its own (runpod 1.12 serverless/modules/rp_scale.py
`JobScaler.start`: `signal.signal(signal.SIGTERM, self.handle_shutdown)`, which sets the
shutdown event so that `start()` returns; for the local API server uvicorn captures them and
re-raises them once it has shut down, `Server.capture_signals`, reaching ours); the `finally`
below then stops vLLM's process group and runs the serving upkeep's final publish. A wrapper
killed outright still takes vLLM with it (the engine's parent-death signal); what it compiled
while serving reached the store with the periodic publish (worker/upkeep.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from warmstart.boot import Boot, exit_on_signals, run_boot
from warmstart.plan import plan_boot

from .. import log
from ..errors import EXIT_ENGINE
from ..limits import RUNPOD_INIT_TIMEOUT_S
from ..redact import Redactor
from ..settings import Settings, from_env
from ..store.history import BootHistory, KeyStore
from .handler import JobHandler, make_handler
from .upkeep import ServingUpkeep


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
    ) -> None:
        self.boot = boot
        self.before_exit = before_exit  # the final publish: what vLLM compiled while serving
        self.grace_s = grace_s
        self.exit_fn = exit_fn
        self.poll_s = poll_s
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
        while not self.stopping:
            code = engine.returncode()
            if code is not None:
                break
            time.sleep(self.poll_s)
        if self.stopping:
            return
        self.failure = self._message(code)
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


def local_api_hint(rest: list[str]) -> str:
    """How to send a job to Runpod's local API server (`--rp_serve_api`)."""

    def option(name: str, default: str) -> str:
        return rest[rest.index(name) + 1] if name in rest and rest.index(name) + 1 < len(rest) else default

    base = f"http://{option('--rp_api_host', 'localhost')}:{option('--rp_api_port', '8000')}"
    job = '{"input": {"prompt": "Hello", "sampling_params": {"max_tokens": 16}}}'
    curl = f"curl -s {base}/runsync -H 'content-type: application/json' -d '{job}'"
    return f"local API server at {base}; send a job with: {curl}"


def main(args: argparse.Namespace) -> int:
    settings = from_env(args.environ, volume=getattr(args, "volume", None))
    redactor = Redactor.from_env(settings.environ)
    # Until the Runpod SDK installs its own handlers, a SIGTERM must still stop a booting vLLM.
    exit_on_signals()

    plan = plan_boot(settings)
    history: BootHistory = KeyStore(plan.layout, plan.key).history()
    if (warning := init_timeout_warning(settings, history.ready_times())) is not None:
        log.warning("timeout", "%s", warning)

    boot: Boot | None = None
    watchdog: EngineWatchdog | None = None
    upkeep: ServingUpkeep | None = None
    try:
        # vLLM that exits or never becomes ready raises EngineFailed: cli.dispatch writes its line, exit 3.
        boot, report = run_boot(plan, redactor, publish_now=False)
        if report.ready_s is not None and (warning := init_timeout_warning(settings, [report.ready_s])) is not None:
            log.warning("timeout", "%s", warning)

        assert boot.engine is not None
        report_dict = report.to_dict()
        upkeep = ServingUpkeep(boot, report_dict, interval_s=settings.serve_publish_s)
        boot.on_serving_line = upkeep.on_line
        upkeep.start()  # the first publish, right after ready, without holding jobs back
        watchdog = EngineWatchdog(boot, grace_s=settings.exit_grace_s, before_exit=upkeep.final)
        state = JobHandler(
            base_url=boot.engine.base_url,
            served_model=settings.served_model_name,
            request_timeout_s=settings.request_timeout_s,
            boot_report=lambda: report_dict,
            engine_failure=watchdog.failure_message,
            api_key=settings.engine_api_key,
        )
        watchdog.start()
        log.info("serve", "taking jobs (max concurrency %d)", settings.max_concurrency)
        rest = list(getattr(args, "rest", []))
        if "--rp_serve_api" in rest:
            log.info("serve", "%s", local_api_hint(rest))

        import runpod

        sys.argv = [sys.argv[0], *rest]
        runpod.serverless.start(
            {
                "handler": make_handler(state),
                "concurrency_modifier": watchdog.concurrency(settings.max_concurrency),
                "return_aggregate_stream": True,
            }
        )
        return 0
    finally:
        if watchdog is not None:
            watchdog.stopping = True
        if boot is not None:
            log.info("serve", "stopping vLLM")
            boot.stop()
            if upkeep is not None:
                # Kernels compiled while serving: publish them too. Shutdown is short, so the
                # waits are too; a publish cut off by the kill leaves only temporaries.
                upkeep.final()
            else:
                boot.abort()
