"""Silences: time in a boot's log that no line explains, found where vLLM's code says every step prints.

phases.py counts each second of a boot in one phase. A phase that spans two markers (the KV cache's, from the end
of loading to "init engine ... took") would otherwise take whatever passes between them, including minutes in
which the log says nothing: a report would then claim four minutes of KV-cache work that the log never showed.
Such a stretch is its own phase, `unlogged`, with its interval and the lines that bound it; what vLLM's code
runs there for the logged configuration is named as `likely`, a lead for a person that no verdict rests on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol

from .logformats import AFTER_CAPTURE, WORK_BEGINS

Interval = tuple[float, float]


class Evidence(Protocol):
    """What this module reads of phases.LogEvidence (not imported: phases.py imports this module)."""

    lines: list[tuple[float, str]]

    def first(self, *names: str) -> Any: ...

    def last(self, *names: str) -> Any: ...

    def all(self, *names: str) -> list[Any]: ...


def subtract(interval: Interval, taken: list[Interval]) -> list[Interval]:
    """The parts of `interval` not covered by any of `taken`."""
    pieces = [interval]
    for a, b in taken:
        pieces = [p for lo, hi in pieces for p in ((lo, min(hi, a)), (max(lo, b), hi)) if p[1] > p[0]]
    return pieces


# A stretch between two lines that vLLM's clock cannot tell from no time at all. vLLM stamps its lines to the
# second (`%m-%d %H:%M:%S`, truncated) and rounds "Graph capturing finished in %.0f secs", so a stretch that its
# figures and lines fully explain can still show a second uncovered. Measured on the public logs
# (tests/fixtures/real): in the warm-up windows whose every step is logged, no stretch is left uncovered by more
# than 1.0 s (0.4 s with a collector's millisecond stamps); the shortest stretch after which no line says what ran
# is 9 s, the longest 231 s. Twice the clock's resolution separates the two.
SILENCE_S = 2.0


@dataclass(frozen=True)
class Silence:
    """Time between two lines of the warm-up that neither a figure vLLM states nor a line that starts a step
    explains: where it lies, the lines that bound it, and what vLLM's code runs there (`likely`, never a verdict)."""

    start: float
    end: float
    after: str  # the last line before it
    before: str  # the first line after it
    pieces: tuple[Interval, ...]  # the parts no stated figure covers
    likely: str

    @property
    def seconds(self) -> float:
        return sum(hi - lo for lo, hi in self.pieces)

    def as_dict(self) -> dict[str, Any]:
        return {
            "from_s": round(self.start, 3),
            "to_s": round(self.end, 3),
            "seconds": round(self.seconds, 3),
            "after": self.after,
            "before": self.before,
            "likely": self.likely,
        }


def _config_flag(ev: Evidence, name: str) -> str | None:
    """A field of the engine's config line (`Initializing a V1 LLM engine (v...) with config: ...`), as printed."""
    engine = ev.first("engine_init")
    m = re.search(rf"\b{name}=([^,)\s]+)", engine.groups[1]) if engine is not None and len(engine.groups) > 1 else None
    return m.group(1) if m else None


def _platform(ev: Evidence) -> str | None:
    """ "cpu" or "cuda" as the log states it (the config line's device, the KV cache line's), else None."""
    engine = ev.first("engine_init")
    config = engine.groups[1] if engine is not None and len(engine.groups) > 1 else ""
    kv = ev.first("kv_size")
    kind = kv.groups[0].strip().split()[-1] if kv is not None and kv.groups and kv.groups[0].strip() else ""
    if "device_config=cpu" in config or kind == "CPU" or ev.first("cpu_warmup_start") is not None:
        return "cpu"
    if "device_config=cuda" in config or kind == "GPU" or ev.first("graph_capture", "capture_bar") is not None:
        return "cuda"
    return None


def _likely(ev: Evidence, start: float) -> str:
    """What vLLM 0.33's CUDA warm-up (v1/worker/gpu_worker.py compile_or_warm_up_model) runs at this point, for
    the configuration the log shows: a lead for a person, which no verdict rests on. Only for a log of that
    release and platform (or a CUDA fragment that names no release, said so): another release's or the CPU's
    code was not read for it, so nothing is named there."""
    engine = ev.first("engine_init")
    version = engine.groups[0] if engine is not None and engine.groups else None
    platform = _platform(ev)
    if platform != "cuda" or (version and not version.startswith("0.33")):
        return (
            f"nothing named: what vLLM {version or '(release not in the log)'} on {platform or 'an unknown platform'} "
            "runs here was not read from its code (the leads are read from vLLM 0.33's CUDA warm-up only)"
        )
    source = "vLLM 0.33's code" + ("" if version else " (the log names no release)")
    captured = any(m.t is not None and m.t <= start for m in ev.all("graph_capture"))
    if captured or any(t <= start and AFTER_CAPTURE.search(text) for t, text in ev.lines):
        return (
            f"after CUDA graph capture, {source} ends the warm-up without a line (v1/worker/gpu_worker.py "
            "compile_or_warm_up_model): the V1 runner's sampler warm-up (`_dummy_sampler_run`) and Inductor's "
            "lazy initialisation (`trigger_inductor_lazy_init`, with a compile mode and the inductor backend)"
        )
    steps = "JIT kernels, DeepGEMM, model-specific Triton kernels"
    autotune = _config_flag(ev, "enable_flashinfer_autotune")
    if autotune == "True":
        steps += (
            ", FlashInfer autotune (`enable_flashinfer_autotune=True` in the engine's config line; it runs on GPUs "
            "of compute capability 9.0 and newer)"
        )
    elif autotune is None:
        steps += ", FlashInfer autotune where enabled (no config line in the log says whether it was)"
    return (
        f"before CUDA graph capture, {source} warms up kernels here (model_executor/warmup/kernel_warmup.py "
        f"kernel_warmup: {steps})"
    )


def silences(ev: Evidence, timed: list[Interval]) -> list[Silence]:
    """Silences of the warm-up: from the KV cache's size to "init engine ... took" vLLM sizes and allocates
    nothing more, then warms up and captures (v1/engine/core.py `_initialize_kv_caches` ->
    v1/worker/gpu_worker.py compile_or_warm_up_model), and each of those steps prints a line or a figure
    (logformats.py). A stretch longer than SILENCE_S between two lines there, less what a figure vLLM states
    covers (`timed`), is time the log does not explain, unless the line before it starts a step (WORK_BEGINS).

    The window before it is memory profiling, which is silent by nature and which the KV-cache lines report."""
    kv = ev.last("kv_size", "kv_available")
    end = ev.last("init_engine", "init_engine_compiled", "init_engine_mm")
    if kv is None or end is None or kv.t is None or end.t is None or end.t <= kv.t:
        return []
    window = [(t, text) for t, text in ev.lines if kv.t <= t <= end.t]
    found = []
    for (t0, after), (t1, before) in pairwise(window):
        if t1 - t0 <= SILENCE_S or WORK_BEGINS.search(after):
            continue
        pieces = tuple(subtract((t0, t1), timed))
        if sum(hi - lo for lo, hi in pieces) > SILENCE_S:
            found.append(Silence(t0, t1, after, before, pieces, _likely(ev, t0)))
    return found


def describe(silence: dict[str, Any]) -> str:
    """The report's line for one silence (`Silence.as_dict()`)."""
    return (
        f"unlogged {silence['seconds']:.1f} s: no line between {silence['after'][-90:]!r} and "
        f"{silence['before'][-90:]!r}; likely {silence['likely']}"
    )
