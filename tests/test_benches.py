"""The benchmark commands end to end with the scripted engine: their wiring, never their figures.

The figures come from real vLLM (docs/BENCHMARKS.md); these runs only show that a bench still
starts both sides, reads what it needs from each, and prints its JSON. A bench that crashed on
a changed signature was once found only by its own 18-minute run."""

from __future__ import annotations

import json

from conftest import base_env, run_warmstart


def test_bench_boot_runs_both_sides_cold_then_warm(tmp_path, fake_vllm_python):
    env = {**base_env(tmp_path / "unused-volume", fake_vllm_python, tmp_path), "BENCH_REPEATS": "2"}
    done = run_warmstart(["bench", "boot", "--json", "--workdir", str(tmp_path / "bench")], env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "boot" and result["repeats"] == 2
    assert len(result["bare_warm_runs_s"]) == len(result["warmstart_warm_runs_s"]) == 2
    assert len(result["pair_overheads_s"]) == 2
    # warmstart's own reports, one per boot: the first compiled, the next two restored it.
    assert result["warmstart_verdicts"] == ["cold", "warm", "warm"]
    assert len(result["warmstart_before_engine_s"]) == len(result["warmstart_wrapper_cpu_s"]) == 3
    assert result["goal_met"] == (result["overhead_warm_s"] <= 1.0 and result["overhead_cold_s"] <= 2.0)


def test_bench_predict_boots_each_configuration_cold_then_warm_and_scores_them(tmp_path, fake_vllm_python):
    env = base_env(tmp_path / "unused-volume", fake_vllm_python, tmp_path)
    done = run_warmstart(["bench", "predict", "--json", "--workdir", str(tmp_path / "bench")], env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "predict"
    configs = [tuple(b["config"]) for b in result["boots"]]
    assert configs == [c for c in ((256, 4), (512, 4), (256, 2), (1024, 8)) for _ in (0, 1)]
    # A fresh local disk each time: the second boot of a configuration can only be warm from the volume.
    assert [b["verdict"] for b in result["boots"]] == ["cold", "warm"] * 4
    assert result["evaluation"]["keys"] == 4 and result["evaluation"]["all"]["n"] == 8
