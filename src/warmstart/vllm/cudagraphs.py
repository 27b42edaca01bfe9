"""The CUDA graphs a boot captured, read from vLLM's own log: the report's `cudagraphs` block.

Three witnesses, all vLLM's:
- the engine's config line (`Initializing a V1 LLM engine (v%s) with config: %s`, v1/engine/core.py): the
  compilation config's repr (config/compilation.py `__repr__`) holds the final `cudagraph_mode` and
  `cudagraph_capture_sizes`, after vLLM derived them (config/vllm.py `_set_cudagraph_sizes` runs in
  VllmConfig's __post_init__, before the engine core logs the line);
- the capture progress bars, one per graph mode (logformats.CAPTURE_BARS): finished, a bar states how many
  graphs it captured and in how long (tqdm's elapsed time, whole seconds);
- `Graph capturing finished in %.0f secs, took %.2f GiB`. vLLM 0.33's V2 runner (the CUDA default) captures
  twice on a boot that profiles memory (v1/worker/gpu/cudagraph_utils.py `profile_cudagraph_memory`: every
  PIECEWISE graph and a sample of two FULL ones, then discarded) and logs both; the last is the real one.
  The bars follow the same order, so per mode the last finished bar is the real capture.
And the API server's `non-default args: %s` line, which names `max_num_seqs` when the command line gave it
(the fitted value, or the user's); absent, vLLM chose its default and logs it only at DEBUG.

Nothing is inferred that the log does not state: a figure the log lacks is None.
"""

from __future__ import annotations

import re
from typing import Any

from .phases import LogEvidence, tqdm_seconds

_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.([A-Z_]+)")
_SIZES = re.compile(r"'cudagraph_capture_sizes': \[([0-9, ]*)\]")
_SEQS = re.compile(r"'max_num_seqs': (\d+)")


def config_sizes(config: str) -> tuple[str | None, list[int] | None]:
    """(cudagraph_mode, cudagraph_capture_sizes) from the engine's config text; None where it does not say."""
    mode = _MODE.search(config)
    sizes = _SIZES.search(config)
    numbers = [int(n) for n in sizes.group(1).split(",") if n.strip()] if sizes else None
    return (mode.group(1) if mode else None), numbers


def _span(sizes: list[int]) -> str:
    return f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 1 else str(sizes[0])


def capture_summary(ev: LogEvidence) -> dict[str, Any] | None:
    """The `cudagraphs` block, or None where the log holds none of these lines (an engine that is not vLLM)."""
    engine = ev.first("engine_init")
    mode, sizes = config_sizes(engine.groups[1] if engine is not None and len(engine.groups) > 1 else "")
    args = ev.last("engine_args")
    seqs = _SEQS.search(args.groups[0]) if args is not None else None
    graphs: dict[str, dict[str, Any]] = {}
    for bar in ev.all("capture_bar", "capture_bar_draft"):
        draft = bar.name == "capture_bar_draft"
        label = f"{bar.groups[0]} {bar.groups[1]}" if draft else bar.groups[0]  # "dspark FULL" / "decode, FULL"
        rest = bar.groups[2:] if draft else bar.groups[1:]  # bar, done, total, elapsed, remaining
        captured = int(float(rest[2].replace(",", ""))) if len(rest) > 2 else None
        graphs[label] = {
            "label": label,
            "captured": captured,
            "seconds": tqdm_seconds(rest[3]) if len(rest) > 3 else None,
        }
    runs = [m.num() for m in ev.all("graph_capture")]
    if engine is None and seqs is None and not graphs and not runs:
        return None
    if runs or graphs:
        status = "captured"
    elif mode == "NONE" or sizes == []:
        status = "unused"
    else:
        status = "unknown"
    block: dict[str, Any] = {
        "status": status,
        "mode": mode,
        "sizes": sizes,
        "count": len(sizes) if sizes is not None else None,
        "max_num_seqs": int(seqs.group(1)) if seqs else None,
        "graphs": list(graphs.values()),
        "capture_s": runs[-1] if runs else None,
        "capture_runs_s": runs,
    }
    block["detail"] = describe(block)
    return block


def describe(block: dict[str, Any]) -> str:
    """One line for a person: what vLLM captured, as its log states it."""
    seqs = block.get("max_num_seqs")
    head = f"max_num_seqs {seqs} (vLLM's command line); " if seqs is not None else ""
    sizes = block.get("sizes")
    if block["status"] == "unused":
        return head + f"no CUDA graphs: cudagraph_mode {block.get('mode') or '?'}, no capture sizes (CPU, or eager)"
    text = head + (f"{len(sizes)} capture sizes ({_span(sizes)})" if sizes else "capture sizes not in the log")
    if block.get("mode"):
        text += f", {block['mode']}"
    for g in block.get("graphs", []):
        count = f"{g['captured']} graph{'' if g['captured'] == 1 else 's'}"
        text += f"; {g['label']}: {count}" + (f" in {g['seconds']:.0f} s" if g["seconds"] is not None else "")
    runs = block.get("capture_runs_s") or []
    if runs:
        text += f"; capture finished in {runs[-1]:.0f} s"
        if len(runs) > 1:
            text += f" (and {sum(runs[:-1]):.0f} s capturing to profile memory first)"
    elif block["status"] == "unknown":
        text += "; no capture line in the log (the boot stopped before, or the log is cut)"
    return text
