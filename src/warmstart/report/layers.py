"""Evidence: vLLM's log markers and what each cache directory gained -> a BootReport.

Two independent witnesses decide whether a cache hit. vLLM's log lines say what its
compile cache did (load, compile, load failure with a reason); the cache directories
say what every layer gained during the boot (a layer that had files and gained none
was reused; one that gained files compiled something). Where vLLM prints nothing (the
CPU build compiles through stock Inductor), the directories decide alone.

The markers are data (logformats.py, one table per vLLM build); where each second went is
phases.py. This module turns both, with the directory scans, into the BootReport.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import log
from ..key import factor_diff
from ..tree import TreeDelta, TreeScan, tree_delta
from ..vllm.cudagraphs import capture_summary
from ..vllm.logread import compile_silence, compile_unknown, compiled_while_serving, flashinfer_own_status, log_warnings
from ..vllm.phases import LogEvidence, compute_phases, earliest, phase_details
from ..vllm.releases import release_note
from ..vllm.silences import describe
from ..weights import describe as weights_line

# Report layers. VLLM_CACHE_ROOT is one directory but holds several caches (VLLM_ROOT_PARTS);
# each is reported on its own so a layer is never `unused` while files were added to it.
LAYERS = (
    "vllm_compile",
    "startup_plan",
    "modelinfos",
    "vllm_other",
    "inductor",
    "triton",
    "cuda",
    "flashinfer",
    "flashinfer_autotune",
    "deep_gemm",
    "cute_dsl",
    "tilelang",
    "quack",
    "humming",
    "tvm_ffi",
    "torch_extensions",
    "hf_weights",
)
STATUSES = ("hit", "miss", "load_failed", "unused", "unknown")  # unknown: lines present that no table reads
VERDICTS = ("warm", "partial", "cold")

COMPILE_SUBDIR = "torch_compile_cache"
# Report layer -> its subdirectory of VLLM_CACHE_ROOT, in vLLM 0.33:
VLLM_ROOT_PARTS = {
    "vllm_compile": COMPILE_SUBDIR,  # compilation/backends.py, compilation/decorators.py
    "startup_plan": "startup_plan",  # v1/worker/startup_plan.py (_plan_path)
    "modelinfos": "modelinfos",  # model_executor/models/registry.py (_get_cache_dir)
}
# Small records that save seconds at most: reported, but they do not move the verdict.
INFORMATIONAL_LAYERS = frozenset({"modelinfos", "vllm_other"})
# Caches that most models never touch: listed only when they hold files.
QUIET_WHEN_UNUSED = INFORMATIONAL_LAYERS | {"cute_dsl", "tilelang", "quack", "humming", "tvm_ffi", "torch_extensions"}


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


def vllm_compile_status(ev: LogEvidence, compile_delta: TreeDelta | None) -> tuple[str, str]:
    """vLLM's compile cache: its log lines decide; its torch_compile_cache tree when it is silent."""
    failed = ev.first("aot_load_failed")
    if failed is not None:
        return "load_failed", f"AOT artifact failed to load, recompiled: {failed.groups[1].strip()}"
    loaded = ev.all("graph_loaded", "aot_loaded")
    compiled = ev.all("graph_compiled", "aot_saved")
    if loaded and not compiled:
        what = "AOT artifact" if ev.first("aot_loaded") else f"{len(loaded)} graph(s)"
        return "hit", f"loaded {what} from the cache"
    if compiled:
        graphs = ev.all("graph_compiled")
        seconds = sum(m.num(-1) or 0.0 for m in graphs)
        text = f"compiled {len(graphs)} graph(s)" + (f" in {seconds:.1f} s" if seconds else "")
        if saved := ev.all("aot_saved"):
            text += f", saved {len(saved)} AOT artifact(s)"
        return "miss", text + (f" ({len(loaded)} loaded)" if loaded else "")
    if ev.first("compile_cache_disabled"):
        return "unused", "vLLM's torch.compile cache is disabled"
    if compile_delta is not None and (compile_delta.files_added or compile_delta.files_before):
        status, detail = _files_status(compile_delta)
        return status, f"no vLLM compile log lines; {COMPILE_SUBDIR}: {detail}"
    if (why := compile_unknown(ev)) is not None:
        return "unknown", why
    if compile_delta is None:  # a saved log alone: `unused` only where it can tell (logread.compile_silence)
        return compile_silence(ev)
    return "unused", "no vLLM compile cache on this platform (compiled through stock Inductor, or eager)"


def startup_plan_status(ev: LogEvidence, delta: TreeDelta | None) -> tuple[str, str]:
    """VLLM_ENABLE_STARTUP_PLAN's persisted KV-cache size (v1/worker/startup_plan.py)."""
    if (applied := ev.first("plan_applied")) is not None:
        return "hit", f"applied the persisted plan ({applied.groups[2]} GiB of KV cache): memory profiling skipped"
    if (bad := ev.first("plan_unreadable")) is not None:
        return "load_failed", f"unreadable plan, memory profiled again: {bad.groups[1].strip()}"
    if (rejected := ev.first("plan_rejected")) is not None:
        return "miss", (
            f"plan not applied: free memory {rejected.groups[0]} GiB is below its baseline "
            f"{rejected.groups[1]} GiB; memory profiled"
        )
    if (failed := ev.first("plan_save_failed")) is not None:
        return "miss", f"memory profiled; the plan could not be saved: {failed.groups[1].strip()}"
    if ev.first("plan_saved") is not None:
        return "miss", "no plan for this configuration: memory profiled, plan saved for the next boot"
    if delta is not None and (delta.files_added or delta.files_before):
        status, detail = _files_status(delta)
        return status, f"no start-up plan log lines; {detail}"
    return "unused", "no start-up plan (VLLM_ENABLE_STARTUP_PLAN off, or a platform without one)"


def flashinfer_autotune_status(ev: LogEvidence, delta: TreeDelta | None) -> tuple[str, str]:
    """FlashInfer autotune results (model_executor/warmup/kernel_warmup.py flashinfer_autotune)."""
    if ev.first("autotune_disabled") is not None:
        return "unused", "FlashInfer autotune disabled"
    runs = ev.all("autotune_run")
    if ev.first("autotune_start") is not None:  # a per-rank file: tuning runs only when it did not load
        if runs:
            return "miss", f"tuned {len(runs)} token bucket set(s): no usable autotune file"
        return "hit", "loaded the autotune file: tuning runs skipped"
    if delta is not None and (delta.files_added or delta.files_before):
        return _files_status(delta)  # the managed cache decides per entry; its files tell
    return flashinfer_own_status(ev) or ("unused", "nothing read or written")


def split_vllm_root(scan: TreeScan) -> dict[str, TreeScan]:
    """VLLM_CACHE_ROOT's scan -> one scan per cache it holds, the remainder as vllm_other."""
    parts = {layer: scan.under(sub) for layer, sub in VLLM_ROOT_PARTS.items()}
    claimed = {path for part in parts.values() for path in part.files}
    parts["vllm_other"] = TreeScan(scan.root, {k: v for k, v in scan.files.items() if k not in claimed})
    return parts


def layer_statuses(
    ev: LogEvidence, before: Mapping[str, TreeScan], after: Mapping[str, TreeScan]
) -> dict[str, CacheLayer]:
    """Status of every directory-backed layer, from the scans taken before and after the boot.

    `before`/`after` are keyed by store.layout.CACHE_LAYERS names; the VLLM_CACHE_ROOT scan
    (under "vllm_compile") is split into the caches it holds."""
    before, after = dict(before), dict(after)
    if "vllm_compile" in before and "vllm_compile" in after:
        before.update(split_vllm_root(before.pop("vllm_compile")))
        after.update(split_vllm_root(after.pop("vllm_compile")))
    layers: dict[str, CacheLayer] = {}
    for name in LAYERS:
        if name not in before or name not in after:
            continue
        d = tree_delta(before[name], after[name])
        if name == "vllm_compile":
            status, detail = vllm_compile_status(ev, d)
        elif name == "startup_plan":
            status, detail = startup_plan_status(ev, d)
        elif name == "flashinfer_autotune":
            status, detail = flashinfer_autotune_status(ev, d)
        else:
            status, detail = _files_status(d)
        if name in QUIET_WHEN_UNUSED and status == "unused":
            continue  # absent caches of minor interest: left out rather than listed empty
        if name == "inductor" and status == "unused":
            inside = [p for p in after.get("vllm_compile", TreeScan("", {})).files if "/inductor_cache/" in p]
            if inside:
                # compilation/compiler_interface.py initialize_inductor_cache and compilation/decorators.py
                # ("Unconditional") point TORCHINDUCTOR_CACHE_DIR into vLLM's own tree.
                detail = (
                    f"vLLM points Inductor into its compile cache: {len(inside)} Inductor files are counted "
                    "in vllm_compile (torch_compile_cache/.../inductor_cache)"
                )
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
    partial: the compile cache hit (or was not used) but another layer missed (the start-up
    plan, a kernel cache, the weights). Informational layers do not count."""
    if not caches:
        return None
    primary = caches.get(primary_compile_layer(caches))
    if primary is not None and primary.status in ("miss", "load_failed"):
        return "cold"
    if any(c.status in ("miss", "load_failed") for n, c in caches.items() if n not in INFORMATIONAL_LAYERS):
        return "partial"
    if any(c.status == "unknown" for n, c in caches.items() if n not in INFORMATIONAL_LAYERS):
        return None  # nothing missed that the log shows, but not everything can be read: no claim
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


def differing(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 12) -> list[str]:
    """Human lines naming the factors that differ between two records."""
    lines = [f"{name}: {was!r} -> {now!r}" for name, (was, now) in factor_diff(old, new).items()]
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
    phase_detail: Mapping[str, Any] = field(default_factory=dict)  # what a phase figure includes
    weights: Mapping[str, Any] | None = None  # weights.weights_block: size, source, prefetch, vLLM's phase
    compiled_while_serving: int | None = None  # kernels vLLM JIT-compiled after warm-up (logread.py)
    compiled_kernels: tuple[str, ...] = ()
    cudagraphs: Mapping[str, Any] | None = None  # cudagraphs.capture_summary: sizes and graphs vLLM captured

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["caches"] = {name: asdict(layer) for name, layer in self.caches.items()}
        data["miss_reason"] = list(self.miss_reason)
        data["warnings"] = list(self.warnings)
        data["compiled_kernels"] = list(self.compiled_kernels)
        accounted = sum(v for k, v in self.phases.items() if v is not None and k != "publish")  # publish: after ready
        data["unaccounted_s"] = round(self.ready_s - accounted, 3) if self.ready_s is not None else None
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False, separators=(",", ":"))

    def lines(self) -> list[str]:
        out = []
        head = log.line("report", f"verdict {self.verdict or '?'} (expected {self.expected or '?'})")
        if self.ready_s is not None:
            head += f", ready in {self.ready_s:.1f} s"
        out.append(head + (f", key {self.key}" if self.key else ""))
        phase_text = ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items() if v is not None)
        out.append(log.line("phases", phase_text or "no phase markers found"))
        if self.phase_detail.get("compile_includes_profiling_run"):
            out.append(log.line("phases", "compile includes vLLM's first profiling run (AOT compile off)"))
        out += [log.line("phases", describe(s)) for s in self.phase_detail.get("unlogged", ())]
        if split := self.phase_detail.get("compile_split"):
            out.append(
                log.line("phases", f"compile: language model {split['language_model']} s, encoder {split['encoder']} s")
            )
        for name, layer in self.caches.items():
            out.append(log.line("cache", f"{name:<19} {layer.status:<11} {layer.detail}"))
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
            out.append(log.line("staged", line))
        if self.weights is not None:
            out.append(log.line("weights", f"{weights_line(self.weights)}"))
        if self.cudagraphs is not None:
            out.append(log.line("graphs", f"{self.cudagraphs['detail']}"))
        if self.compiled_while_serving:
            names = ", ".join(sorted(set(self.compiled_kernels))[:6])
            jit = f"vLLM JIT-compiled {self.compiled_while_serving} kernel(s) after warm-up, "
            out.append(log.line("serving", jit + f"which every boot without them compiles again: {names}"))
        for reason in self.miss_reason:
            out.append(log.line("why miss", reason))
        for warning in self.warnings:
            out.append(log.line("warning", f"{warning}"))
        if self.error:
            out.append(log.line("error", f"{self.error}"))
        return out


def report_from_log(lines: Iterable[str], year: int | None = None) -> BootReport:
    """What a vLLM log alone proves: phases and the statuses its lines decide (no directories)."""
    ev, span = LogEvidence.from_log(lines, year)
    app = ev.first("app_ready")
    ready_t = app.t if app is not None else None
    floor = earliest(ev)  # a fragment whose first line comes after work that a later line reports
    phases = compute_phases(ev, ready_t=ready_t, floor=floor)
    status, detail = vllm_compile_status(ev, None)
    caches = {"vllm_compile": CacheLayer(status, detail=detail)}
    for name, status_of in (("startup_plan", startup_plan_status), ("flashinfer_autotune", flashinfer_autotune_status)):
        status, detail = status_of(ev, None)
        if status != "unused":
            caches[name] = CacheLayer(status, detail=detail)
    # stock Inductor on CPU says nothing about its cache: only the directories could tell
    verdict = None if caches["vllm_compile"].status in ("unused", "unknown") else decide_verdict(caches)
    jit_count, jit_kernels = compiled_while_serving(ev)
    engine = ev.first("engine_init")
    warnings = log_warnings(ev) + ([] if span is not None else ["the log holds no vLLM timestamps"])
    if note := release_note(engine.groups[0] if engine else None):
        warnings.append(note)
    return BootReport(
        key=None,
        key_dir=None,
        expected=None,
        verdict=verdict,
        ready_s=round(ready_t - floor, 3) if ready_t is not None else None,
        phases=phases,
        caches=caches,
        vllm_version=engine.groups[0] if engine else None,
        warnings=tuple(warnings),
        source="log",
        phase_detail=phase_details(ev),
        compiled_while_serving=jit_count,
        compiled_kernels=tuple(jit_kernels),
        cudagraphs=capture_summary(ev),
    )
