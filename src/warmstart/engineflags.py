"""vLLM's flags as UPPER_SNAKE variables (worker-vllm's names: `MAX_MODEL_LEN` -> `--max-model-len`),
with whether each enters the cache key. Part of the table `variables` indexes.

Two parts: the curated flags (CURATED_FLAGS: the common ones, with a sentence, their kind and `in_key`
decided and checked flag by flag against vLLM's hash), and every other `vllm serve` option, derived
from vLLM's own parser table (vllm/flagtypes.json) by `derived_flags` as worker-vllm's args_builder.py
maps them: a value flag takes the variable's text, a flag of several words the text split like a shell
line, a store-true flag `true` -> the flag and `false` -> nothing, a paired boolean `false` -> its
other side (`--no-x`, or 0.33's `--disable-x`). Nothing is hand-listed for them: a vLLM upgrade is a
regenerated table. REMOVED_FLAGS are worker-vllm variables whose flag no vLLM warmstart runs still has:
a warning naming the replacement, and ignored.
"""

from __future__ import annotations

from collections.abc import Collection

from .secrets import looks_secret
from .varspec import DTYPES, Kind, Variable
from .vllm.argvalues import dest_of
from .vllm.flagtypes import FLAGS, Flag
from .vllm.hashing import EXTRA_ARGS_NOT_IN_KEY


def _flag(env: str, flag: str, kind: Kind, in_key: bool, doc: str, choices: tuple[str, ...] = ()) -> Variable:
    return Variable(env, kind, doc, flag=flag, in_key=in_key, choices=choices)


CURATED_FLAGS: tuple[Variable, ...] = (
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


# worker-vllm variables whose flag is in neither parser warmstart runs (vllm/flagtypes.json; tests check
# it): ignored, with a warning naming what replaced it. The replacements are worker-vllm's (args_builder.py
# REMOVED_FLAGS, main of 2026-08-20) and this table's own names. DISABLE_LOG_REQUESTS is here although 0.33
# has `--disable-log-requests` again (the other side of `--enable-log-requests`): 0.32 refuses it, and
# ENABLE_LOG_REQUESTS=false says the same to both.
REMOVED_FLAGS: dict[str, str] = {
    "CALCULATE_KV_SCALES": "no replacement",
    "CUDA_GRAPH_SIZES": "set cudagraph_capture_sizes in COMPILATION_CONFIG, or CUDAGRAPH_CAPTURE_SIZES",
    "DISABLE_FRONTEND_MULTIPROCESSING": "no replacement",
    "DISABLE_LOG_REQUESTS": "use ENABLE_LOG_REQUESTS=false",
    "DISABLE_MM_PREPROCESSOR_CACHE": "tune MM_PROCESSOR_CACHE_GB instead",
    "ENABLE_LORA_BIAS": "no replacement",
    "ENABLE_MULTIMODAL_ENCODER_DATA_PARALLEL": "no replacement",
    "EPLB_LOG_BALANCEDNESS": "now a field of EPLB_CONFIG",
    "EPLB_STEP_INTERVAL": "now a field of EPLB_CONFIG",
    "EPLB_WINDOW_SIZE": "now a field of EPLB_CONFIG",
    "GUIDED_DECODING_BACKEND": "use STRUCTURED_OUTPUTS_CONFIG",
    "GUIDED_DECODING_DISABLE_ADDITIONAL_PROPERTIES": "use STRUCTURED_OUTPUTS_CONFIG",
    "GUIDED_DECODING_DISABLE_ANY_WHITESPACE": "use STRUCTURED_OUTPUTS_CONFIG",
    "GUIDED_DECODING_DISABLE_FALLBACK": "use STRUCTURED_OUTPUTS_CONFIG",
    "LOGITS_PROCESSOR_PATTERN": "use LOGITS_PROCESSORS",
    "LORA_EXTRA_VOCAB_SIZE": "no replacement",
    "MAX_CONTEXT_LEN_TO_CAPTURE": "set max_cudagraph_capture_size in COMPILATION_CONFIG",
    "MAX_LONG_PARTIAL_PREFILLS": "no replacement",
    "MAX_NUM_PARTIAL_PREFILLS": "no replacement",
    "MAX_SEQ_LEN_TO_CAPTURE": "set max_cudagraph_capture_size in COMPILATION_CONFIG",
    "NUM_LOOKAHEAD_SLOTS": "speculative decoding is configured in SPECULATIVE_CONFIG",
    "NUM_REDUNDANT_EXPERTS": "now a field of EPLB_CONFIG",
    "OVERRIDE_ATTENTION_DTYPE": "no replacement",
    "OVERRIDE_POOLER_CONFIG": "use POOLER_CONFIG",
    "ROPE_SCALING": "put rope_scaling in HF_OVERRIDES",
    "ROPE_THETA": "put rope_theta in HF_OVERRIDES",
    "SWAP_SPACE": "vLLM V1 has no swap space; no replacement",
    "TASK": "use RUNNER and CONVERT",
    "USE_V2_BLOCK_MANAGER": "no replacement",
    "VLLM_ATTENTION_BACKEND": "use ATTENTION_BACKEND",
    "WORKER_USE_RAY": "use DISTRIBUTED_EXECUTOR_BACKEND=ray",
}

# `0` read as unset, with a warning: endpoint templates carry a stray MAX_NUM_BATCHED_TOKENS=0 (worker-vllm's
# ZERO_MEANS_UNSET), which vLLM refuses (config/scheduler.py `max_num_batched_tokens: int = Field(...,
# ge=1)`, 0.32 and 0.33); unset, vLLM sizes the batch itself. Not general: `SEED=0` is a seed.
ZERO_MEANS_UNSET = frozenset({"MAX_NUM_BATCHED_TOKENS"})

# Options warmstart sets itself (loopback, the pinned snapshot, the served name), reads under its own
# name or that mean nothing to a worker: no variable. OWN_OPTION_VARIABLES: the variable that sets one
# (a warning names it to whoever writes SERVED_MODEL_NAME or API_KEY).
OWN_OPTION_VARIABLES = {
    "--model": "MODEL_NAME",
    "--revision": "MODEL_REVISION",
    "--served-model-name": "OPENAI_SERVED_MODEL_NAME_OVERRIDE",
    "--config": "VLLM_CONFIG_FILE",
    "--hf-token": "HF_TOKEN",
    "--api-key": "VLLM_API_KEY",
}
OWN_OPTIONS = frozenset({"--host", "--port", "--download-dir", "--help", *OWN_OPTION_VARIABLES})
_VALUE_KINDS: dict[str, Kind] = {"int": "int", "float": "float", "json": "json", "str": "str"}


def env_name(option: str) -> str:
    """worker-vllm's variable for an option: `--enable-expert-parallel` -> ENABLE_EXPERT_PARALLEL."""
    return option.removeprefix("--").replace("-", "_").upper()


def _off_side(option: str, flag: Flag) -> str | None:
    """The option that sets the same dest to the other boolean, `--no-<option>` first; None: a plain
    store-true (or store-false) option, whose `false` is to leave it out."""
    other = "false" if flag.kind == "true" else "true"
    candidates = [o for o, f in FLAGS.items() if f.dest == flag.dest and f.kind == other and o.startswith("--")]
    negative = "--no-" + option[2:]
    if negative in candidates:
        return negative
    return min(candidates, key=lambda o: (o.startswith("--no-"), o), default=None)


def _derived(option: str, flag: Flag, hashed_out: Collection[str]) -> Variable:
    env = env_name(option)
    # secret by the name rule every variable follows (ALLOW_CREDENTIALS: its value is never printed either)
    common: dict = {"flag": option, "in_key": flag.dest not in hashed_out, "secret": looks_secret(env)}
    doc = f"vLLM's `{option}` (from vLLM's parser)"
    if flag.kind in ("true", "false"):
        off = _off_side(option, flag)
        if off is None:
            return Variable(env, "bool", doc, **common)
        return Variable(env, "pair_bool", doc, off_flag=off, **common)
    kind: Kind = "argv" if flag.nargs == "many" else _VALUE_KINDS[flag.kind]
    return Variable(env, kind, doc, minimum=float("-inf"), **common)


def derived_flags(taken: Collection[str]) -> tuple[Variable, ...]:
    """A variable for every long `vllm serve` option whose name `taken` (the curated flags, warmstart's
    own variables, REMOVED_FLAGS) does not already hold. `--no-x` spellings are the `false` of their
    flag's variable, not variables. `in_key` is what the key does with the flag, which it reads from
    the argv by dest (key.key_args), as it does VLLM_EXTRA_ARGS: out where vLLM leaves the dest out of
    its hash (vllm/hashing.py, the curated flags), else in: a needless cold boot is cheaper than a wrong hit."""
    hashed_out = {dest_of(o) for o in EXTRA_ARGS_NOT_IN_KEY}
    hashed_out |= {dest_of(str(v.flag)) for v in CURATED_FLAGS if not v.in_key}
    out = []
    for option, flag in FLAGS.items():
        if not option.startswith("--") or option.startswith("--no-") or option in OWN_OPTIONS:
            continue
        if (env := env_name(option)) in taken or env in REMOVED_FLAGS:
            continue
        out.append(_derived(option, flag, hashed_out))
    return tuple(out)
