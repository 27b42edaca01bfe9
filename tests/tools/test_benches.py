"""The benchmark commands end to end with the scripted engine: their wiring, never their figures.

The figures come from real vLLM (docs/BENCHMARKS.md); these runs only show that a bench still
starts both sides, reads what it needs from each, and prints its JSON. A bench that crashed on
a changed signature was once found only by its own 18-minute run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from helpers.run import WARMSTART_DEV, base_env
from warmstart.weights import weight_files


def run_bench(tmp_path: Path, python: str, name: str, *args: str, **env: str) -> dict[str, Any]:
    """`warmstart-dev bench NAME --json` on the scripted engine; its JSON."""
    full_env = {**base_env(tmp_path / "unused-volume", python, tmp_path), **env}
    argv = [WARMSTART_DEV, "bench", name, "--json", "--workdir", str(tmp_path / "bench"), *args]
    done = subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bench_boot_runs_both_sides_cold_then_warm(tmp_path, fake_vllm_python):
    result = run_bench(tmp_path, fake_vllm_python, "boot", BENCH_REPEATS="2")
    assert result["benchmark"] == "boot" and result["repeats"] == 2
    assert len(result["bare_warm_runs_s"]) == len(result["warmstart_warm_runs_s"]) == 2
    assert len(result["pair_overheads_s"]) == 2
    # warmstart's own reports, one per boot: the first compiled, the next two restored it.
    assert result["warmstart_verdicts"] == ["cold", "warm", "warm"]
    assert len(result["warmstart_before_engine_s"]) == len(result["warmstart_wrapper_cpu_s"]) == 3
    assert result["goal_met"] == (result["overhead_warm_s"] <= 1.0 and result["overhead_cold_s"] <= 2.0)


def test_bench_predict_boots_each_configuration_cold_then_warm_and_scores_them(tmp_path, fake_vllm_python):
    result = run_bench(tmp_path, fake_vllm_python, "predict")
    assert result["benchmark"] == "predict"
    configs = [tuple(b["config"]) for b in result["boots"]]
    assert configs == [c for c in ((256, 4), (512, 4), (256, 2), (1024, 8)) for _ in (0, 1)]
    # A fresh local disk each time: the second boot of a configuration can only be warm from the volume.
    assert [b["verdict"] for b in result["boots"]] == ["cold", "warm"] * 4
    assert result["evaluation"]["keys"] == 4 and result["evaluation"]["all"]["n"] == 8


def test_bench_weights_runs_every_side_and_reports_its_goals(tmp_path, fake_vllm_python):
    """On the NFS-like mock volume (real FUSE mounts), one repeat, a 4 MiB model."""
    models = str(tmp_path / "models")
    result = run_bench(
        tmp_path, fake_vllm_python, "weights", "--size", "4MiB", BENCH_REPEATS="1", WARMSTART_BENCH_MODELS=models
    )
    assert result["benchmark"] == "weights" and result["repeats"] == 1
    assert result["bytes"] == sum(s for _, s in weight_files(next((tmp_path / "models").glob("hub/*/snapshots/*"))))
    for side in ("bare", "bare_prefetch", "warmstart"):
        assert len(result["runs"][side]["ready_runs_s"]) == 1
        assert result["runs"][side]["weights_runs_s"] == [0.01]  # the scripted engine's "Loading weights took"
    (report,) = result["warmstart_reports"]
    # It ran; the scripted engine "loads" at once, which may stop it before the end.
    assert report["weights"]["source"] == "volume" and report["weights"]["prefetch"]["status"] in ("done", "stopped")
    assert set(result["goals"]) == {
        "weights_at_most_25pct_of_bare",
        "weights_at_most_50pct_of_bare_prefetch",
        "ready_not_above_bare_prefetch",
    }
    assert result["goal_met"] == all(result["goals"].values())
