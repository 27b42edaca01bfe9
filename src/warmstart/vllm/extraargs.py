"""VLLM_EXTRA_ARGS checked against vLLM's own flag table before anything starts.

An unknown flag in VLLM_EXTRA_ARGS used to fail only after ~25 s, with vLLM's 300-line usage
text and a junk key left on the volume; the table (flagtypes.json, read from vLLM's parser)
knows every flag and how its value is read, so the check is one line at settings time.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

from .argv import parse_argv
from .flagtypes import FLAGS


def extra_args_problems(extra_args: tuple[str, ...], source: str = "VLLM_EXTRA_ARGS") -> list[str]:
    """VLLM_EXTRA_ARGS (or the flags of VLLM_CONFIG_FILE, `source`) checked against vLLM's own flag table
    (vllm/flagtypes.json) before anything starts: an unknown flag or a value vLLM's parser would refuse is
    one line here, not vLLM's 300-line usage text ~25 s later with a junk key left on the volume."""
    problems: list[str] = []
    for occurrence in parse_argv(extra_args):
        name = occurrence.flag
        if name is None or name.startswith(
            "-O"
        ):  # -O<level> / -O.field: vLLM's own shorthand for the compilation config
            continue
        # `-cc.field v` / `--compilation-config.field v`: one field of a JSON flag (vLLM's
        # FlexibleArgumentParser reads the dotted form); the flag before the dot must be a JSON one.
        base, dotted, _ = name.partition(".")
        flag = FLAGS.get(base if dotted else name)
        if flag is None and name.startswith("--") and not dotted:
            # argparse takes a unique prefix of a long option (allow_abbrev; test_concurrency's `--max-num-se`).
            prefixed = [option for option in FLAGS if option.startswith(name)]
            flag = FLAGS[prefixed[0]] if len(prefixed) == 1 else None
        if flag is not None and dotted:
            if flag.kind == "json":
                continue
            flag = None
        if flag is None:
            near = difflib.get_close_matches(name, list(FLAGS), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            problems.append(f"{source}: {occurrence.written} is not a flag of vLLM's serve{hint}")
            continue
        for value in occurrence.values:
            if flag.kind in ("int", "float"):
                try:
                    int(value) if flag.kind == "int" else float(value)
                except ValueError:
                    problems.append(f"{source}: {occurrence.written} {value!r}: vLLM expects {flag.kind}")
    return problems


# Names that a container commonly has and that happen to spell a vLLM flag: no warning for them.
_COMMON_ENV = frozenset(
    {"PATH", "HOME", "HOST", "HOSTNAME", "PORT", "LANG", "USER", "SHELL", "PWD", "TERM"}
    | {"SSL_CERT_FILE", "SSL_CERT_DIR"}  # OpenSSL's CA bundle, a near miss of vLLM's SSL_CERTFILE
)
_OTHER_TOOLS = ("VLLM_", "HF_", "RUNPOD_", "AWS_", "CUDA_", "NVIDIA_", "PYTHON", "LC_", "TORCH", "NCCL_", "OMP_")


def unknown_variable_warnings(
    names: Iterable[str], known: Iterable[str], instead: Mapping[str, str] | None = None
) -> list[str]:
    """One line per variable warmstart does not read that is a near miss of one it reads
    (MAX_MODEL_LENGTH -> MAX_MODEL_LEN) or spells a vLLM flag: set, it would change nothing.
    `instead`: names that spell a flag warmstart sets from another variable (SERVED_MODEL_NAME ->
    OPENAI_SERVED_MODEL_NAME_OVERRIDE)."""
    known = set(known)
    instead = instead or {}
    out: list[str] = []
    for name in sorted(names):
        if name in known or name in _COMMON_ENV or not re.fullmatch(r"[A-Z][A-Z0-9_]+", name):
            continue
        if name.startswith(_OTHER_TOOLS):
            continue
        near = [instead[name]] if name in instead else difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.85)
        flag = "--" + name.lower().replace("_", "-")
        if near:
            out.append(f"{name} is not read by warmstart and changes nothing: did you mean {near[0]}?")
        elif flag in FLAGS:
            out.append(
                f"{name} is not read by warmstart and changes nothing: for vLLM's {flag}, put it in VLLM_EXTRA_ARGS"
            )
    return out
