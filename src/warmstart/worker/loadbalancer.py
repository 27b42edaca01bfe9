"""`warmstart serve` for a Runpod load-balancing endpoint (WARMSTART_ENDPOINT_TYPE=load_balancer).

The boot, the caches, the evidence, the serving upkeep and the exit codes are the queue
worker's (worker/serve.py); what changes is the front: worker/front.py's HTTP server instead of
the Runpod SDK. The order:

1. The front starts listening before anything else (before the model is resolved), so `/ping`
   answers 204 from the wrapper's first second, through the restore, the weights and vLLM's boot.
2. The boot runs as `warmstart serve` runs it. Until vLLM serves, SIGTERM/SIGINT turn `/ping` 503
   and unwind the boot (boot.exit_on_signals: vLLM's group stopped, marker removed, lease given
   back; exit 143/130). A boot whose vLLM fails exits EXIT_ENGINE (cli.dispatch, as in the queue).
3. vLLM serves: the upkeep publishes and marks the key in use, the watchdog watches vLLM, and the
   front forwards; `/ping` says 200.
4. SIGTERM/SIGINT while serving: `/ping` turns 503 and new requests get 503 at once (in the signal
   handler itself); requests in flight get up to WARMSTART_DRAIN_S to finish; then vLLM's group is
   stopped and the upkeep's final publish runs, as in the queue worker; exit 0. `/ping` keeps
   answering 503 until the process ends.
5. vLLM dies while serving: `/ping` turns 503 and requests get the watchdog's message at once; the
   watchdog exits the worker with EXIT_ENGINE after WARMSTART_EXIT_GRACE_S.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from types import FrameType

from .. import log
from ..boot import exit_on_signals
from ..errors import SettingsError
from ..redact import Redactor
from ..settings import Settings
from .front import BOOT_REPORT, Engine, Front, FrontServer
from .lifecycle import serving

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def start_front(settings: Settings) -> tuple[Front, FrontServer]:
    """The front, listening; a port that cannot be bound is a configuration error (exit 2)."""
    front = Front()
    server = FrontServer(front, settings.http_host, settings.port, settings.port_health)
    try:
        server.start()
    except OSError as exc:
        ports = f"PORT={settings.port}" + (f", PORT_HEALTH={settings.port_health}" if settings.port_health else "")
        raise SettingsError([f"{ports}: cannot listen on {settings.http_host}: {exc.strerror or exc}"]) from None
    return front, server


def _say(text: str) -> None:
    """From a signal handler: straight to fd 2 (logging is not reentrant)."""
    try:
        os.write(2, text.encode())
    except OSError:
        pass


def while_booting(front: Front) -> None:
    """Signals during the boot: /ping turns 503 at once, then the boot unwinds (boot.py's handler)."""
    exit_on_signals()
    unwind = signal.getsignal(signal.SIGTERM)
    assert callable(unwind)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        front.stop()
        unwind(signum, frame)

    for sig in SIGNALS:
        signal.signal(sig, on_signal)


def while_serving(front: Front, stop: threading.Event) -> None:
    """Signals while serving: /ping 503 and new requests refused at once; the main thread drains."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        front.stop()
        if stop.is_set():
            _say(log.line("signal", f"{name} again: still stopping") + "\n")
            return
        _say(log.line("signal", f"{name}: /ping 503, no new requests; stopping") + "\n")
        stop.set()

    for sig in SIGNALS:
        signal.signal(sig, on_signal)


def drain(front: Front, seconds: float, clock: Callable[[], float] = time.monotonic) -> int:
    """Wait until no request is in flight, at most `seconds`; return how many were still open."""
    deadline = clock() + seconds
    if front.inflight:
        log.info("serve", "%d request(s) in flight: waiting up to %.0f s (WARMSTART_DRAIN_S)", front.inflight, seconds)
    while front.inflight and clock() < deadline:
        time.sleep(0.05)
    if front.inflight:
        log.warning("serve", "%d request(s) still in flight after WARMSTART_DRAIN_S: cut", front.inflight)
    return front.inflight


def serve_http(settings: Settings, redactor: Redactor, rest: list[str]) -> int:
    front, server = start_front(settings)
    log.info(
        "serve",
        "load_balancer: HTTP on %s:%d, GET /ping on port %d (204 until vLLM serves)",
        settings.http_host,
        server.ports[0],
        server.ports[-1],
    )
    if rest:
        log.warning("serve", "ignored in load_balancer mode: %s", " ".join(rest))
    while_booting(front)
    with ExitStack() as leaving:  # undone last to first
        leaving.callback(server.stop)
        leaving.callback(front.stop)  # a boot that failed or was stopped: /ping 503 until the port closes
        worker = leaving.enter_context(serving(settings, redactor))  # on the way out: stop_serving
        leaving.callback(front.stop)  # /ping 503 before vLLM stops, whatever ends the serving
        stop = threading.Event()
        while_serving(front, stop)
        worker.watchdog.start()
        front.boot_report = worker.upkeep.served_report
        engine = Engine(worker.base_url, settings.engine_api_key is not None, settings.request_timeout_s)
        front.serve(engine, worker.watchdog.failure_message)
        host = "localhost" if settings.http_host in ("0.0.0.0", "::") else settings.http_host
        base = f"http://{host}:{server.ports[0]}"
        log.info(
            "serve",
            "serving vLLM's OpenAI API: OpenAI(base_url=%r); boot report: GET %s",
            base + "/v1",
            base + BOOT_REPORT,
        )
        while not stop.wait(1.0):
            pass
        drain(front, settings.drain_s)
        return 0
