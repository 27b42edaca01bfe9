"""The report per rank: what each of vLLM's workers did, read from its own lines, and what each rank's
compile-cache directory held before the boot and gained in it.

With tensor parallelism every rank loads its shard, compiles its graphs (or loads them from its own
`rank_{rank}_{dp_rank}` directory) and captures its CUDA graphs, and the engine is ready only when the
slowest rank is. One rank whose directory was not restored compiles for minutes while the others wait,
and the boot's single compile status, read from the first lines that speak, can hide it. So where a log
holds two workers or more (vllm/processes.py names them) each gets an entry, and where the compile cache
holds two rank directories or more, each gets its counts.

What each rank says for itself (vLLM 0.32 and 0.33): its compile lines ("Using cache directory", "Directly
load the compiled graph(s)", "Compiling a graph for compile range", "torch.compile took": plain
`logger.info` in compilation/backends.py and monitor.py). The weights' and capture lines are per rank in
0.33's V2 runner (v1/worker/gpu/model_runner.py, `logger.info`) but printed once in the V1 runner and the
loader (`logger.info_once`, whose scope "local" prints on the first local rank only, logger.py): a figure
a rank did not state is None, never copied from another rank.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..tree import TreeScan
from ..vllm.phases import LogEvidence, Marker
from ..vllm.processes import rank_order

# vLLM's per-rank directory in its compile cache (compilation/backends.py: `f"rank_{rank}_{dp_rank}"`), under
# torch_compile_cache/<hash>/ and, with AOT, torch_compile_cache/torch_aot_compile/<hash>/.
_RANK_DIR = re.compile(r"(?:^|/)(rank_\d+_\d+)(?:/|$)")


def rank_dir(path: str) -> str | None:
    """`rank_3_0` in a path of vLLM's compile cache, or None."""
    m = _RANK_DIR.search(path)
    return m.group(1) if m else None


def _first(markers: Sequence[Marker], *names: str) -> Marker | None:
    return next((m for m in markers if m.name in names), None)


def compile_of(markers: Sequence[Marker]) -> str | None:
    """One worker's compile cache from its own lines (the markers report/statuses.py reads for the boot):
    load_failed, hit (only loads), miss (compiled or saved anything), or None where it said nothing."""
    names = {m.name for m in markers}
    if "aot_load_failed" in names:
        return "load_failed"
    if names & {"graph_compiled", "aot_saved"}:
        return "miss"
    if names & {"graph_loaded", "aot_loaded"}:
        return "hit"
    return None


def worker_entries(ev: LogEvidence) -> list[dict[str, Any]]:
    """One entry per worker process that wrote a marker, in rank order; none where fewer than two did."""
    by_process: dict[str, list[Marker]] = {}
    for marker in ev.markers:
        if marker.process is not None:
            by_process.setdefault(marker.process, []).append(marker)
    if len(by_process) < 2:
        return []
    entries = []
    for process in sorted(by_process, key=rank_order):
        markers = by_process[process]
        total = _first(markers, "compile_total", "compile_total_with_warmup")
        weights = _first(markers, "weights_loaded")
        loaded = _first(markers, "model_loaded")
        capture = _first(markers, "graph_capture")
        where = _first(markers, "compile_cache_dir")
        entries.append(
            {
                "process": process,
                "compile": compile_of(markers),
                "graphs_compiled": sum(m.name == "graph_compiled" for m in markers),
                "graphs_loaded": sum(m.name == "graph_loaded" for m in markers),
                "compile_s": total.num(-1) if total is not None else None,
                # "Model loading took" (the model runner's, weights included) where the worker said it
                "load_s": loaded.num(-1) if loaded is not None else weights.num(0) if weights is not None else None,
                "capture_s": capture.num(0) if capture is not None else None,
                "rank_dir": rank_dir(where.groups[-1].strip()) if where is not None else None,
            }
        )
    return entries


def dir_entries(before: TreeScan | None, after: TreeScan | None) -> list[dict[str, Any]]:
    """Files per rank directory of the compile cache (VLLM_CACHE_ROOT's scans), before the boot and added in
    it; none where fewer than two rank directories exist."""
    if after is None:
        return []
    counts: dict[str, dict[str, int]] = {}
    old = before.files if before is not None else {}
    for path in after.files:
        name = rank_dir(path)
        if name is not None:
            entry = counts.setdefault(name, {"files_before": 0, "files_added": 0})
            entry["files_before" if path in old else "files_added"] += 1
    if len(counts) < 2:
        return []
    return [{"rank_dir": name, **counts[name]} for name in sorted(counts, key=rank_order)]


def ranks_block(
    ev: LogEvidence, before: TreeScan | None = None, after: TreeScan | None = None
) -> dict[str, Any] | None:
    """The report's `ranks`: {"workers": [...], "dirs": [...]}, or None for a boot of one rank."""
    workers, dirs = worker_entries(ev), dir_entries(before, after)
    return {"workers": workers, "dirs": dirs} if workers or dirs else None


def _seconds(entry: Mapping[str, Any]) -> str:
    return f" {entry['compile_s']:.2f} s" if entry.get("compile_s") is not None else ""


def ranks_lines(block: Mapping[str, Any] | None) -> list[str]:
    """The block in words: which workers loaded and which compiled (the boot waits for those), and the
    rank directories' files. No line for a boot of one rank."""
    if not block:
        return []
    lines = []
    if workers := block.get("workers"):
        groups: dict[str, list[Mapping[str, Any]]] = {}
        for entry in workers:
            groups.setdefault(entry["compile"] or "silent", []).append(entry)
        said = []
        for status in ("hit", "miss", "load_failed", "silent"):
            if members := groups.get(status):
                names = ", ".join(f"{e['process']}{_seconds(e)}" for e in members[:8])
                more = f" and {len(members) - 8} more" if len(members) > 8 else ""
                word = {"hit": "loaded", "miss": "compiled", "load_failed": "failed to load", "silent": "no line"}
                said.append(f"{word[status]} on {len(members)} ({names}{more})")
        line = f"{len(workers)} workers, compile cache: " + "; ".join(said)
        timed = [e for e in workers if e.get("compile_s") is not None]
        slowest = max(timed, key=lambda e: e["compile_s"], default=None)
        if slowest is not None and len(groups) > 1:
            line += f"; the boot waited for the slowest, {slowest['process']} ({slowest['compile_s']:.2f} s)"
        lines.append(line)
    if dirs := block.get("dirs"):
        before = sum(d["files_before"] for d in dirs)
        added = sum(d["files_added"] for d in dirs)
        line = f"{len(dirs)} rank directories in vLLM's compile cache: {before} files before the boot, {added} added"
        gained = [d for d in dirs if d["files_added"]]
        if gained and len(gained) < len(dirs):
            line += " (" + ", ".join(f"{d['rank_dir']} +{d['files_added']}" for d in gained[:8]) + ")"
        lines.append(line)
    return lines
