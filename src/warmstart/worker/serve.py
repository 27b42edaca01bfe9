"""`warmstart serve`: the container entrypoint. Boot as `warmstart boot` does, then serve jobs.

WARMSTART_ENDPOINT_TYPE picks the front: `queue` (this module: the Runpod SDK takes jobs) or
`load_balancer` (worker/loadbalancer.py: an HTTP server answers /ping from the first second and
forwards vLLM's OpenAI routes); the boot, caches, upkeep and exit codes are the same.

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
re-raises them once it has shut down, `Server.capture_signals`, reaching ours); leaving
`lifecycle.serving` then stops vLLM's process group and runs the serving upkeep's final
publish. A wrapper killed outright still takes vLLM with it (the engine's parent-death signal);
what it compiled while serving reached the store with the periodic publish (worker/upkeep.py).
"""

from __future__ import annotations

import argparse
import importlib
import socket
import sys
import threading
import time

from .. import log
from ..boot import exit_on_signals
from ..engine.logpipe import no_collection
from ..hardware import cpuinfo_field
from ..redact import Redactor
from ..settings import from_env
from .handler import JobHandler, make_handler
from .lifecycle import serving


def local_api_hint(rest: list[str]) -> str:
    """How to send a job to Runpod's local API server (`--rp_serve_api`)."""

    host, port = _local_api_address(rest)
    base = f"http://{host}:{port}"
    job = '{"input": {"prompt": "Hello", "sampling_params": {"max_tokens": 16}}}'
    curl = f"curl -s {base}/runsync -H 'content-type: application/json' -d '{job}'"
    return f"local API server at {base}; send a job with: {curl}"


def _local_api_address(rest: list[str]) -> tuple[str, int]:
    def option(name: str, default: str) -> str:
        return rest[rest.index(name) + 1] if name in rest and rest.index(name) + 1 < len(rest) else default

    return option("--rp_api_host", "localhost"), int(option("--rp_api_port", "8000"))


def announce_when_listening(rest: list[str], lines: list[str], timeout_s: float = 120.0) -> threading.Thread:
    """Log `lines` once Runpod's local API server accepts connections (uvicorn starts inside
    `runpod.serverless.start`, which does not return), or say that it did not within `timeout_s`."""
    address = _local_api_address(rest)

    def wait() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(address, timeout=1.0):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            log.warning("serve", "the local API server is not listening on %s:%d after %.0f s", *address, timeout_s)
            return
        for line in lines:
            log.info("serve", "%s", line)

    thread = threading.Thread(target=wait, name="announce-local-api", daemon=True)
    thread.start()
    return thread


def processor_brand(cpuinfo: str | None = None) -> dict[str, str]:
    """py-cpuinfo's answer as far as runpod reads it: the CPU's brand string, /proc/cpuinfo's `model name`
    (the kernel's copy of the same CPUID brand string); none where it has no such line, which runpod
    prints as "Unable to get processor info."."""
    brand = cpuinfo_field(("model name",), cpuinfo)
    return {} if brand is None else {"brand_raw": brand}


def import_sdk() -> None:
    """Import the Runpod SDK, while vLLM boots. runpod 1.12's rp_debugger calls `cpuinfo.get_cpu_info()`
    at import for one string of its debug output, and py-cpuinfo 9 answers that by starting a second Python
    (`[sys.executable, cpuinfo.py, "--json"]`, cpuinfo.py get_cpu_info_json): 1.1 of the import's 1.6 s of
    CPU (`python -X importtime -c "import runpod"`), taken from vLLM's CPU-bound start-up, and on 2 cores it
    held the log reader 10-20 ms (bench rehearsal, queue front; issue 37). `processor_brand` answers instead.
    No collection runs during the import, and what it made is frozen after (engine/logpipe.py)."""
    try:
        import cpuinfo

        cpuinfo.get_cpu_info = processor_brand
    except ImportError:  # a later runpod without py-cpuinfo
        pass
    with no_collection():
        importlib.import_module("runpod")


def main(args: argparse.Namespace) -> int:
    settings = from_env(args.environ, volume=getattr(args, "volume", None))
    redactor = Redactor.from_env(settings.environ)
    if settings.endpoint_type == "load_balancer":  # the HTTP front instead of the Runpod SDK
        from .loadbalancer import serve_http

        return serve_http(settings, redactor, list(getattr(args, "rest", [])))
    # Until the Runpod SDK installs its own handlers, a SIGTERM must still stop a booting vLLM.
    exit_on_signals()
    # The SDK's import takes seconds (a few of CPU, more on a busy host): done while vLLM boots.
    sdk = threading.Thread(target=import_sdk, name="import-runpod", daemon=True)
    sdk.start()
    with serving(settings, redactor) as worker:
        state = JobHandler(
            base_url=worker.base_url,
            served_model=settings.served_model_name,
            request_timeout_s=settings.request_timeout_s,
            boot_report=worker.upkeep.served_report,
            engine_failure=worker.watchdog.failure_message,
            api_key=settings.engine_api_key,
            local=any(a.startswith(("--rp_serve_api", "--test_input")) for a in getattr(args, "rest", [])),
        )
        worker.watchdog.start()
        rest = list(getattr(args, "rest", []))
        sdk.join()  # imported while vLLM booted
        import runpod
        from runpod.serverless.modules.rp_logger import RunPodLogger

        taking_jobs = f"taking jobs (max concurrency {settings.max_concurrency})"
        if "--rp_serve_api" in rest:  # said once the local API server answers, not while it starts
            announce_when_listening(rest, [taking_jobs, local_api_hint(rest)])
        else:  # the SDK asks Runpod for jobs as soon as it starts
            log.info("serve", "%s", taking_jobs)

        # The SDK logs every job's input and output at DEBUG (rp_job.py "Handler output: ...",
        # rp_scale.py; its default level is DEBUG, rp_logger.py): prompts and completions would land
        # in the worker's log. Payloads are never logged, whatever RUNPOD_LOG_LEVEL or --rp_log_level ask.
        level = quiet_runpod_level(RunPodLogger.level)
        rest = drop_verbose_rp_log_level(rest)
        RunPodLogger().set_level(level)
        sys.argv = [sys.argv[0], *rest]
        runpod.serverless.start(
            {
                "handler": make_handler(state),
                "concurrency_modifier": worker.watchdog.concurrency(settings.max_concurrency),
                "return_aggregate_stream": True,
            }
        )
        return 0


_PAYLOAD_LEVELS = ("NOTSET", "TRACE", "DEBUG")  # runpod's levels at which job inputs/outputs are logged


def quiet_runpod_level(requested: str) -> str:
    """The runpod SDK's log level: the one asked for, raised to INFO where it would log job payloads."""
    return "INFO" if str(requested).upper() in _PAYLOAD_LEVELS else str(requested).upper()


def drop_verbose_rp_log_level(rest: list[str]) -> list[str]:
    """`rest` without an `--rp_log_level` that would log job payloads (runpod applies it in start())."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(rest):
        if skip:
            skip = False
            continue
        if arg == "--rp_log_level" and i + 1 < len(rest) and rest[i + 1].upper() in _PAYLOAD_LEVELS:
            skip = True
            continue
        if arg.startswith("--rp_log_level=") and arg.split("=", 1)[1].upper() in _PAYLOAD_LEVELS:
            continue
        out.append(arg)
    return out
