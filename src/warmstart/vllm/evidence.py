"""Evidence: vLLM's log markers and what each cache directory gained -> a BootReport.

Two independent witnesses decide whether a cache hit. vLLM's log lines say what its
compile cache did (load, compile, load failure with a reason); the cache directories
say what every layer gained during the boot (a layer that had files and gained none
was reused; one that gained files compiled something). Where vLLM prints nothing (the
CPU build compiles through stock Inductor), the directories decide alone.

Phases come from marker times. In a live boot each line is stamped when it arrives
(sub-second); in a saved log only vLLM's own one-second timestamps exist, so durations
that vLLM reports itself ("Loading weights took 1.23 seconds") are preferred there.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

PHASES = (
    "resolve",
    "restore",
    "bootstrap",
    "tokenizer",
    "weights",
    "compile",
    "kv_cache",
    "cudagraph",
    "api_ready",
    "publish",
)
LAYERS = ("vllm_compile", "inductor", "triton", "cuda", "flashinfer", "deep_gemm", "hf_weights")
STATUSES = ("hit", "miss", "load_failed", "unused")
VERDICTS = ("warm", "partial", "cold")

_NUM = r"([0-9]+(?:\.[0-9]+)?)"

# Marker name -> pattern. Formats of vLLM 0.32 (CPU) and 0.33 (CUDA); see FIELD-NOTES.
MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("engine_init", r"Initializing a V1 LLM engine \(v([^)\s]+)\)"),
        ("load_start", r"Starting to load model "),
        ("weights_loaded", rf"Loading weights took {_NUM} seconds"),
        ("model_loaded", rf"Model loading took {_NUM} ?GiB memory and {_NUM} seconds"),
        ("compile_cache_dir", r"Using cache directory: (\S+) for vLLM's torch\.compile"),
        ("compile_cache_disabled", r"vLLM's torch\.compile cache is disabled"),
        ("dynamo", rf"Dynamo bytecode transform time: {_NUM} s"),
        ("graph_compiled", rf"Compiling a graph for compile range (.+?) takes {_NUM} s"),
        (
            "graph_loaded",
            rf"Directly load the compiled graph\(s\) for compile range (.+?) from the cache, took {_NUM} s",
        ),
        ("aot_loaded", r"Directly load AOT compilation from path (\S+)"),
        ("aot_saved", r"saved AOT compiled function to (\S+)"),
        ("aot_load_failed", r"Compiling model again due to a load failure from (\S+), reason: (.*)$"),
        ("compile_total", rf"torch\.compile (?:took|takes) {_NUM} s in total"),
        ("cpu_warmup_start", r"Warming up model for the compilation"),
        ("cpu_warmup_done", r"Warming up done\."),
        ("kv_available", rf"Available KV cache memory: {_NUM} GiB"),
        ("kv_size", r"(GPU|CPU) KV cache size: ([0-9,]+) tokens"),
        ("graph_capture", rf"Graph capturing finished in {_NUM} secs?, took {_NUM} GiB"),
        ("jit_warmup", rf"JIT kernel warmup finished in {_NUM} ?s"),
        (
            "init_engine",
            rf"init engine \(profile, create kv cache, warmup model\) took {_NUM} s(?: \(compilation: {_NUM} s\))?",
        ),
        ("server_start", r"Starting vLLM server on (\S+)"),
        ("app_ready", r"Application startup complete"),
        ("hub_id_rewritten", r"HF_HUB_OFFLINE is True, replace model_id \[([^\]]*)\] to model_path \[([^\]]*)\]"),
    )
)

_TIMESTAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?")


@dataclass(frozen=True)
class Marker:
    """One recognised log line: its name, when it arrived (s from engine start), its captures."""

    name: str
    t: float | None
    groups: tuple[str, ...]

    def num(self, index: int = 0) -> float | None:
        try:
            return float(self.groups[index].replace(",", ""))
        except (IndexError, ValueError, AttributeError):
            return None


def match_markers(line: str) -> list[tuple[str, tuple[str, ...]]]:
    found = []
    for name, pattern in MARKERS:
        m = pattern.search(line)
        if m:
            found.append((name, tuple(g or "" for g in m.groups())))
    return found


def log_timestamp(line: str, year: int) -> datetime | None:
    m = _TIMESTAMP.search(line)
    if not m:
        return None
    month, day, hour, minute, second, frac = m.groups()
    try:
        micro = int((frac or "0")[:6].ljust(6, "0"))
        return datetime(year, int(month), int(day), int(hour), int(minute), int(second), micro)
    except ValueError:
        return None


@dataclass
class LogEvidence:
    """Markers collected from vLLM's output, in arrival order."""

    markers: list[Marker] = field(default_factory=list)
    precise: bool = True  # True: stamped on arrival; False: vLLM's one-second stamps

    def feed(self, line: str, t: float | None) -> list[Marker]:
        new = [Marker(name, t, groups) for name, groups in match_markers(line)]
        self.markers.extend(new)
        return new

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

    def all(self, name: str) -> list[Marker]:
        return [m for m in self.markers if m.name == name]

    @classmethod
    def from_log(cls, lines: Iterable[str], year: int | None = None) -> tuple[LogEvidence, float | None]:
        """Parse a saved log. Times are seconds since its first timestamp; returns (evidence, span)."""
        year = year or datetime.now().year
        evidence = cls(precise=False)
        start: datetime | None = None
        last_t: float | None = None
        for line in lines:
            stamp = log_timestamp(line, year)
            if stamp is not None:
                start = start or stamp
                last_t = (stamp - start).total_seconds()
            evidence.feed(line, last_t)
        return evidence, last_t


# --------------------------------------------------------------------------- phases


def _span(start: Marker | None, end: Marker | None) -> float | None:
    if start is None or end is None or start.t is None or end.t is None:
        return None
    return max(0.0, end.t - start.t)


def _pick(precise: bool, measured: float | None, reported: float | None) -> float | None:
    """Arrival times beat vLLM's own figures in a live boot; one-second stamps lose to them."""
    if precise:
        return measured if measured is not None else reported
    return reported if reported is not None else measured


def compute_phases(
    ev: LogEvidence,
    *,
    ready_t: float | None,
    resolve_s: float | None = None,
    restore_s: float | None = None,
    publish_s: float | None = None,
) -> dict[str, float | None]:
    """Seconds per boot phase, or None where the log holds no marker for it.

    bootstrap: engine start -> "Starting to load model" (imports, config, engine-core and
               worker processes; "Initializing a V1 LLM engine" if loading never started)
    tokenizer: vLLM logs no marker for it; None
    weights:   "Starting to load model" -> "Model loading took" / "Loading weights took"
    compile:   "torch.compile took N s in total" (CUDA), else the CPU warm-up span
    kv_cache:  end of compile -> "init engine ... took", less graph capture and JIT warm-up
               (memory profiling and KV cache allocation); "KV cache size" if init never ended
    cudagraph: "Graph capturing finished in N secs"
    api_ready: "init engine ... took" -> ready (/health 200, or "Application startup complete")
    """
    phases: dict[str, float | None] = dict.fromkeys(PHASES)
    phases["resolve"] = resolve_s
    phases["restore"] = restore_s
    phases["publish"] = publish_s

    load_start = ev.first("load_start")
    bootstrap_end = load_start or ev.first("engine_init")
    if bootstrap_end is not None and bootstrap_end.t is not None:
        phases["bootstrap"] = bootstrap_end.t

    model_loaded = ev.first("model_loaded")
    weights_end = model_loaded or ev.first("weights_loaded")
    reported_weights = model_loaded.num(1) if model_loaded else (weights_end.num() if weights_end else None)
    phases["weights"] = _pick(ev.precise, _span(load_start, weights_end), reported_weights)

    total = ev.last("compile_total")
    init_engine = ev.last("init_engine")
    compile_end: Marker | None = None
    if total is not None:
        phases["compile"] = total.num()
        compile_end = total
    elif init_engine is not None and init_engine.groups[1]:
        phases["compile"] = init_engine.num(1)
    else:
        warm_start, warm_done = ev.first("cpu_warmup_start"), ev.first("cpu_warmup_done")
        if warm_done is not None:
            phases["compile"] = _span(warm_start, warm_done)
            compile_end = warm_done
        else:
            pieces = [m.num() for m in ev.all("dynamo")] + [m.num(1) for m in ev.all("graph_compiled")]
            pieces += [m.num(1) for m in ev.all("graph_loaded")]
            values = [p for p in pieces if p is not None]
            phases["compile"] = round(sum(values), 3) if values else None
            compile_end = ev.last("graph_compiled", "graph_loaded", "aot_loaded", "aot_saved")

    capture = ev.first("graph_capture")
    phases["cudagraph"] = capture.num() if capture else None
    jit = ev.first("jit_warmup")
    init_span = _span(compile_end or weights_end, init_engine)
    if init_span is not None:
        after_init = (phases["cudagraph"] or 0.0) + ((jit.num() or 0.0) if jit else 0.0)
        phases["kv_cache"] = max(0.0, init_span - after_init)
    else:
        phases["kv_cache"] = _span(compile_end or weights_end, ev.first("kv_size") or ev.first("kv_available"))

    app = ev.first("app_ready")
    end_t = ready_t if ready_t is not None else (app.t if app else None)
    if init_engine is not None and init_engine.t is not None and end_t is not None:
        phases["api_ready"] = max(0.0, end_t - init_engine.t)

    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in phases.items()}


# --------------------------------------------------------------------------- directories


@dataclass(frozen=True)
class TreeScan:
    """Files under a directory: relative path -> (size, mtime_ns). Unreadable entries are warnings."""

    root: str
    files: Mapping[str, tuple[int, int]]
    warnings: tuple[str, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.files.values())

    def under(self, prefix: str) -> TreeScan:
        prefix = prefix.rstrip("/") + "/"
        return TreeScan(self.root, {k: v for k, v in self.files.items() if k.startswith(prefix)})


def scan_tree(root: Path) -> TreeScan:
    files: dict[str, tuple[int, int]] = {}
    warnings: list[str] = []
    stack = [root]
    base = len(str(root)) + 1
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            st = entry.stat(follow_symlinks=False)
                            files[entry.path[base:]] = (st.st_size, st.st_mtime_ns)
                    except OSError as exc:
                        warnings.append(f"{entry.path}: {exc.strerror or exc}")
        except FileNotFoundError:
            continue
        except OSError as exc:
            warnings.append(f"{current}: {exc.strerror or exc}")
    return TreeScan(str(root), files, tuple(warnings))


@dataclass(frozen=True)
class TreeDelta:
    files_before: int
    bytes_before: int
    files_added: int
    bytes_added: int
    files_changed: int


def tree_delta(before: TreeScan, after: TreeScan) -> TreeDelta:
    added = [k for k in after.files if k not in before.files]
    changed = [k for k in after.files if k in before.files and after.files[k] != before.files[k]]
    return TreeDelta(
        files_before=len(before.files),
        bytes_before=before.bytes,
        files_added=len(added),
        bytes_added=sum(after.files[k][0] for k in added),
        files_changed=len(changed),
    )


# --------------------------------------------------------------------------- cache layers


@dataclass(frozen=True)
class CacheLayer:
    status: str  # hit | miss | load_failed | unused
    files_added: int = 0
    bytes_added: int = 0
    files_before: int = 0
    bytes_before: int = 0
    detail: str = ""
    restored_files: int = 0
    restored_bytes: int = 0
    published_files: int = 0
    published_bytes: int = 0


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _files_status(d: TreeDelta) -> tuple[str, str]:
    if d.files_added:
        where = f" to {d.files_before} present" if d.files_before else ""
        return "miss", f"{d.files_added} files added ({_mb(d.bytes_added)}){where}"
    if d.files_before:
        changed = f", {d.files_changed} rewritten" if d.files_changed else ""
        return "hit", f"{d.files_before} files present ({_mb(d.bytes_before)}), none added{changed}"
    return "unused", "nothing read or written"


COMPILE_SUBDIR = "torch_compile_cache"


def vllm_compile_status(ev: LogEvidence, delta: TreeDelta | None, compile_delta: TreeDelta | None) -> tuple[str, str]:
    """vLLM's compile cache: its log lines decide; its torch_compile_cache tree when it is silent."""
    failed = ev.first("aot_load_failed")
    if failed is not None:
        return "load_failed", f"AOT artifact failed to load, recompiled: {failed.groups[1].strip()}"
    loaded = ev.all("graph_loaded") + ev.all("aot_loaded")
    compiled = ev.all("graph_compiled") + ev.all("aot_saved")
    if loaded and not compiled:
        what = "AOT artifact" if ev.first("aot_loaded") else f"{len(loaded)} graph(s)"
        return "hit", f"loaded {what} from the cache"
    if compiled:
        extra = f" ({len(loaded)} loaded)" if loaded else ""
        seconds = sum(m.num(1) or 0.0 for m in ev.all("graph_compiled"))
        took = f" in {seconds:.1f} s" if seconds else ""
        return "miss", f"compiled {len(compiled)} graph(s)/artifact(s){took}{extra}"
    if ev.first("compile_cache_disabled"):
        return "unused", "vLLM's torch.compile cache is disabled"
    if compile_delta is not None and (compile_delta.files_added or compile_delta.files_before):
        status, detail = _files_status(compile_delta)
        return status, f"no vLLM compile log lines; {COMPILE_SUBDIR}: {detail}"
    if delta is None:
        return "unused", "no vLLM compile-cache lines in the log (eager, or stock Inductor on CPU)"
    return "unused", "no vLLM compile cache on this platform (compiled through stock Inductor, or eager)"


def layer_statuses(
    ev: LogEvidence, before: Mapping[str, TreeScan], after: Mapping[str, TreeScan]
) -> dict[str, CacheLayer]:
    """Status of every directory-backed layer, from the scans taken before and after the boot."""
    layers: dict[str, CacheLayer] = {}
    for name in LAYERS:
        if name not in before or name not in after:
            continue
        d = tree_delta(before[name], after[name])
        if name == "vllm_compile":
            cd = tree_delta(before[name].under(COMPILE_SUBDIR), after[name].under(COMPILE_SUBDIR))
            status, detail = vllm_compile_status(ev, d, cd)
        else:
            status, detail = _files_status(d)
        layers[name] = CacheLayer(status, d.files_added, d.bytes_added, d.files_before, d.bytes_before, detail)
    return layers


def primary_compile_layer(caches: Mapping[str, CacheLayer]) -> str:
    """vLLM's compile cache where vLLM uses one; Inductor's where it compiles through stock Inductor."""
    vllm = caches.get("vllm_compile")
    if vllm is not None and vllm.status != "unused":
        return "vllm_compile"
    return "inductor"


def decide_verdict(caches: Mapping[str, CacheLayer]) -> str | None:
    """cold: the compile cache missed or failed to load. warm: no layer missed or failed.
    partial: the compile cache hit (or was not used) but another layer missed."""
    if not caches:
        return None
    primary = caches.get(primary_compile_layer(caches))
    if primary is not None and primary.status in ("miss", "load_failed"):
        return "cold"
    if any(c.status in ("miss", "load_failed") for c in caches.values()):
        return "partial"
    return "warm"


# --------------------------------------------------------------------------- why a hit missed


def compile_hashes(vllm_dir: Path) -> dict[str, dict[str, Any]]:
    """vLLM's own compile hash directories under a key, with the factors vLLM recorded."""
    found: dict[str, dict[str, Any]] = {}
    root = vllm_dir / COMPILE_SUBDIR
    try:
        entries = list(os.scandir(root))
    except OSError:
        return found
    for entry in entries:
        if not entry.is_dir() or entry.name == "torch_aot_compile":
            continue
        factors: dict[str, Any] = {}
        meta = Path(entry.path)
        for rank in sorted(meta.glob("rank_*/*/cache_key_factors.json")) + sorted(meta.glob("cache_key_factors.json")):
            try:
                factors = json.loads(rank.read_text())
                break
            except (OSError, ValueError):
                continue
        found[entry.name] = factors
    for entry in sorted((root / "torch_aot_compile").glob("*")):
        if entry.is_dir():
            found[f"aot:{entry.name[:16]}"] = {}
    return found


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(data, list):
        return {prefix: json.dumps(data, sort_keys=True)}
    return {prefix: data}


def differing(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 12) -> list[str]:
    """Human lines naming the factors that differ between two records."""
    a, b = flatten(old), flatten(new)
    lines = []
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            lines.append(f"{name}: {a.get(name)!r} -> {b.get(name)!r}")
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more"]
    return lines


def explain_miss(
    last_good: Mapping[str, Any],
    observed: Mapping[str, Any],
    new_hashes: Mapping[str, Mapping[str, Any]],
    old_hashes: Mapping[str, Mapping[str, Any]],
) -> list[str]:
    """Why a boot that expected a hit missed: recorded factors that differ, else vLLM's own."""
    reasons = [
        f"recorded factor differs from the last good boot ({last_good.get('started_at', '?')}): {line}"
        for line in differing(last_good.get("observed") or {}, observed)
    ]
    added = [h for h in new_hashes if h not in old_hashes]
    if added:
        reasons.append(
            f"vLLM computed a new compile hash {', '.join(added)}; earlier: {', '.join(old_hashes) or 'none'}"
        )
        new_factors = new_hashes[added[0]]
        for old_name, old_factors in old_hashes.items():
            if old_factors and new_factors:
                reasons += [
                    f"vLLM hash factor differs ({old_name} -> {added[0]}): {line}"
                    for line in differing(old_factors, new_factors)
                ]
                break
    if not reasons:
        reasons.append(
            "no recorded factor differs from the last good boot, and vLLM kept its compile hash: "
            "the artifacts were present but not reused (see caches.vllm_compile.detail)"
        )
    return reasons


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class BootReport:
    """Everything one boot proved. `to_dict()` is the JSON line; `lines()` the readable summary."""

    key: str | None
    key_dir: str | None
    expected: str | None
    verdict: str | None
    ready_s: float | None
    phases: Mapping[str, float | None]
    caches: Mapping[str, CacheLayer]
    vllm_version: str | None
    model: Mapping[str, Any] = field(default_factory=dict)
    hardware: Mapping[str, Any] = field(default_factory=dict)
    mode: str | None = None
    on_volume: bool | None = None
    started_at: str | None = None
    boot_id: str | None = None
    miss_reason: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    observed: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    source: str = "boot"  # "boot" or "log"
    staged: Mapping[str, Any] | None = None  # staged mode: generation restored, problems, publish

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["caches"] = {name: asdict(layer) for name, layer in self.caches.items()}
        data["miss_reason"] = list(self.miss_reason)
        data["warnings"] = list(self.warnings)
        accounted = sum(v for k, v in self.phases.items() if v is not None and k != "publish")  # publish: after ready
        data["unaccounted_s"] = round(self.ready_s - accounted, 3) if self.ready_s is not None else None
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False, separators=(",", ":"))

    def lines(self) -> list[str]:
        out = []
        head = f"warmstart | report   | verdict {self.verdict or '?'} (expected {self.expected or '?'})"
        if self.ready_s is not None:
            head += f", ready in {self.ready_s:.1f} s"
        out.append(head + (f", key {self.key}" if self.key else ""))
        phase_text = ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items() if v is not None)
        out.append(f"warmstart | phases   | {phase_text or 'no phase markers found'}")
        for name, layer in self.caches.items():
            out.append(f"warmstart | cache    | {name:<12} {layer.status:<11} {layer.detail}")
        if self.staged is not None:
            restored = self.staged.get("generation_restored")
            line = f"restored generation {restored}" if restored is not None else "nothing restored"
            if restored is not None and self.staged.get("restored_from"):
                line += f" from the {self.staged['restored_from']} store"
            publishes = [("publish", self.staged.get("publish"))]
            if (s3 := self.staged.get("s3")) is not None and s3.get("publish") != self.staged.get("publish"):
                publishes.append(("s3 publish", s3.get("publish")))
            for label, pub in publishes:
                if pub is None:
                    continue
                line += f"; {label} {pub['status']}"
                if pub.get("generation") is not None:
                    line += f" (generation {pub['generation']}, {pub['files']} files)"
            out.append(f"warmstart | staged   | {line}")
        for reason in self.miss_reason:
            out.append(f"warmstart | why miss | {reason}")
        for warning in self.warnings:
            out.append(f"warmstart | warning  | {warning}")
        if self.error:
            out.append(f"warmstart | error    | {self.error}")
        return out


def report_from_log(lines: Iterable[str], year: int | None = None) -> BootReport:
    """What a vLLM log alone proves: phases and the compile cache's status (no directories)."""
    ev, span = LogEvidence.from_log(lines, year)
    phases = compute_phases(ev, ready_t=None)
    status, detail = vllm_compile_status(ev, None, None)
    caches = {"vllm_compile": CacheLayer(status, detail=detail)}
    verdict: str | None
    if status in ("miss", "load_failed"):
        verdict = "cold"
    elif status == "hit":
        verdict = "warm"
    else:
        verdict = None  # stock Inductor on CPU: only the cache directories can tell
    engine = ev.first("engine_init")
    app = ev.first("app_ready")
    return BootReport(
        key=None,
        key_dir=None,
        expected=None,
        verdict=verdict,
        ready_s=app.t if app is not None else None,
        phases=phases,
        caches=caches,
        vllm_version=engine.groups[0] if engine else None,
        warnings=() if span is not None else ("the log holds no vLLM timestamps",),
        source="log",
    )
