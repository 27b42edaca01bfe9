"""The worker's life, the same for both fronts: boot, serve, stop.

`warmstart serve` boots as `warmstart boot` does, then serves until it is told to stop, whichever
front takes the work (the Runpod SDK's queue, worker/serve.py; the HTTP front of a load-balancing
endpoint, worker/loadbalancer.py). What the fronts share is written once here, so that their boot,
upkeep and shutdown cannot drift apart: the cold-start warnings, `run_boot`, the serving upkeep
(its first publish right after ready), vLLM's watchdog, and on the way out, whatever ends the
serving (a signal, an error, the SDK returning), `stop_serving`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .. import log
from ..boot import Boot, run_boot
from ..plan import plan_boot
from ..redact import Redactor
from ..settings import Settings
from ..store.history import KeyStore
from .upkeep import ServingUpkeep
from .watchdog import EngineWatchdog, init_timeout_warning


@dataclass(frozen=True)
class Serving:
    """A booted worker: vLLM serves, the upkeep runs, the watchdog is ready for the front to start."""

    boot: Boot
    upkeep: ServingUpkeep  # holds the boot report; its `served_report` is what the fronts give
    watchdog: EngineWatchdog  # not started: the front starts it once it takes work

    @property
    def base_url(self) -> str:
        assert self.boot.engine is not None
        return self.boot.engine.base_url


@contextmanager
def serving(settings: Settings, redactor: Redactor) -> Iterator[Serving]:
    """Boot, then yield the serving worker; on the way out, `stop_serving`. vLLM that exits or never
    becomes ready raises EngineFailed (cli.dispatch writes its line; exit 3); run_boot has cleaned up."""
    boot: Boot | None = None
    upkeep: ServingUpkeep | None = None
    watchdog: EngineWatchdog | None = None
    try:
        plan = plan_boot(settings)
        earlier = KeyStore(plan.layout, plan.key).history().ready_times()
        if (warning := init_timeout_warning(settings, earlier)) is not None:
            log.warning("timeout", "%s", warning)
        boot, report = run_boot(plan, redactor, publish_now=False)
        if report.ready_s is not None and (warning := init_timeout_warning(settings, [report.ready_s])) is not None:
            log.warning("timeout", "%s", warning)
        upkeep = ServingUpkeep(boot, report, interval_s=settings.serve_publish_s)
        boot.on_serving_line = upkeep.on_line
        upkeep.start()  # the first publish, right after ready, without holding work back
        watchdog = EngineWatchdog(boot, grace_s=settings.exit_grace_s, before_exit=upkeep.final)
        yield Serving(boot, upkeep, watchdog)
    finally:
        stop_serving(boot, upkeep, watchdog)


def stop_serving(boot: Boot | None, upkeep: ServingUpkeep | None, watchdog: EngineWatchdog | None) -> None:
    """The end of a worker, for both fronts: the watchdog told it is no death, vLLM's group stopped,
    then the final publish of what vLLM compiled while serving (or, before ready, the boot's abort).
    Shutdown is short, so the publish's waits are too; one cut off by the kill leaves only temporaries."""
    if watchdog is not None:
        watchdog.stopping = True
    if boot is None:
        return
    log.info("serve", "stopping vLLM")
    boot.stop()
    if upkeep is not None:
        upkeep.final()
    else:
        boot.abort()
