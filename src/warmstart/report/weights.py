"""The boot report's `weights` block: what the weights prefetch (warmstart/weights.py) planned and did,
set against when vLLM started loading, and its line in the report's text.

The prefetch does the work; this only records it. Times are seconds on the monotonic clock the
prefetch and vLLM's start share, so `overlap_s` (the part of the prefetch that ran during vLLM's
bootstrap) is a difference of two readings of one clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..model import ResolvedModel
from ..s3model import ReadStats
from ..weights import Prefetcher, WeightsPlan


def weights_block(
    plan: WeightsPlan,
    prefetcher: Prefetcher | None,
    *,
    engine_started: float | None,
    load_start_t: float | None,
    bytes_at_load_start: int | None,
    phases: Mapping[str, float | None],
) -> dict[str, Any]:
    """The boot report's `weights` block. Times: seconds; `overlap_s` is the part of the
    prefetch that ran before vLLM started loading (its bootstrap), on one monotonic clock."""
    prefetch: dict[str, Any] = {"status": "skipped" if not plan.prefetch else "pending", "reason": plan.reason}
    if prefetcher is not None and plan.prefetch and prefetcher.started is not None:
        end = prefetcher.finished
        seconds = None if end is None else round(end - prefetcher.started, 3)
        overlap = None
        if engine_started is not None:
            load_at = engine_started + load_start_t if load_start_t is not None else None
            stop_at = min(x for x in (end, load_at) if x is not None) if (end or load_at) else None
            if stop_at is not None:
                overlap = round(max(0.0, stop_at - max(prefetcher.started, engine_started)), 3)
        prefetch = {
            "status": prefetcher.status,
            "reason": prefetcher.stop_reason or prefetcher.error or plan.reason,
            "streams": prefetcher.streams_used,
            "block_bytes": plan.block,
            "bytes_read": prefetcher.bytes_read,
            "seconds": seconds,
            "mb_s": round(prefetcher.bytes_read / 1e6 / seconds, 1) if seconds else None,
            "overlap_s": overlap,
            "bytes_before_load": bytes_at_load_start,
            "finished_before_load": (
                None
                if end is None or load_start_t is None or engine_started is None
                else end <= engine_started + load_start_t
            ),
        }
    listed = bool(plan.files)  # local weights are decided on their path alone: no file was listed or sized
    return {
        "bytes": plan.bytes if listed else None,
        "files": len(plan.files) if listed else None,
        "source": plan.source,
        "snapshot": plan.snapshot,
        "fs": plan.fs,
        "ram_available": plan.ram_available,
        "prefetch": prefetch,
        "vllm_bootstrap_s": phases.get("bootstrap"),
        "vllm_weights_s": phases.get("weights"),
    }


def s3_read(model: ResolvedModel, stats: ReadStats | None, *, streamed: bool = False) -> dict[str, Any]:
    """The `weights.read` block of an s3:// model: what was read from the store. The staged read runs
    beside the restore, before vLLM starts (`stats` None: no read finished); vLLM's streamer reads while
    vLLM loads, so its seconds are vLLM's weights phase (`with_streamer_seconds`, once the log is read)."""
    if streamed:
        read, seconds = model.bytes, None
    else:
        read, seconds = (stats.bytes, round(stats.seconds, 3)) if stats is not None else (0, 0.0)
    return {
        "source": "s3",
        "reader": "streamer" if streamed else "staged",
        "url": model.name,
        "revision": model.revision,
        "bytes": read,
        "seconds": seconds,
        "mb_s": round(read / 1e6 / seconds, 1) if seconds and read else None,
    }


def with_streamer_seconds(read: Mapping[str, Any], weights_s: float | None) -> dict[str, Any]:
    """A streamer's read block with vLLM's weights phase as its seconds (None where the log had none)."""
    if read.get("reader") != "streamer" or not weights_s:
        return dict(read)
    return {**read, "seconds": round(weights_s, 3), "mb_s": round(read["bytes"] / 1e6 / weights_s, 1) or None}


def describe(block: Mapping[str, Any]) -> str:
    """One readable line for the log and the report's summary."""
    pre = block["prefetch"]
    where = f"from {block['source']} ({block['fs'] or '?'})"
    if block.get("files") is None:  # not listed: a size of 0 here read as if the model had no weights (issue 37)
        head = f"weights {where}, not listed"
    else:
        head = f"{block['bytes'] / 1e6:.1f} MB in {block['files']} file(s) {where}"
    if pre["status"] == "skipped":
        text = f"{head}; no prefetch: {pre['reason']}"
    else:
        read = pre.get("bytes_read") or 0
        text = f"{head}; prefetch {pre['status']}: {read / 1e6:.1f} MB"
        if pre.get("seconds") is not None:
            text += f" in {pre['seconds']:.1f} s ({pre.get('mb_s') or 0:.0f} MB/s, {pre.get('streams')} streams)"
        if pre.get("overlap_s") is not None:
            text += f", {pre['overlap_s']:.1f} s of it during vLLM's bootstrap"
        if pre["status"] in ("stopped", "failed") and pre.get("reason"):
            text += f" ({pre['reason']})"
    if (read := block.get("read")) is not None and read.get("reader") == "streamer":
        text += f"; streamed by vLLM from {read['url']}: {read['bytes'] / 1e6:.1f} MB"
        text += f" ({read['mb_s']:.0f} MB/s)" if read.get("mb_s") else ""
    elif read is not None:
        text += f"; read from {read['url']} before vLLM started: {read['bytes'] / 1e6:.1f} MB"
        text += f" in {read['seconds']:.1f} s"
        text += f" ({read['mb_s']:.0f} MB/s)" if read.get("mb_s") else " (already on local disk)"
    weights = block.get("vllm_weights_s")
    text += f"; vLLM's weights phase {weights:.1f} s" if weights is not None else "; vLLM's weights phase: no marker"
    return text
