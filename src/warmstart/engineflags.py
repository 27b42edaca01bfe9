"""vLLM's flags as UPPER_SNAKE variables (worker-vllm's names: `MAX_MODEL_LEN` -> `--max-model-len`),
with whether each enters the cache key. Part of the table `variables` indexes."""

from __future__ import annotations

from .varspec import DTYPES, Kind, Variable


def _flag(env: str, flag: str, kind: Kind, in_key: bool, doc: str, choices: tuple[str, ...] = ()) -> Variable:
    return Variable(env, kind, doc, flag=flag, in_key=in_key, choices=choices)


ENGINE_FLAGS: tuple[Variable, ...] = (
    # In the key: vLLM hashes them into its compile cache's name (VllmConfig.compute_hash, checked
    # flag by flag against vLLM itself in tests/test_vllm_hash.py), so a change means a cold compile.
    _flag("MAX_MODEL_LEN", "--max-model-len", "int", True, "context length in tokens"),
    _flag("DTYPE", "--dtype", "choice", True, "weights and activations dtype", DTYPES),
    _flag("KV_CACHE_DTYPE", "--kv-cache-dtype", "str", True, "KV cache dtype (`auto`, `fp8`, ...)"),
    _flag("QUANTIZATION", "--quantization", "str", True, "quantization method (`awq`, `gptq`, `fp8`, ...)"),
    _flag("MAX_NUM_SEQS", "--max-num-seqs", "int", True, "sequences per iteration"),
    _flag("MAX_NUM_BATCHED_TOKENS", "--max-num-batched-tokens", "int", True, "tokens per iteration"),
    _flag("TENSOR_PARALLEL_SIZE", "--tensor-parallel-size", "int", True, "GPUs each layer is split over"),
    _flag("PIPELINE_PARALLEL_SIZE", "--pipeline-parallel-size", "int", True, "pipeline stages"),
    _flag("DATA_PARALLEL_SIZE", "--data-parallel-size", "int", True, "engine replicas"),
    # "bool", not "pair_bool": vLLM's default is False, in 0.32 and 0.33 alike (engine/arg_utils.py
    # EngineArgs: enforce_eager, enable_lora, trust_remote_code, skip_tokenizer_init, enable_log_requests;
    # entrypoints/common/cli_args.py, launchers/ in 0.32: enable_auto_tool_choice), so `false` adds nothing.
    _flag("ENFORCE_EAGER", "--enforce-eager", "bool", True, "no torch.compile and no CUDA graphs"),
    _flag("COMPILATION_CONFIG", "--compilation-config", "json", True, "vLLM's compilation config, JSON"),
    _flag("BLOCK_SIZE", "--block-size", "int", True, "tokens per KV cache block"),
    # vLLM hashes its effect: off, max_num_batched_tokens defaults to max(max_model_len, default).
    _flag(
        "ENABLE_CHUNKED_PREFILL",
        "--enable-chunked-prefill",
        "pair_bool",
        True,
        "chunked prefill; changes the default `max_num_batched_tokens`, which vLLM hashes",
    ),
    _flag("ATTENTION_BACKEND", "--attention-backend", "str", True, "the attention kernels"),
    _flag("ENABLE_LORA", "--enable-lora", "bool", True, "serve LoRA adapters"),
    _flag("MAX_LORAS", "--max-loras", "int", True, "LoRA adapters in one batch"),
    _flag("MAX_LORA_RANK", "--max-lora-rank", "int", True, "the largest LoRA rank"),
    _flag("SPECULATIVE_CONFIG", "--speculative-config", "json", True, "speculative decoding config, JSON"),
    # vLLM hashes its effects, not the flag (LoadConfig.compute_hash is empty; some formats
    # change the model config, e.g. `maybe_untie_word_embeddings` in config/vllm.py).
    _flag(
        "LOAD_FORMAT",
        "--load-format",
        "str",
        True,
        "weights format; in the key because vLLM hashes its effects on the model config",
    ),
    _flag("HF_OVERRIDES", "--hf-overrides", "json", True, "overrides of the model's Hugging Face config, JSON"),
    # ModelConfig fields that ModelConfig.compute_hash does not ignore (config/model.py).
    _flag("TRUST_REMOTE_CODE", "--trust-remote-code", "bool", True, "run the model repo's own code"),
    _flag("MAX_LOGPROBS", "--max-logprobs", "int", True, "most log-probabilities one request may ask for"),
    # 0.33 hashes it for multimodal models (`factors["mm_limit_per_prompt"]`); 0.32 does not.
    _flag(
        "LIMIT_MM_PER_PROMPT",
        "--limit-mm-per-prompt",
        "json",
        True,
        "multimodal items per prompt, JSON; hashed by vLLM 0.33 for multimodal models",
    ),
    # Serving behaviour only: vLLM leaves them out of its hash, and so does the key.
    _flag("GPU_MEMORY_UTILIZATION", "--gpu-memory-utilization", "fraction", False, "share of GPU memory vLLM may use"),
    _flag("KV_CACHE_MEMORY_BYTES", "--kv-cache-memory-bytes", "str", False, "KV cache size, instead of the share"),
    _flag("ENABLE_PREFIX_CACHING", "--enable-prefix-caching", "pair_bool", False, "reuse KV cache across requests"),
    _flag("SEED", "--seed", "int", False, "the sampling seed"),
    _flag("TOKENIZER_NAME", "--tokenizer", "str", False, "a tokenizer other than the model's"),
    _flag("TOKENIZER_REVISION", "--tokenizer-revision", "str", False, "the tokenizer's revision"),
    _flag("TOKENIZER_MODE", "--tokenizer-mode", "str", False, "`auto`, `slow`, `mistral`, ..."),
    _flag("SKIP_TOKENIZER_INIT", "--skip-tokenizer-init", "bool", False, "no tokenizer: token ids in and out"),
    _flag("CUSTOM_CHAT_TEMPLATE", "--chat-template", "str", False, "a chat template, or a path to one"),
    _flag("ENABLE_AUTO_TOOL_CHOICE", "--enable-auto-tool-choice", "bool", False, "let the model call tools"),
    _flag("TOOL_CALL_PARSER", "--tool-call-parser", "str", False, "how tool calls are read from the output"),
    _flag("REASONING_PARSER", "--reasoning-parser", "str", False, "how reasoning is read from the output"),
    _flag("LORA_MODULES", "--lora-modules", "str", False, "LoRA adapters to serve (`name=path`)"),
    _flag("MAX_PARALLEL_LOADING_WORKERS", "--max-parallel-loading-workers", "int", False, "weights loaded at once"),
    _flag("DISTRIBUTED_EXECUTOR_BACKEND", "--distributed-executor-backend", "str", False, "`mp` or `ray`"),
    _flag("DISABLE_LOG_STATS", "--disable-log-stats", "bool", False, "no periodic throughput lines"),
    _flag("ENABLE_LOG_REQUESTS", "--enable-log-requests", "bool", False, "one log line per request"),
    _flag("RESPONSE_ROLE", "--response-role", "str", False, "the role of generated chat messages"),
)
