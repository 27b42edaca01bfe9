"""The boot's lifecycle: prepare, prefetch, start, wait until vLLM serves, publish, report, stop.

`plan_boot` (plan.py) decides everything that needs no vLLM process; `Boot` runs one boot under that plan
and collects what it saw into a BootObservation, which `report.build_report` turns into the BootReport
recorded on the volume. The tiers' restore and publish are store/tiers.py's. Each stage logs one line.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from . import log
from .canary import CanaryOutcome, CanaryRecord
from .canaryboot import check_canary, with_canary
from .engine.concurrency import fit_words
from .engine.ports import free_port
from .engine.process import (
    EngineFailed,
    EngineProcess,
    LogLine,
    engine_command,
    engine_environment,
    vllm_flags,
    withheld_names,
)
from .hardware import engine_world_size
from .log import StageWarning
from .model import link_model
from .plan import BootPlan
from .redact import Redactor
from .report.build import build_report, expectation
from .report.miss import compile_hashes
from .report.model import BootReport
from .report.observation import BootObservation
from .report.weights import s3_read, weights_block
from .s3model import BackgroundRead, ReadStats
from .store.backend import step, worker_id
from .store.bundle import StoreError
from .store.deadline import Deadline, bounded, within
from .store.history import BootHistory, KeyStore, now_iso
from .store.markers import write_boot_marker
from .store.publish import PublishResult
from .store.seed import SeedResult, SeedUse, seed_from, seed_use, sibling_opener
from .store.siblings import record_key
from .store.tiers import TierPublish, TierRestore, publish_tiers, release_leases, restore_tiers
from .tree import TreeScan, scan_tree
from .vllm.logformats import markers_for
from .vllm.phases import LogEvidence
from .weights import LOAD_DONE, LOAD_START, Prefetcher, WeightsPlan, plan_prefetch, start_prefetch

# How long the report waits for the log reader to handle the lines read before it (it is behind by milliseconds).
SETTLE_S = 2.0


@dataclass
class Boot:
    """One boot of vLLM under a plan: start, wait, report. Also used by `serve`."""

    plan: BootPlan
    redactor: Redactor
    echo: TextIO = field(default_factory=lambda: sys.stderr)
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: str = field(default_factory=now_iso)
    evidence: LogEvidence = field(default_factory=LogEvidence)
    engine: EngineProcess | None = None
    ready_s: float | None = None  # since the boot began (resolve and restore included)
    engine_ready_t: float | None = None  # since vLLM was started: the clock of the log markers
    before: dict[str, TreeScan] = field(default_factory=dict)
    history: BootHistory | None = None
    store: KeyStore | None = None
    t0: float = field(default_factory=time.monotonic)
    restored: TierRestore | None = None  # staged: what restoring from the tiers gave
    published: TierPublish | None = None  # staged: the latest publish to each tier
    worker: str = field(default_factory=worker_id)
    marker: Path | None = None  # warmstart/booting/<worker>.json while this boot is in progress
    weights_plan: WeightsPlan | None = None
    prefetcher: Prefetcher | None = None
    s3_read: BackgroundRead | None = None  # MODEL_NAME=s3://: the weights' read, beside the restore
    s3_stats: ReadStats | None = None
    # vLLM began loading weights (its bootstrap ended): the engine clock, and what the prefetch had read by then
    load_start: tuple[float, int] | None = None
    link_warning: StageWarning | None = None  # why the stable model path could not be linked: vLLM got the snapshot's
    on_serving_line: Callable[[str], None] | None = None  # after ready: each line of vLLM's (worker/upkeep.py)
    seeded: SeedResult | None = None  # staged, no generation of its own: what a sibling key seeded
    seed_use: dict[str, SeedUse] = field(default_factory=dict)  # what vLLM had read of it when it served
    canary: CanaryOutcome | None = None  # staged: what the canary did before ready (canary.py)
    canary_record: CanaryRecord | None = None  # what this boot's publish records in its generation

    def _on_line(self, line: LogLine) -> None:
        """Each line of vLLM's, on the log reader's thread (engine/logpipe.py), never on the pipe's."""
        if self.on_serving_line is not None:
            self.on_serving_line(line.text)
        for marker in self.evidence.feed(line.text, line.t):
            if marker.name == "aot_load_failed":
                log.info("compile", "vLLM could not load its compile cache (%s): recompiling", marker.groups[1].strip())
        if self.prefetcher is not None:
            if self.load_start is None and LOAD_START.search(line.text):
                self.load_start = (line.t, self.prefetcher.progress())
            elif LOAD_DONE.search(line.text):  # what is still unread was read by vLLM itself
                self.prefetcher.stop("vLLM finished loading its weights", wait=False)

    def start_prefetch(self) -> None:
        """Decide on and start the weights prefetch (scan -> plan -> execute); logs one line."""
        plan = self.plan
        settings = plan.settings
        self.weights_plan = plan_prefetch(
            plan.model.path,
            mode=settings.weights_prefetch,
            volume_root=plan.layout.root if plan.layout.on_volume else None,
            model_source=plan.model.source,
            ram_share=settings.weights_ram_share,
        )
        self.prefetcher = start_prefetch(self.weights_plan)

    def stop_prefetch(self, reason: str) -> None:
        if self.prefetcher is not None and self.prefetcher.running:
            self.prefetcher.stop(reason)
            log.info("weights", "prefetch stopped: %s", reason)

    def prepare(self) -> None:
        """Records, directories and the 'before' picture of every cache layer."""
        plan = self.plan
        self.mark_booting()
        self.s3_read = BackgroundRead.start(plan.s3_read) if plan.s3_read is not None else None
        platform = "cuda" if plan.hardware.kind == "gpu" else "cpu"
        self.evidence = LogEvidence(specs=markers_for(plan.engine.vllm, platform))
        self.store = KeyStore(plan.layout, plan.key)
        self.history = self.store.history()
        try:
            self.store.touch()
        except OSError as exc:  # a full or vanished volume: boot anyway, say so
            kept = f"could not write the key's manifest on the volume: {exc.strerror or exc}"
            self.store.warnings.append(StageWarning("store", kept))
            log.warning("store", "could not write the key's manifest on the volume: %s", exc)
        if plan.restore_order:
            self.restore()
        plan.cache_dirs.create()
        self.before = {name: scan_tree(path) for name, path in plan.cache_dirs.layers().items()}
        present = sum(len(s.files) for s in self.before.values())
        log.info(
            "cache",
            "expect %s: %d earlier boot(s) of this key, %d cache files present under %s",
            self.expected,
            len(self.history.boots),
            present,
            plan.cache_dirs.base,
        )

    def mark_booting(self) -> None:
        """Tell `warmstart gc` that this key is booting, before the key's directory is touched.
        It expires after the longest a boot may take; a marker left by a killed process on this
        machine is dead at once (its pid is gone)."""
        plan = self.plan
        try:
            self.marker = write_boot_marker(
                plan.layout,
                plan.key.dirname,
                self.worker,
                plan.settings.startup_timeout_s + plan.settings.lease_ttl_s,
                model=plan.model.repo_id,
                revision=plan.model.revision,
            )
        except OSError as exc:
            log.warning("store", "could not mark the boot in progress on the volume: %s", exc)

    def unmark_booting(self) -> None:
        if self.marker is not None:
            try:
                self.marker.unlink()
            except OSError:
                pass
            self.marker = None

    @property
    def expected(self) -> str | None:
        return expectation(self.plan, self.restored, self.history)

    def restore(self) -> None:
        """Staged: replace the local cache with the newest intact generation of the nearest tier."""
        plan = self.plan
        seeding = plan.seed is not None and bool(plan.seed.sources)
        self.restored = restore_tiers(
            plan.restore_order,
            plan.cache_dirs.base,
            reader=self.worker,
            ttl_s=plan.settings.lease_ttl_s,
            deadline_s=plan.settings.restore_deadline_s,
            otherwise="seeding from a sibling key" if seeding else "starting cold",
        )
        if not self.restored.restored and plan.seed is not None:
            opener = sibling_opener(plan.staged.root if plan.staged else None, plan.s3, plan.settings.image_caches)
            self.seeded = seed_from(
                plan.seed,
                plan.cache_dirs.base,
                opener,
                reader=self.worker,
                ttl_s=plan.settings.lease_ttl_s,
                deadline_s=plan.settings.restore_deadline_s,
            )

    def publish(self, *, wait_s: float | None = None) -> PublishResult | None:
        """Staged: publish what this boot added that each tier's generation lacks, the volume
        first (the next worker here reads it), then the S3 store (other datacenters)."""
        plan = self.plan
        if not plan.tiers:
            return None
        step("boot:publish")
        self.published = publish_tiers(
            plan.tiers,
            plan.cache_dirs.base,
            publisher=self.worker,
            lease_wait_s=plan.settings.publish_wait_s if wait_s is None else wait_s,
            lease_ttl_s=plan.settings.lease_ttl_s,
            distrust=self.restored.bad_bundles if self.restored else None,
            blocked=plan.publish_blocked,
            deadline_s=plan.settings.publish_deadline_s,
            canary=self.canary_record.to_json() if self.canary_record else None,
        )
        if plan.s3 is not None and (s3 := self.published.of(plan.s3.kind)) and s3.status != "failed":
            deadline = Deadline(plan.settings.publish_deadline_s, "WARMSTART_PUBLISH_DEADLINE_S")
            try:  # an S3 store has no manifest: what makes this key a sibling to others (store/siblings.py)
                record = bounded(plan.s3, deadline)
                within(deadline, lambda: record_key(record, plan.key.dirname, plan.key.factors, now_iso()), "record")
                if deadline.expired:
                    raise StoreError(deadline.reason)
            except Exception as exc:  # a store that fails here is a warning, as a failed publish is
                log.warning("publish", "could not record the key's factors in the S3 store: %s", exc)
        return self.published.first

    def link_model(self) -> None:
        """Point the stable model path at this boot's snapshot. If the link cannot be made, vLLM
        gets the snapshot's own path: it boots, but its compile hash follows the snapshot's place."""
        plan = self.plan
        if plan.vllm_model is None:
            return
        try:
            if link_model(plan.vllm_model, plan.model.path):
                log.info("model", "vLLM path %s -> %s", plan.vllm_model, plan.model.path)
        except OSError as exc:
            warning = StageWarning(
                "model", f"cannot link {plan.vllm_model} -> {plan.model.path} ({exc}): vLLM gets the snapshot path"
            )
            warning.log()
            self.link_warning = warning

    @property
    def model_arg(self) -> Path | str:
        """The model path on vLLM's command line: the plan's, unless the link could not be made."""
        return self.plan.model.path if self.link_warning is not None else self.plan.model_arg

    @property
    def warnings(self) -> tuple[StageWarning, ...]:
        """The plan's warnings and those of this boot's start."""
        return (*self.plan.warnings, *((self.link_warning,) if self.link_warning else ()))

    def start(self) -> None:
        if self.s3_read is not None:  # its failure is the boot's, before vLLM starts
            self.s3_stats = self.s3_read.join()
        self.link_model()
        plan = self.plan
        port = plan.settings.vllm_port or free_port()
        argv = engine_command(plan.engine, plan.settings, self.model_arg, port, plan.fit)
        env = engine_environment(plan.settings.environ, plan.engine_mapping, plan.settings.vllm_env_pass)
        if withheld := withheld_names(plan.settings.environ, plan.settings.vllm_env_pass):
            log.info("engine", "not passed to vLLM: %s (WARMSTART_VLLM_ENV adds a name)", ", ".join(withheld))
        if self.weights_plan is None:
            self.start_prefetch()
        self.engine = EngineProcess(argv, env, port, on_line=self._on_line, echo=self.echo, redactor=self.redactor)
        self.engine.start()
        world = engine_world_size({}, vllm_flags(plan.settings, plan.fit))
        fit = fit_words(plan.fit, plan.hardware.kind, world)
        log.info(
            "engine", "starting vLLM %s on 127.0.0.1:%d (pid %d); %s", plan.engine.vllm, port, self.engine.pid, fit
        )

    def wait_ready(self) -> float:
        assert self.engine is not None
        try:
            self.engine_ready_t = self.engine.wait_ready(self.plan.settings.startup_timeout_s)
        except EngineFailed:
            self.stop_prefetch("vLLM failed")
            raise
        self.ready_s = round(time.monotonic() - self.t0, 3)
        self.engine.settle(SETTLE_S)  # the reader has every line up to ready (it runs beside the pipe's drain)
        self.seed_use = seed_use(self.seeded, self.plan.cache_dirs.base)  # before a publish reads every file
        usage = resource.getrusage(resource.RUSAGE_SELF)  # this process only: not vLLM's
        log.info(
            "engine",
            "vLLM serves after %.1f s (engine %.1f s; vLLM started %.2f s into the boot; wrapper CPU %.2f s)",
            self.ready_s,
            self.engine.elapsed(),
            log.process_age() - self.engine.elapsed(),
            usage.ru_utime + usage.ru_stime,
        )
        return self.ready_s

    def observe(self, error: str | None = None) -> BootObservation:
        """Scan the caches again and gather what this boot saw, for its report."""
        plan = self.plan
        if self.engine is not None:
            self.engine.settle(SETTLE_S)
        after = {name: scan_tree(path) for name, path in plan.cache_dirs.layers().items()}
        hashes = {}
        if self.expected == "hit" and self.history:  # read only to explain a miss (report/miss.py)
            hashes = compile_hashes(plan.cache_dirs.layer("vllm_compile"))
        return BootObservation(
            boot_id=self.boot_id,
            started_at=self.started_at,
            environ=dict(plan.settings.environ),
            model_arg=self.model_arg,
            evidence=self.evidence,
            before=self.before,
            after=after,
            history=self.history,
            store_warnings=tuple(self.store.warnings) if self.store is not None else (),
            warnings=(self.link_warning,) if self.link_warning else (),
            restored=self.restored,
            published=self.published,
            ready_s=self.ready_s,
            engine_ready_t=self.engine_ready_t,
            argv=tuple(self.engine.argv) if self.engine else (),
            engine_env=self.engine.env if self.engine else {},
            weights=self.weights_observed(),
            compile_hashes=hashes,
            error=error,
            seeded=self.seeded,
            seed_use=self.seed_use,
            log_reader=self.engine.reader_stats() if self.engine else None,
        )

    def weights_observed(self) -> dict[str, Any] | None:
        """The weights block, less vLLM's phases (the report adds them)."""
        if self.weights_plan is None:
            return None
        if self.prefetcher is not None and self.prefetcher.running:
            self.prefetcher.wait(1.0)  # stopped when vLLM loaded its weights: let its streams finish
        block = weights_block(
            self.weights_plan,
            self.prefetcher,
            engine_started=self.engine.started_mono if self.engine else None,
            load_start_t=self.load_start[0] if self.load_start else None,
            bytes_at_load_start=self.load_start[1] if self.load_start else None,
            phases={},
        )
        if self.plan.model.source == "s3":
            block["read"] = s3_read(self.plan.model, self.s3_stats, streamed=self.plan.streamed is not None)
        return block

    def finish_report(self, error: str | None = None) -> BootReport:
        """Scan the caches again and turn what this boot saw into its report."""
        return with_canary(build_report(self.plan, self.observe(error), self.redactor), self.canary)

    def record(self, report: BootReport) -> None:
        if self.store is None:
            return
        try:
            self.store.record_boot(report.to_dict())
        except OSError as exc:  # a full or read-only volume must not take the worker down
            log.warning("store", "could not record the boot on the volume: %s", exc)
        self.unmark_booting()

    def stop(self) -> int | None:
        self.unmark_booting()
        self.stop_prefetch("the boot stopped")
        if self.engine is None:
            return None
        return self.engine.stop()

    def abort(self) -> None:
        """An exit the boot did not plan (a signal, an error): stop vLLM's whole group, remove the
        marker, and give back a publish lease this process may still hold (a publish cut off in a
        thread never reaches its own release; other hosts would wait out its TTL)."""
        self.stop()
        release_leases(self.plan.tiers, holder=self.worker, ttl_s=self.plan.settings.lease_ttl_s)


_exiting = False


def _exit_on_signal(signum: int, _frame: object) -> None:
    """The first SIGTERM/SIGINT unwinds the main thread (the `finally`s stop vLLM and clean up);
    later ones are ignored, so that they cannot cut that cleanup short. It writes to fd 2 itself:
    the signal may land inside a logging call, and logging is not reentrant."""
    global _exiting
    name = signal.Signals(signum).name
    if _exiting:
        _say(log.line("signal", f"{name} again: still cleaning up\n"))
        return
    _exiting = True
    _say(log.line("signal", f"{name}: stopping vLLM and cleaning up\n"))
    raise SystemExit(128 + signum)


def _say(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:
        pass


def exit_on_signals() -> None:
    """Python's default SIGTERM ends the process at once, skipping every `finally`: vLLM's group
    would keep running and the boot marker and publish lease would stay. The Runpod SDK replaces
    these handlers once it starts (worker/serve.py)."""
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)


def run_boot(
    plan: BootPlan, redactor: Redactor, *, echo: TextIO | None = None, publish_now: bool = True
) -> tuple[Boot, BootReport]:
    """Boot vLLM, wait until it serves, (staged, if `publish_now`) publish, and record the report.
    The engine is left running."""
    boot = Boot(plan, redactor, echo=echo or sys.stderr)
    boot.t0 = time.monotonic() - plan.resolve_s
    try:
        boot.prepare()
        boot.start()
        try:
            boot.wait_ready()
            check_canary(boot)
        except EngineFailed as exc:
            report = boot.finish_report(error=str(exc).splitlines()[0])
            boot.record(report)
            emit_report(report)
            raise
        if publish_now:
            boot.publish()
        report = boot.finish_report()
        boot.record(report)
        emit_report(report)
    except BaseException:  # a signal (SystemExit), vLLM's failure, any error: nothing may stay behind
        boot.abort()
        raise
    return boot, report


def emit_report(report: BootReport) -> None:
    for line in report.lines():
        log.logger.info("%s", line)
    log.info("report", "json %s", report.to_json())
