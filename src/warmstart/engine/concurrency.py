"""Fit the engine to the worker's concurrency: `--max-num-seqs MAX_CONCURRENCY` unless the user chose.

A Runpod worker never runs more than MAX_CONCURRENCY jobs at once (the SDK's concurrency modifier,
worker/serve.py). vLLM sizes itself for far more: with `max_num_seqs` unset, vLLM 0.33's API server
takes 1024 on a GPU of 70 GiB or more (H100, H200, B200; not an A100 or a GB10) and 256 on smaller ones
(engine/arg_utils.py `get_batch_defaults`, `_set_default_max_num_seqs_and_batched_tokens_args`), and its
CUDA graph sizes follow: the largest is `min(max_num_seqs * decode_query_len * 2, 512)`
(config/vllm.py `_set_cudagraph_sizes`), 51 sizes at 1024, each captured on every boot, warm or not
(graphs are not cached). Given `--max-num-seqs 30`, vLLM itself derives 11 sizes up to 56: 18 graphs
instead of 102 (docs/BENCHMARKS.md, `warmstart-dev bench capture`, computed by vLLM 0.33.0's own code).

Requests with `n > 1`, best_of and beam search, read in vLLM 0.33:
- `n > 1`: the API server fans a request out into n child requests (v1/engine/async_llm.py
  `add_request`, "Fan out child requests (for n>1)"), each its own request in the scheduler, so a job
  with n=4 takes 4 of the max_num_seqs slots.
- beam search (`use_beam_search`): each step issues up to beam-width one-token requests at once
  (entrypoints/generate/beam_search/online.py), so a job takes up to its beam width in slots.
- `best_of`: SamplingParams has no such field in 0.33; the API accepts it (protocol models allow extra
  fields) and nothing reads it: it takes no slot.
A job past max_num_seqs is not refused: the scheduler stops admitting at `max_num_active_reqs`
(= max_num_seqs by default) and the request waits in its waiting queue (v1/core/sched/scheduler.py
"if num_running >= self.max_num_active_reqs: break") until a running one finishes. Only
`max_num_queued_reqs`, unset by default, would refuse (HTTP 503, async_llm.py `check_admission`).
So max_num_seqs = MAX_CONCURRENCY runs every job of an n=1 workload at once and queues the extra
children of n>1 jobs rather than failing them; a workload that sends n>1 jobs at full concurrency
sets MAX_NUM_SEQS itself (MAX_CONCURRENCY times n). Under data parallelism each engine gets
the same value: more than its share of the jobs, never less.

vLLM also caps its default `max_num_batched_tokens` at `max_num_seqs * max_model_len` (the same
function), so a small MAX_CONCURRENCY with a short context lowers the token budget too: vLLM's
rule, not warmstart's; it is what vLLM hashes, and the key follows (key.py reads the argv).

A user's value always wins: MAX_NUM_SEQS, `--max-num-seqs` in VLLM_EXTRA_ARGS (any spelling vLLM's
parser takes: `--max_num_seqs`, `=value`, an unambiguous prefix), capture sizes in COMPILATION_CONFIG or
`-cc`/`--compilation-config` (JSON or dotted `-cc.cudagraph_capture_sizes`), `--cudagraph-capture-sizes`,
`--max-cudagraph-capture-size` (or their variables); and a `--config FILE` in VLLM_EXTRA_ARGS (vLLM reads
flags from it, below the command line, so a fitted flag would override it), or one of these in
VLLM_CONFIG_FILE, which warmstart reads as vLLM does (vllm/configfile.py). `WARMSTART_FIT_CONCURRENCY=0`
turns the fit off.

Pure functions from settings to argv; tests/vllm/test_concurrency.py checks every combination.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..settings import Settings
from ..vllm.argv import parse_argv
from ..vllm.flagtypes import FLAGS

SEQS_DEST = "max_num_seqs"
CAPTURE_DESTS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size")
COMPILATION_DEST = "compilation_config"
CONFIG_FILE_DEST = "config"


@dataclass(frozen=True)
class ConcurrencyFit:
    """The fit's decision: the value warmstart gives vLLM (None: the user's or vLLM's), and why."""

    max_num_seqs: int | None
    reason: str

    @property
    def args(self) -> list[str]:
        return [] if self.max_num_seqs is None else ["--max-num-seqs", str(self.max_num_seqs)]


def dest_as_vllm_reads(flag: str) -> tuple[str | None, str]:
    """(dest, dotted key) of an option as vLLM 0.33's FlexibleArgumentParser reads it, or (None, ...).

    utils/argparse_utils.py `parse_args`: underscores become dashes between `--` and the first `.`;
    `-cc.a.b v` / `--compilation-config.a.b=v` set key `a.b` of that JSON option. argparse then takes an
    unambiguous prefix of a long option (FlexibleArgumentParser keeps `allow_abbrev`)."""
    name, dot, key = flag.partition(".")
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    key = key.removesuffix("+") if dot else ""
    if name in FLAGS:
        return FLAGS[name][0], key
    dests = {row[0] for option, row in FLAGS.items() if name.startswith("--") and option.startswith(name)}
    return (dests.pop() if len(dests) == 1 else None), key


def _json_sets_capture(text: str | None) -> bool:
    try:
        value: Any = json.loads(text or "")
    except ValueError:
        return False
    return isinstance(value, dict) and any(k in value for k in CAPTURE_DESTS)


def user_choice(engine: Mapping[str, str], extra_args: Iterable[str], config_args: Iterable[str] = ()) -> str | None:
    """What the user set that the fit must leave alone, in words; None when they set nothing of it.
    `config_args`: the flags VLLM_CONFIG_FILE stands for (a fitted flag on the command line would beat them)."""
    if "MAX_NUM_SEQS" in engine:
        return f"MAX_NUM_SEQS={engine['MAX_NUM_SEQS']}"
    if _json_sets_capture(engine.get("COMPILATION_CONFIG")):
        return "COMPILATION_CONFIG sets CUDA graph capture sizes"
    for name in (dest.upper() for dest in CAPTURE_DESTS):  # their variables (engineflags.derived_flags)
        if name in engine:
            return f"{name}={engine[name]}"
    return _argv_choice(extra_args, "VLLM_EXTRA_ARGS") or _argv_choice(config_args, "VLLM_CONFIG_FILE")


def _argv_choice(argv: Iterable[str], source: str) -> str | None:
    for o in parse_argv(tuple(argv)):
        if o.flag is None:
            continue
        dest, key = dest_as_vllm_reads(o.flag)
        if dest == SEQS_DEST and not key:
            return f"{source} gives {o.written}"
        if dest in CAPTURE_DESTS and not key:
            return f"{source} gives {o.written}"
        if dest == COMPILATION_DEST and (key.split(".")[0] in CAPTURE_DESTS if key else _json_sets_capture(o.value)):
            return f"{source} sets CUDA graph capture sizes ({o.written})"
        if dest == CONFIG_FILE_DEST:
            return f"{source} gives {o.written} {o.value or ''} (vLLM ranks the command line above the file)"
    return None


def fit_concurrency(settings: Settings) -> ConcurrencyFit:
    """The fit for these settings: `--max-num-seqs MAX_CONCURRENCY`, or nothing and why."""
    if not settings.fit_concurrency:
        return ConcurrencyFit(None, "WARMSTART_FIT_CONCURRENCY=0: max_num_seqs left to vLLM")
    chosen = user_choice(settings.engine, settings.extra_args, settings.config_args)
    if chosen is not None:
        return ConcurrencyFit(None, f"{chosen}: not fitted to MAX_CONCURRENCY")
    n = settings.max_concurrency
    return ConcurrencyFit(n, f"max_num_seqs {n} fitted to MAX_CONCURRENCY={n}")


def vllm_default_words(kind: str, world_size: int = 1) -> str:
    """vLLM's own default max_num_seqs for the API server, as far as warmstart can know it (it does not
    read GPU memory): engine/arg_utils.py `get_batch_defaults`, the same rule from 0.27.1 to 0.33.0 but
    0.33's GB10 exception. On the CPU, 128 per TP x PP rank."""
    if kind == "cpu":
        return "vLLM's default here would be " + ("128" if world_size <= 1 else "128 x TP x PP")
    return "vLLM's default would be 1024 on a GPU of 70 GiB or more (not an A100), 256 on others"


def fit_words(fit: ConcurrencyFit, kind: str, world_size: int = 1) -> str:
    """The engine stage's words on the fit: what warmstart chose and why, or why it chose nothing."""
    if fit.max_num_seqs is None:
        return fit.reason
    return f"{fit.reason} ({vllm_default_words(kind, world_size)})"
