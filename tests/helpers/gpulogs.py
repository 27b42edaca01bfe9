"""CUDA vLLM 0.33.0 boot logs, written from vLLM's own format strings (warmstart.vllm.logformats).

No GPU run exists yet, so these are illustrations, not measurements: every marker line is
`spec.fmt % args` with a format string that tests/vllm/test_logformats.py checks against
vLLM's source, and the order of the lines follows the 0.33.0 code paths:

  API server -> EngineCore "Initializing a V1 LLM engine" -> worker loads the model (V2 runner:
  "Loading model from scratch...") -> determine_available_memory (start-up plan applied?) ->
  profile_run, whose first forward compiles (AOT load / compile / save) -> "Available KV cache
  memory" -> "GPU KV cache size" -> compile_or_warm_up_model: JIT kernel warm-up, FlashInfer
  autotune, CUDA graph capture, start-up plan saved -> "init engine ... took" -> API server up.

`python tests/helpers/gpulogs.py` rewrites tests/fixtures/gpu-0.33-*.log; a test checks that the
files equal what this module produces, so they cannot drift from the format strings.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

from warmstart.vllm.logformats import MarkerSpec, log_format

CUDA = log_format("0.33.0", "cuda")
assert CUDA is not None
BASE = datetime(2026, 12, 1, 10, 0, 0)
SNAPSHOT = "/root/.cache/warmstart/models/Qwen--Qwen3-8B/b968826d9c46dd6066d109eabc6255188de91218"
CACHE = "/tmp/warmstart/keys/qwen3-8b--b968826d--h200-sm90x1--vllm-0.33.0--1a2b3c4d5e/cache/vllm"
AOT_HASH = "0f3a9c1b2d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"
AOT = f"{CACHE}/torch_compile_cache/torch_aot_compile/{AOT_HASH}/rank_0_0/model"
PLAN = f"{CACHE}/startup_plan/startup_plan_5e0c1d2a3b4f.json"
AUTOTUNE = f"{CACHE}/flashinfer_autotune_cache/0.7.2.post1/90a/6b1f0c2d/autotune_configs_dp0_rank0.json"
BK = "[backbone] "

# Where each marker is printed in 0.33.0: (process, basename:line) for the vLLM log prefix.
WHERE = {
    "engine_init": ("EngineCore pid=200", "core.py:140"),
    "load_start": ("Worker pid=300", "model_runner.py:399"),
    "weights_loaded": ("Worker pid=300", "default_loader.py:507"),
    "model_loaded": ("Worker pid=300", "model_runner.py:429"),
    "compile_cache_dir": ("Worker pid=300", "backends.py:1126"),
    "compile_start": ("Worker pid=300", "monitor.py:40"),
    "dynamo": ("Worker pid=300", "backends.py:1188"),
    "graph_compiled": ("Worker pid=300", "backends.py:418"),
    "graph_loaded": ("Worker pid=300", "backends.py:311"),
    "aot_loaded": ("Worker pid=300", "decorators.py:326"),
    "aot_load_failed": ("Worker pid=300", "decorators.py:340"),
    "aot_saved": ("Worker pid=300", "decorators.py:752"),
    "aot_save_failed": ("Worker pid=300", "decorators.py:758"),
    "compile_total": ("Worker pid=300", "monitor.py:62"),
    "compile_total_with_warmup": ("Worker pid=300", "monitor.py:62"),
    "profile_run": ("Worker pid=300", "monitor.py:91"),
    "plan_applied": ("Worker pid=300", "startup_plan.py:153"),
    "plan_saved": ("Worker pid=300", "startup_plan.py:189"),
    "kv_profiling_skipped": ("Worker pid=300", "gpu_worker.py:676"),
    "kv_available": ("Worker pid=300", "gpu_worker.py:773"),
    "kv_size": ("EngineCore pid=200", "kv_cache_utils.py:1147"),
    "jit_warmup_start": ("Worker pid=300", "kernel_warmup.py:179"),
    "jit_warmup_done": ("Worker pid=300", "kernel_warmup.py:192"),
    "autotune_start": ("Worker pid=300", "kernel_warmup.py:496"),
    "autotune_run": ("Worker pid=300", "kernel_warmup.py:371"),
    "graph_capture": ("Worker pid=300", "model_runner.py:1164"),
    "engine_args": ("APIServer pid=100", "startup.py:96"),
    "init_engine": ("EngineCore pid=200", "core.py:412"),
    "init_engine_compiled": ("EngineCore pid=200", "core.py:405"),
    "init_engine_mm": ("EngineCore pid=200", "core.py:395"),
    "server_start": ("APIServer pid=100", "entry.py:139"),
}
WARNINGS = {"aot_load_failed", "aot_save_failed"}


def spec(name: str, contains: str = "") -> MarkerSpec:
    for s in CUDA.markers:
        if s.name == name and contains in s.fmt:
            return s
    raise KeyError(name)


def line(t: float, name: str, *args: object, contains: str = "") -> str:
    s = spec(name, contains)
    if name == "app_ready":
        return "INFO:     " + s.fmt
    if name == "kv_profiling_skipped":  # an f-string in gpu_worker.py; the spec holds its fixed middle
        message = f"Initial free memory 139.20 GiB, reserved {args[0]} GiB memory for {s.fmt}. This does not respect"
        message += " the gpu_memory_utilization config."
    else:
        message = s.fmt % args
    proc, where = WHERE[name]
    level = "WARNING" if name in WARNINGS else "INFO"
    stamp = (BASE + timedelta(seconds=t)).strftime("%m-%d %H:%M:%S")
    return f"({proc}) {level} {stamp} [{where}] {message}"


def head(t_init: float = 18) -> list[str]:
    return [
        "(APIServer pid=100) INFO 12-01 10:00:00 [api_utils.py:286] non-default args: "
        f"{{'model': '{SNAPSHOT}', 'served_model_name': ['Qwen/Qwen3-8B'], 'max_model_len': 40960}}",
        line(t_init, "engine_init", "0.33.0", f"model='{SNAPSHOT}', speculative_config=None"),
    ]


def load(t0: float, weights: float, total: float) -> list[str]:
    return [
        line(t0, "load_start", contains="scratch"),
        line(t0 + weights + 0.4, "weights_loaded", weights),
        line(t0 + total + 0.6, "model_loaded", "15.27", total),
    ]


def tail(t: float, took: float, compiled: float | None) -> list[str]:
    init = line(t, "init_engine_compiled", took, compiled) if compiled else line(t, "init_engine", took)
    return [
        init,
        line(t + 2, "server_start", "http://127.0.0.1:8000"),
        line(t + 3, "app_ready"),
    ]


def kv(t: float) -> list[str]:
    return [
        line(t, "kv_available", "98.12"),
        line(t + 1, "kv_size", "GPU", "714,432", "40,960", 17.44),
    ]


def aot_cold() -> list[str]:
    """AOT on (the default with torch >= 2.10), nothing cached: compile, save, profile, autotune, capture."""
    return [
        *head(),
        *load(30, 32.41, 33.91),
        line(66, "compile_cache_dir", BK, f"{CACHE}/torch_compile_cache/1a2b3c4d5e/rank_0_0/backbone"),
        line(66, "compile_start", BK),
        line(76, "dynamo", BK, 9.84),
        line(157, "graph_compiled", BK, "(1, 8192)", 80.92),
        line(158, "aot_saved", BK, AOT),
        line(158, "compile_total", BK, 92.11),
        line(161, "profile_run", BK, 2.71),
        *kv(170),
        line(173, "jit_warmup_start"),
        line(175, "jit_warmup_done", 1.52),
        line(176, "autotune_start", AUTOTUNE, contains="cache file"),
        line(176, "autotune_run", 8192, "(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)"),
        line(213, "graph_capture", 28, 0.85),
        line(214, "plan_saved", PLAN),
        *tail(215, 149.10, 92.11),
    ]


def aot_warm() -> list[str]:
    """AOT on, everything cached: plan applied, AOT artifact loaded, autotune file loaded."""
    return [
        *head(17),
        *load(28, 11.20, 12.40),
        line(41, "plan_applied", "5e0c1d2a3b4f", 105358032896, 98.12, 139.20, 139.20),
        line(44, "aot_loaded", BK, AOT),
        line(44, "compile_total", BK, 2.70),
        line(45, "profile_run", BK, 0.61),
        line(46, "kv_profiling_skipped", "98.12"),
        line(46, "kv_size", "GPU", "714,432", "40,960", 17.44),
        line(47, "jit_warmup_start"),
        line(49, "jit_warmup_done", 1.49),
        line(49, "autotune_start", AUTOTUNE, contains="cache file"),
        line(64, "graph_capture", 14, 0.85),
        *tail(65, 23.10, 2.70),
    ]


def noaot_cold() -> list[str]:
    """VLLM_USE_AOT_COMPILE=0: one figure for compile and the first profiling run."""
    return [
        *head(),
        *load(30, 32.41, 33.91),
        line(66, "compile_cache_dir", BK, f"{CACHE}/torch_compile_cache/1a2b3c4d5e/rank_0_0/backbone"),
        line(66, "compile_start", BK),
        line(76, "dynamo", BK, 9.84),
        line(157, "graph_compiled", BK, "(1, 8192)", 80.92),
        line(160, "compile_total_with_warmup", BK, 94.05),
        *kv(169),
        line(172, "jit_warmup_start"),
        line(174, "jit_warmup_done", 1.52),
        line(202, "graph_capture", 28, 0.85),
        *tail(203, 137.10, 94.05),
    ]


def noaot_warm() -> list[str]:
    """VLLM_USE_AOT_COMPILE=0 with the compile cache present: graphs loaded, not compiled."""
    return [
        *head(19),
        *load(30, 11.20, 12.40),
        line(44, "compile_cache_dir", BK, f"{CACHE}/torch_compile_cache/1a2b3c4d5e/rank_0_0/backbone"),
        line(44, "compile_start", BK),
        line(47, "dynamo", BK, 3.01),
        line(49, "graph_loaded", BK, "(1, 8192)", 2.104),
        line(50, "compile_total_with_warmup", BK, 6.02),
        *kv(57),
        line(59, "jit_warmup_start"),
        line(61, "jit_warmup_done", 1.50),
        line(75, "graph_capture", 14, 0.85),
        *tail(76, 32.20, 6.02),
    ]


def _compile_with_fault(fault_first: bool, fault: str) -> list[str]:
    """A cold AOT compile with one of vLLM's two AOT warnings: a load failure before, a save failure after."""
    return [
        *head(),
        *load(30, 11.20, 12.40),
        *([fault] if fault_first else []),
        line(44, "compile_start", BK),
        line(54, "dynamo", BK, 9.00),
        line(124, "graph_compiled", BK, "(1, 8192)", 70.00),
        *([] if fault_first else [fault]),
        *([line(126, "aot_saved", BK, AOT)] if fault_first else []),
        line(126, "compile_total", BK, 81.50),
        line(128, "profile_run", BK, 2.02),
        *kv(134),
        line(162, "graph_capture", 27, 0.85),
        *tail(163, 118.40, 81.50),
    ]


def aot_load_failure() -> list[str]:
    """An AOT artifact that does not load: vLLM warns, compiles again and saves anew."""
    return _compile_with_fault(True, line(44, "aot_load_failed", BK, AOT, "Compile cache file corrupted."))


def aot_save_failure() -> list[str]:
    """A compile whose artifact cannot be written: this boot is cold, and so will the next be."""
    return _compile_with_fault(False, line(126, "aot_save_failed", BK, AOT, "[Errno 28] No space left on device"))


def multimodal() -> list[str]:
    """A vision-language model: the encoder and the language model compile separately."""
    enc = "[encoder] "
    return [
        *head(),
        *load(30, 20.10, 21.30),
        line(53, "compile_start", enc),
        line(56, "dynamo", enc, 2.50),
        line(66, "graph_compiled", enc, "(1, 16384)", 9.80),
        line(67, "aot_saved", enc, AOT.replace("rank_0_0/model", "rank_0_0/encoder")),
        line(67, "compile_total", enc, 14.00),
        line(67, "compile_start", BK),
        line(76, "dynamo", BK, 8.90),
        line(145, "graph_compiled", BK, "(1, 8192)", 68.70),
        line(147, "aot_saved", BK, AOT),
        line(147, "compile_total", BK, 80.00),
        line(149, "profile_run", BK, 1.80),
        *kv(156),
        line(186, "graph_capture", 29, 0.91),
        line(
            187,
            "init_engine_mm",
            150.00,
            94.00,
            80.00,
            14.00,
        ),
        line(189, "server_start", "http://127.0.0.1:8000"),
        line(190, "app_ready"),
    ]


# str(VllmConfig) of vLLM 0.33.0 for the tiny model on an H200 profile, fitted to MAX_CONCURRENCY=30, as
# `warmstart-dev bench capture` computes it with vLLM's own code (its `config_line_fitted_30`).
FITTED_CONFIG = Path(__file__).resolve().parent.parent / "fixtures" / "gpu-0.33-h200-fitted-30.config"


def bar(desc: str, graphs: int, seconds: int) -> str:
    """A finished tqdm bar as it reaches a log (tqdm's default 10-cell bar when the output is not a terminal)."""
    return f"{desc}: 100%|{'█' * 10}| {graphs}/{graphs} [00:{seconds:02d}<00:00, {graphs / max(seconds, 1):5.2f}it/s]"


def fitted_capture() -> list[str]:
    """AOT cold, fitted to MAX_CONCURRENCY=30 (`--max-num-seqs 30`), V2 runner: 11 capture sizes. With no
    start-up plan yet, vLLM captures once to profile graph memory (every PIECEWISE graph, two FULL ones:
    v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory) and then for real, after the KV cache."""
    config = FITTED_CONFIG.read_text().strip().replace("{model}", SNAPSHOT)
    desc = "Capturing CUDA graphs"  # v1/worker/gpu/cudagraph_utils.py, with f" ({mode.name})"
    return [
        line(
            0, "engine_args", f"{{'model': '{SNAPSHOT}', 'served_model_name': ['Qwen/Qwen3-8B'], 'max_num_seqs': 30}}"
        ),
        line(18, "engine_init", "0.33.0", config),
        *load(30, 32.41, 33.91),
        line(66, "compile_cache_dir", BK, f"{CACHE}/torch_compile_cache/1a2b3c4d5e/rank_0_0/backbone"),
        line(66, "compile_start", BK),
        line(76, "dynamo", BK, 9.84),
        line(157, "graph_compiled", BK, "(1, 8192)", 80.92),
        line(158, "aot_saved", BK, AOT),
        line(158, "compile_total", BK, 92.11),
        line(161, "profile_run", BK, 2.71),
        bar(f"{desc} (PIECEWISE)", 11, 2),
        bar(f"{desc} (FULL)", 2, 0),
        line(164, "graph_capture", 2, 0.31),
        *kv(170),
        line(173, "jit_warmup_start"),
        line(175, "jit_warmup_done", 1.52),
        line(176, "autotune_start", AUTOTUNE, contains="cache file"),
        line(176, "autotune_run", 8192, "(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)"),
        bar(f"{desc} (PIECEWISE)", 11, 2),
        bar(f"{desc} (FULL)", 7, 1),
        line(183, "graph_capture", 3, 0.35),
        line(184, "plan_saved", PLAN),
        *tail(185, 119.10, 92.11),
    ]


SCENARIOS = {
    "gpu-0.33-aot-cold.log": aot_cold,
    "gpu-0.33-aot-warm.log": aot_warm,
    "gpu-0.33-noaot-cold.log": noaot_cold,
    "gpu-0.33-noaot-warm.log": noaot_warm,
    "gpu-0.33-aot-load-failure.log": aot_load_failure,
    "gpu-0.33-aot-save-failure.log": aot_save_failure,
    "gpu-0.33-multimodal.log": multimodal,
    "gpu-0.33-fitted-capture.log": fitted_capture,
}


def render(name: str) -> str:
    return "\n".join(SCENARIOS[name]()) + "\n"


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "fixtures")
    for fixture in SCENARIOS:
        (out / fixture).write_text(render(fixture))
        print(out / fixture)
