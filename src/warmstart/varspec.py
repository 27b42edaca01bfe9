"""What one environment variable is: its type, default and sentence, and for an engine flag the
`vllm serve` flag it sets. The tables are `variables` (warmstart's own settings) and `engineflags`
(vLLM's flags as UPPER_SNAKE variables)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
# canary.py: what a canary that differs from its generation's record does to the boot
CANARY_MODES = ("enforce", "warn", "off")
# Runpod's two kinds of Serverless endpoint: jobs through Runpod's queue (the Runpod SDK), or
# HTTP straight to the worker (worker/front.py).
ENDPOINT_TYPES = ("queue", "load_balancer")


@dataclass(frozen=True)
class Variable:
    """One environment variable. Engine flags carry `flag`; wrapper settings carry `field`.

    For engine flags, kind "bool" emits `--flag` when true and nothing when false (flags whose
    vLLM default is False: `false` and unset are then one command line and one key), and
    "pair_bool" emits `--flag` / `--no-flag` (vLLM's BooleanOptionalAction whose default is
    None, decided later by vLLM: `--no-flag` is not the same as leaving it), or `off_flag` where
    the parser names the other side otherwise (0.33's `--enable-x` / `--disable-x`). "argv" (a
    flag that takes several words) is split like a shell line. `in_key` marks
    flags that change what torch.compile, Inductor, Triton or the CUDA graphs produce.
    `default` is the value used when the variable is unset (text, parsed like a set value);
    `shown` is what the reference prints instead, where the default is not a plain value.
    """

    env: str
    kind: Kind
    doc: str
    flag: str | None = None
    off_flag: str | None = None  # pair_bool: the flag for false, where it is not `--no-<flag>`
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
