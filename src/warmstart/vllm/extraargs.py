"""VLLM_EXTRA_ARGS checked against vLLM's own flag table before anything starts.

An unknown flag in VLLM_EXTRA_ARGS used to fail only after ~25 s, with vLLM's 300-line usage
text and a junk key left on the volume; the table (flagtypes.json, read from vLLM's parser)
knows every flag and how its value is read, so the check is one line at settings time.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

from .argv import parse_argv, reads_as_option
from .flagtypes import FLAGS


def abbreviated(name: str) -> list[str]:
    """The options of vLLM's that `name` abbreviates, as argparse's `allow_abbrev` reads a prefix (vLLM's
    FlexibleArgumentParser keeps it: `--hos` is `--host`, `-t` is `-tp`; utils/argparse_utils.py, 0.32 and
    0.33); [] for a whole name. warmstart refuses every abbreviation instead of resolving it: which option a
    prefix names depends on the release's parser (0.33 added `--disable-x` to every `--enable-x`) and on the
    Python's argparse (3.11 here, 3.12 in the image), and a prefix that is unique today can name a refused
    or secret flag after an upgrade. A whole name means the same to every check and to both releases."""
    if name in FLAGS or name.startswith("-O") or not name.startswith("-") or len(name) < 2:
        return []
    if name.startswith("--"):
        return sorted(option for option in FLAGS if option.startswith(name))
    # `-t` abbreviates `-tp`; `-qfp8` is `-q fp8`, a short option with its value attached (argparse 3.11
    # `_get_option_tuples`): both take an option by a prefix.
    return sorted(o for o in FLAGS if not o.startswith("--") and (o.startswith(name) or name.startswith(o)))


def extra_args_problems(extra_args: tuple[str, ...], source: str = "VLLM_EXTRA_ARGS") -> list[str]:
    """VLLM_EXTRA_ARGS (or the flags of VLLM_CONFIG_FILE, `source`) checked against vLLM's own flag table
    (vllm/flagtypes.json) before anything starts: an unknown flag or a value vLLM's parser would refuse is
    one line here, not vLLM's 300-line usage text ~25 s later with a junk key left on the volume."""
    problems: list[str] = []
    position = 0  # the word an occurrence starts at, from 1
    for occurrence in parse_argv(extra_args):
        name = occurrence.flag
        position += len(occurrence.tokens)
        if name is None:
            # vLLM's parser gives a word no flag takes to its positional `model_tag` (or refuses it): never
            # what was meant (`--api-key=K1 K2`: K2 is no key). Not quoted: it may be a secret.
            problems.append(
                f"{source}: word {position} is a value that no flag takes (vLLM would read it as the model)"
            )
            continue
        if name.startswith("-O"):  # -O<level> / -O.field: vLLM's own shorthand for the compilation config
            continue
        # `-cc.field v` / `--compilation-config.field v`: one field of a JSON flag (vLLM's
        # FlexibleArgumentParser reads the dotted form); the flag before the dot must be a JSON one.
        base, dotted, _ = name.partition(".")
        flag = FLAGS.get(base if dotted else name)
        if flag is None and (meant := abbreviated(base if dotted else name)):
            problems.append(
                f"{source}: {occurrence.written} abbreviates {' or '.join(meant)}: write flags in full "
                "(vLLM's parser would take the prefix; warmstart checks whole names only)"
            )
            continue
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
                    # A plain word is quoted; anything with structure may be a config meant for another flag
                    # (`--watermark '{"key": N}'`), credentials included: not quoted.
                    shown = repr(value) if re.fullmatch(r"[\w.+-]{1,40}", value) else "(its value)"
                    problems.append(f"{source}: {occurrence.written} {shown}: vLLM expects {flag.kind}")
    return problems


def smuggled_flags(env: str, words: list[str]) -> list[str]:
    """An engine-flag variable's value words that vLLM's parser would read as flags of their own
    (`ALLOWED_MEDIA_DOMAINS="example.com --host 0.0.0.0"` sets vLLM's host): refused, whatever the flag.
    Only the flag's name is quoted: a value written `--api-key=S` holds a secret."""
    return [
        f"{env}: {word.partition('=')[0]!r} would reach vLLM as a flag, not a value; "
        "give vLLM's flags in VLLM_EXTRA_ARGS"
        for word in words
        if reads_as_option(word)
    ]


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
