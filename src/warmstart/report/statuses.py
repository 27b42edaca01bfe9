"""Each cache layer's status in one boot, and the verdict they make.

Two independent witnesses decide whether a cache hit. vLLM's log lines say what its
compile cache did (load, compile, load failure with a reason); the cache directories
say what every layer gained during the boot (a layer that had files and gained none
was reused; one that gained files compiled something). Where vLLM prints nothing (the
CPU build compiles through stock Inductor), the directories decide alone.

The markers are data (vllm/logformats.py, one table per vLLM build); where each second went is
vllm/phases.py. This module turns the markers and the directory scans into `CacheLayer`s and a `Verdict`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..tree import TreeDelta, TreeScan, tree_delta
from ..vllm.logread import compile_silence, compile_unknown, flashinfer_own_status
from ..vllm.phases import LogEvidence
from .model import CacheLayer, LayerStatus, Verdict

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


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _files_status(d: TreeDelta) -> tuple[LayerStatus, str]:
    if d.files_added:
        where = f" to {d.files_before} present" if d.files_before else ""
        return "miss", f"{d.files_added} files added ({_mb(d.bytes_added)}){where}"
    if d.files_before:
        changed = f", {d.files_changed} rewritten" if d.files_changed else ""
        return "hit", f"{d.files_before} files present ({_mb(d.bytes_before)}), none added{changed}"
    return "unused", "nothing read or written"


def vllm_compile_status(ev: LogEvidence, compile_delta: TreeDelta | None) -> tuple[LayerStatus, str]:
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


def startup_plan_status(ev: LogEvidence, delta: TreeDelta | None) -> tuple[LayerStatus, str]:
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


def flashinfer_autotune_status(ev: LogEvidence, delta: TreeDelta | None) -> tuple[LayerStatus, str]:
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


def decide_verdict(caches: Mapping[str, CacheLayer]) -> Verdict | None:
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
