"""`warmstart-dev bench canary`: warm ready time with the canary and without, alternated in one run.

The tiny model boots cold once on a volume (its generation records the canary); then warm boots,
each on a fresh local disk, alternate `WARMSTART_CANARY=enforce` and `off`, `pairs` times, with
which goes first swapped each pair, so drift in a shared machine's load hits both sides. Figures
are the boot reports' own: `ready_s` (the canary is inside it) and the canary's `seconds` (its two
requests, timed by the boot: the direct measure of its cost, less noisy than a difference of two
boots). Goal: the canary's added time at most 2 % of the warm ready time.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

from .siblingsbench import BENCH_MODEL, _boot, _fresh_volume

GOAL_SHARE = 0.02  # the canary's cost, at most this share of the warm ready time


def canary_goal_met(canary_s: list[float], warm_ready_s: list[float]) -> bool:
    return bool(canary_s and warm_ready_s) and statistics.median(canary_s) <= GOAL_SHARE * statistics.median(
        warm_ready_s
    )


def bench_canary(workdir: Path, pairs: int = 3) -> dict[str, Any]:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    volume = _fresh_volume(workdir / "volume", None)
    cold = _boot(workdir, volume, "cold", {})
    runs: dict[str, list[dict[str, Any]]] = {"enforce": [], "off": []}
    for i in range(pairs):
        for mode in ("enforce", "off") if i % 2 == 0 else ("off", "enforce"):
            report = _boot(workdir, volume, f"warm-{mode}-{i}", {"WARMSTART_CANARY": mode})
            canary = report.get("canary") or {}
            runs[mode].append(
                {
                    "verdict": report["verdict"],
                    "ready_s": report["ready_s"],
                    "canary_s": canary.get("seconds"),
                    "canary_status": canary.get("status"),
                    "latency_s": canary.get("latency_s"),
                    "recorded_latency_s": canary.get("recorded_latency_s"),
                    "repeat_spread": canary.get("repeat_spread"),
                }
            )
    with_ready = [r["ready_s"] for r in runs["enforce"]]
    without_ready = [r["ready_s"] for r in runs["off"]]
    canary_s = [r["canary_s"] for r in runs["enforce"] if r["canary_s"] is not None]
    median_off = statistics.median(without_ready) if without_ready else None
    return {
        "benchmark": "canary",
        "model": BENCH_MODEL,
        "vllm_version": cold.get("vllm_version"),
        "pairs": pairs,
        "cold": {"ready_s": cold["ready_s"], "canary": cold.get("canary")},
        "warm_ready_with_canary_s": round(statistics.median(with_ready), 2) if with_ready else None,
        "warm_ready_without_canary_s": round(median_off, 2) if median_off is not None else None,
        "canary_s": round(statistics.median(canary_s), 3) if canary_s else None,
        "canary_share_of_warm_ready": round(statistics.median(canary_s) / median_off, 4)
        if canary_s and median_off
        else None,
        "runs": runs,
        "goal_share": GOAL_SHARE,
        "goal_met": canary_goal_met(canary_s, without_ready),
    }
