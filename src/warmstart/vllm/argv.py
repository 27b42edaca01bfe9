"""vLLM's command line, parsed once: which flags an argv gives, and with which values.

Several parts of warmstart read `VLLM_EXTRA_ARGS` (after shlex) or the engine's whole argv:
the API key vLLM will demand, the secret values to mask, the flags that go into the cache
key, the parallel sizes that say how many GPUs the engine uses, the flags warmstart refuses
to let a user override, and the per-boot flags the boot record leaves out. They must agree
on where one flag's value ends and the next flag begins, so they all read this parse.

The rules are argparse's, as vLLM's parser uses them: a flag is named as vLLM names it
(`--max_num_seqs` is `--max-num-seqs`); `--flag=v` and `-f=v` carry their
value inline; `--flag v` takes the next word; a flag of vLLM's that takes several values
(`nargs="+"`: `--api-key k1 k2`) takes every word up to the next flag; `--no-flag` and the
boolean flags named below take none; a word that no flag takes is a bare value (the model
in `serve MODEL`). Words like `-1` are values, not flags; after `--` every word is bare. A
flag not listed here takes one word when one follows: a boolean flag this module does not
know would swallow a positional, and VLLM_EXTRA_ARGS carries none.

Pure functions over a tuple of strings; nothing here imports warmstart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .flagtypes import FLAGS

# Flags with nargs="+" in `vllm serve`'s parser (read from the parser itself: every action whose
# nargs is "+" or "*"; vLLM derives them from list-typed config fields in engine/arg_utils.py).
MULTI_VALUE_FLAGS = frozenset(
    {
        "--allowed-media-domains",
        "--api-key",
        "--collect-detailed-traces",
        "--cpu-offload-params",
        "--cudagraph-capture-sizes",
        "--ignore-patterns",
        "--kv-cache-dtype-skip-layers",
        "--logits-processors",
        "--lora-modules",
        "--lora-target-modules",
        "--numa-bind-cpus",
        "--numa-bind-nodes",
        "--offload-params",
        "--served-model-name",
        "--sleep-preserve-parameter-names",
    }
)

# Boolean flags (store_true or BooleanOptionalAction, nargs=0) that warmstart sets or names:
# they take no value. Every `--no-...` form takes none either.
NO_VALUE_FLAGS = frozenset(
    {
        "--async-scheduling",
        "--disable-log-requests",
        "--disable-log-stats",
        "--disable-uvicorn-access-log",
        "--enable-auto-tool-choice",
        "--enable-chunked-prefill",
        "--enable-expert-parallel",
        "--enable-log-requests",
        "--enable-lora",
        "--enable-prefix-caching",
        "--enable-sleep-mode",
        "--enforce-eager",
        "--headless",
        "--help",
        "--skip-tokenizer-init",
        "--trust-remote-code",
        "--use-tqdm-on-load",
        "-ep",
        "-h",
    }
)

# What differs per boot without changing artifacts, left out of the boot's record of the argv:
# warmstart picks the loopback host and port and the served name itself.
VOLATILE_FLAGS = frozenset({"--port", "--host", "--served-model-name"})

_NUMBER = re.compile(r"^-\.?\d")


@dataclass(frozen=True)
class Occurrence:
    """One flag as written, with its values; or a bare value that no flag takes (`flag` None).

    `tokens` are the argv entries it spans, as written, so an argv can be rebuilt without it.
    """

    flag: str | None
    values: tuple[str, ...]
    tokens: tuple[str, ...]

    @property
    def inline(self) -> bool:
        """Written as `--flag=value`."""
        return self.flag is not None and len(self.tokens) == 1 and "=" in self.tokens[0]

    @property
    def written(self) -> str | None:
        """The flag as written (`--max_num_seqs`), where `flag` is vLLM's name for it (`--max-num-seqs`)."""
        return None if self.flag is None else self.tokens[0].partition("=")[0]

    @property
    def value(self) -> str | None:
        """The first value, or None for a flag given none."""
        return self.values[0] if self.values else None


def is_flag(token: str) -> bool:
    """`--flag`, `--flag=v` or `-f`; not `-1`, `-` or a bare word."""
    return token.startswith("-") and token != "-" and not _NUMBER.match(token)


# argparse's `_negative_number_matcher` (Lib/argparse.py): such a word is a value, not an option.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def reads_as_option(word: str) -> bool:
    """Would vLLM's parser take this word for an option, wherever it stands? Any word that starts with
    `-` but `-` itself and a negative number (argparse), and a dotted one even then (`-0.5`:
    FlexibleArgumentParser.parse_args reads every `-` word with a `.` as `-KEY.FIELD VALUE`; `-O3` is
    `--optimization-level 3`). A value word of this shape is a flag smuggled in (`--host` inside
    ALLOWED_MEDIA_DOMAINS), or one vLLM refuses; either way not a value."""
    return word.startswith("-") and word != "-" and (not _NEGATIVE_NUMBER.match(word) or "." in word)


def vllm_spelling(flag: str) -> str:
    """A flag as vLLM's parser names it: in a `--` flag, underscores before the first `.` are dashes
    (`--max_num_seqs` is `--max-num-seqs`, `--compilation_config.level` is `--compilation-config.level`;
    utils/argparse_utils.py FlexibleArgumentParser.parse_args, `(?<=--)[^\\.]*` with `_` -> `-`)."""
    if not flag.startswith("--"):
        return flag
    head, dot, rest = flag[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def takes_values(flag: str) -> str:
    """How many words `--flag` (written without `=`) takes: "none", "one" or "many"."""
    if flag in FLAGS:
        return FLAGS[flag][2]
    if flag in NO_VALUE_FLAGS or flag.startswith("--no-"):
        return "none"
    return "many" if flag in MULTI_VALUE_FLAGS else "one"


def parse_argv(args: Iterable[str]) -> tuple[Occurrence, ...]:
    """The argv as flag occurrences and bare values, in order."""
    tokens = list(args)
    out: list[Occurrence] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            out += [Occurrence(None, (t,), (t,)) for t in tokens[i:]]  # "--" itself included, as written
            break
        if not is_flag(token):
            out.append(Occurrence(None, (token,), (token,)))
            i += 1
            continue
        name, eq, inline = token.partition("=")
        name = vllm_spelling(name)  # as vLLM reads it; `tokens` keep what was written
        if eq:
            out.append(Occurrence(name, (inline,), (token,)))
            i += 1
            continue
        arity = takes_values(name)
        end = i + 1
        if arity != "none":
            while end < len(tokens) and not is_flag(tokens[end]) and tokens[end] != "--":
                end += 1
                if arity == "one":
                    break
        out.append(Occurrence(name, tuple(tokens[i + 1 : end]), tuple(tokens[i:end])))
        i = end
    return tuple(out)


def flags(args: Iterable[str]) -> list[str]:
    """The flag names an argv gives, in order (repeats kept)."""
    return [o.flag for o in parse_argv(args) if o.flag is not None]


def values_of(args: Iterable[str], names: Iterable[str]) -> list[str]:
    """Every value given to any of `names`, in order."""
    wanted = frozenset(names)
    return [v for o in parse_argv(args) if o.flag in wanted for v in o.values]


def last_flag_value(args: Sequence[str], names: Iterable[str]) -> str | None:
    """The value of the last of `names` given one (argparse keeps the last); its first value if several."""
    wanted = frozenset(names)
    found = [o.value for o in parse_argv(args) if o.flag in wanted and o.values]
    return found[-1] if found else None


def without_flags(args: Iterable[str], names: Iterable[str]) -> list[str]:
    """The argv with every occurrence of `names` removed, values included; the rest as written."""
    wanted = frozenset(names)
    return [t for o in parse_argv(args) if o.flag not in wanted for t in o.tokens]
