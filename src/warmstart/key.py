"""The cache key: which compiled artifacts a boot may reuse.

A key names everything that changes what torch.compile, Inductor, Triton, DeepGEMM,
FlashInfer or the CUDA driver produce: the model, its pinned revision and the path vLLM is
given for it, the hardware, the vLLM / torch / Triton / Python builds, the flags marked
`in_key` in variables.ENGINE_FLAGS and the variables vLLM hashes. The rule for flags and
variables is vLLM's own compile hash, checked against vLLM in tests/test_vllm_hash.py:
whatever vLLM hashes is in the key, and what it leaves out (served name, memory fraction,
port, log level, tokens) stays out, so changing it keeps a worker warm.

Flags enter as the values vLLM's parser sets (vllm/argvalues.py): the engine-flag variables
and VLLM_EXTRA_ARGS are one argv, read the way vLLM reads it, so `MAX_NUM_SEQS=4`,
`--max-num-seqs 4` and `--max-num-seqs=4` are one factor, `ENFORCE_EAGER=true|True|1` one
value, `MAX_MODEL_LEN=0512` the same as 512. Secrets never enter (secrets.py), not even
hashed: a digest of a short key can be searched.

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

from .engine.concurrency import ConcurrencyFit
from .engine.process import vllm_flags
from .envnames import is_secret_variable
from .hardware import Hardware
from .model import ResolvedModel
from .secrets import MASK, SECRET_JSON_FIELDS, dotted_secret, looks_secret, mask_json, secret_json_values
from .settings import Settings
from .variables import ENGINE_FLAGS
from .vllm.argv import flags, without_flags
from .vllm.argvalues import dest_of, parsed_values
from .vllm.flagtypes import FLAGS
from .vllm.hashing import EXTRA_ARGS_NOT_IN_KEY, JSON_FIELDS_NOT_IN_KEY, MAPPED_ENV, VLLM_ENV_NOT_HASHED
from .vllm.install import EngineInfo

# Engine-flag variables that vLLM leaves out of its hash (`in_key` False): out of the key
# however they are spelled, like EXTRA_ARGS_NOT_IN_KEY (tests/vllm/test_vllm_hash.py).
FLAGS_NOT_IN_KEY = frozenset({f.flag for f in ENGINE_FLAGS if not f.in_key and f.flag} | EXTRA_ARGS_NOT_IN_KEY)


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
    dropped = {
        name for name in flags(extra) if name in EXTRA_ARGS_NOT_IN_KEY or looks_secret(name) or dotted_secret(name)
    }
    return without_flags(extra, dropped)


def _masked(values: dict[str, Any]) -> dict[str, Any]:
    """Every credential inside a JSON-valued flag masked, at any depth (secrets.py says which fields are);
    a JSON flag's text that is not JSON but names one (vLLM refuses it), and an unknown flag's word that
    does, masked whole."""
    for flag, row in FLAGS.items():
        if row.kind != "json" or not flag.startswith("--") or row.dest not in values:
            continue
        value = values[row.dest]
        if isinstance(value, (dict, list)):
            values[row.dest] = mask_json(flag, value)
        elif isinstance(value, str) and secret_json_values(flag, value):
            values[row.dest] = MASK
        if flag in SECRET_JSON_FIELDS and not isinstance(values[row.dest], dict):
            values[row.dest] = MASK  # not an object (vLLM refuses it): the whole value may be the secret
    for name, occurrences in values.items():
        if name.startswith("-"):  # a flag the table does not know: its words as written
            values[name] = [[MASK if secret_json_values(name, w) else w for w in words] for words in occurrences]
    return values


def key_args(settings: Settings, fit: ConcurrencyFit | None = None) -> dict[str, Any]:
    """The flags vLLM will be given (VLLM_CONFIG_FILE's, which vLLM puts first, the engine-flag variables,
    the plan's concurrency fit, then VLLM_EXTRA_ARGS), as the values vLLM's parser sets; serving-only
    flags and secrets left out, JSON credential fields masked. The file enters as the flags it stands for,
    so a file of serving-only settings leaves the key as it was, and its path never enters."""
    argv = vllm_flags(settings, fit)
    secret = {f for f in flags(argv) if looks_secret(f) or dotted_secret(f)}
    # `--config`'s path never enters: the file's flags do (settings reads it, vllm/configfile.py).
    dropped = {f for f in flags(argv) if f in FLAGS_NOT_IN_KEY} | secret | FLAGS_NOT_IN_KEY | {"--config"}
    values = parsed_values(argv, dropped)
    for flag, unhashed in JSON_FIELDS_NOT_IN_KEY.items():
        if isinstance(values.get(dest := dest_of(flag)), dict):
            values[dest] = {k: v for k, v in values[dest].items() if k not in unhashed}
            if not values[dest]:
                del values[dest]  # only fields vLLM does not hash: as if the flag were not given
    return _masked(values)


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
        if k not in MAPPED_ENV and k not in VLLM_ENV_NOT_HASHED and not is_secret_variable(k)
    }


def derive_key(
    settings: Settings,
    model: ResolvedModel,
    hardware: Hardware,
    engine: EngineInfo,
    derived_env: Mapping[str, str] | None = None,
    fit: ConcurrencyFit | None = None,
) -> CacheKey:
    """The key for this boot. `derived_env` holds VLLM_* values warmstart chose (e.g. AOT off on CPU);
    `fit` is the plan's concurrency fit (None: the fit for these settings)."""
    factors: dict[str, Any] = {
        # An s3:// model is keyed by its URL (and its listing's revision), not the local folder it was read to.
        "model": model.repo_id or (model.name if model.source == "s3" else str(model.path)),
        "revision": model.revision,
        # vLLM hashes the model path it is given (ModelConfig.model). That is the stable link
        # `<WARMSTART_LOCAL_CACHE>/models/<org>--<name>/<commit>` (model.vllm_model_path), built
        # from the factors above and a directory that is one constant per image (/tmp/warmstart):
        # keying its absolute path would split workers whose local disks merely differ. A worker
        # whose WARMSTART_LOCAL_CACHE differs shows it in `observed.engine_argv` when vLLM misses.
        "hardware": hardware.as_dict(),
        "engine": engine.as_dict(),
        "args": key_args(settings, fit),
        "vllm_env": key_vllm_env({**dict(settings.vllm_env), **dict(derived_env or {})}),
    }
    canonical = json.dumps(factors, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    model_part = _slug((model.repo_id or (model.name if model.source == "s3" else model.path.name)).split("/")[-1], 40)
    rev_part = model.revision.removeprefix("local-")[:8]
    dirname = f"{model_part}--{rev_part}--{hardware.slug}--vllm-{_slug(engine.vllm, 20)}--{digest[:10]}"
    return CacheKey(factors, digest, dirname)


# --------------------------------------------------------------------------- comparing factors
# One diff of two keys' factors, read by the report's miss explanation, `explain` and the choice of
# sibling keys to seed from: nested records compared leaf by leaf under dotted names.


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(data, list):
        return {prefix: json.dumps(data, sort_keys=True)}
    return {prefix: data}


def factor_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[Any]]:
    """{dotted name: [old, new]} for every factor that differs (None where one side lacks it)."""
    a, b = flatten(old), flatten(new)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
