"""The boot report on real start-up logs that users published (tests/fixtures/real/, SOURCES.md names each).

For every log: the statuses its lines decide, the figures it states (compile, weights, graph capture,
first forward, kernel warm-up, autotune), the CUDA graphs each capture bar states, the kernels compiled
while serving; and for all of them the
report's invariants: no phase negative, none overlapping, phases plus `unaccounted_s` equal to the
ready time, and no "no lines" claim about a cache the log has lines about.
"""

from __future__ import annotations

import json
import re
from itertools import pairwise

import pytest

from helpers.run import FIXTURES
from warmstart.report.fromlog import report_from_log
from warmstart.vllm.logformats import HINTS, WORK_BEGINS
from warmstart.vllm.logread import compile_off_in_config, compile_outside_log
from warmstart.vllm.phases import LogEvidence
from warmstart.vllm.silences import SILENCE_S

REAL = FIXTURES / "real"
EXPECTED = {k: v for k, v in json.loads((REAL / "expected.json").read_text()).items() if not k.startswith("_")}


def report(name: str):
    return report_from_log((REAL / name).read_text(encoding="utf-8").splitlines(), year=2026)


def test_every_log_has_its_figures_and_a_source():
    logs = sorted(p.name for p in REAL.glob("*.log"))
    assert logs == sorted(EXPECTED)
    sources = (REAL / "SOURCES.md").read_text()
    assert all(f"`{name}`" in sources for name in logs)
    assert len(logs) >= 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_report_states_what_the_log_states(name):
    want = EXPECTED[name]
    r = report(name)
    for cache, status in want["caches"].items():
        assert cache in r.caches, f"{name}: no {cache} in the report"
        assert r.caches[cache].status == status, f"{name}: {cache} {r.caches[cache]}"
    for phase, seconds in want["phases"].items():
        assert r.phases[phase] == pytest.approx(seconds, abs=0.01), f"{name}: {phase} {r.phases}"
    if "compiled_while_serving" in want:
        assert r.compiled_while_serving == want["compiled_while_serving"]
    assert (r.ready_s is not None) == want["ready"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_graphs_are_what_the_capture_lines_state(name):
    """Per capture bar its graphs and seconds, the last capture's figure; nothing where the log has neither."""
    want = EXPECTED[name]
    graphs = report(name).cudagraphs or {"graphs": [], "capture_s": None}
    assert {g["label"]: [g["captured"], g["seconds"]] for g in graphs["graphs"]} == want.get("graphs", {})
    assert graphs["capture_s"] == want.get("capture_s")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_phases_never_overlap_and_add_up_to_ready(name):
    r = report(name)
    data = r.to_dict()
    assert all(v is None or v >= 0 for v in r.phases.values()), r.phases
    if r.ready_s is not None:
        accounted = sum(v for k, v in r.phases.items() if v is not None and k != "publish")
        assert data["unaccounted_s"] >= -0.01
        assert accounted + data["unaccounted_s"] == pytest.approx(r.ready_s, abs=0.01)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_false_claim_that_a_log_lacks_cache_lines(name):
    """A log with lines about a cache never gets `unused` for it with "no ... lines" as the reason."""
    text = (REAL / name).read_text(encoding="utf-8")
    r = report(name)
    if HINTS["vllm_compile"].search(text):
        assert r.caches["vllm_compile"].status != "unused", r.caches["vllm_compile"]
    if HINTS["flashinfer_autotune"].search(text):
        assert "flashinfer_autotune" in r.caches and r.caches["flashinfer_autotune"].status != "unused"


def test_a_stated_figure_reaches_back_before_a_fragments_first_line():
    """The fragment starts at 'Model loading took ... 1.258585 seconds': the load began before its first line,
    and the report keeps vLLM's figure rather than cutting it at the first timestamp."""
    r = report("issue20783-0.9-vllmworker-tp8.log")
    assert r.phases["weights"] == pytest.approx(1.259, abs=0.001)


def test_host_timestamps_give_the_ready_time_and_the_autotune_span():
    r = report("file-0.20-host-timestamps-wsl-nvfp4.log")
    # 23:11:56.528 (first line) -> 23:14:43.951 (Application startup complete), on the collector's clock
    assert r.ready_s == pytest.approx(167.423, abs=0.001)
    assert r.phases["autotune"] == pytest.approx(1.632, abs=0.001)  # [Autotuner] starts 16.965 -> ends 18.597


def test_kernels_compiled_while_serving_are_counted_and_named():
    r = report("file-0.2x-first-forward-118s-jit-serving.log")
    assert r.compiled_while_serving == 4
    assert "_causal_conv1d_fwd_kernel" in r.compiled_kernels
    assert any("JIT-compiled 4 kernel(s) after warm-up" in line for line in r.lines())
    assert r.to_dict()["compiled_kernels"][0] == "_zero_kv_blocks_kernel"
    # A log cut at "init engine" cannot tell what serving compiled.
    assert report("file-0.3x-v2-runner-jit-warmup-sm75.log").compiled_while_serving is None


def test_an_unknown_status_says_why():
    wrapped = report("pr16848-0.8-shape-none-load-wrapped.log").caches["vllm_compile"]
    assert wrapped.status == "unknown"
    assert "no table reads" in wrapped.detail and "Dynamo bytecode transform time" in wrapped.detail
    stated = report("issue43009-0.2x-init-engine-to-server.log").caches["vllm_compile"]
    assert "62.45 s of compilation" in stated.detail


def test_a_release_without_a_table_is_read_with_the_nearest_one_and_the_report_says_so():
    lines = [
        "(EngineCore pid=9) INFO 05-01 21:11:40 [core.py:109] Initializing a V1 LLM engine (v0.20.0) with config: x",
        "(EngineCore pid=9) INFO 05-01 21:12:20 [monitor.py:53] torch.compile took 45.15 s in total",
    ]
    r = report_from_log(lines, year=2026)
    assert any("vLLM 0.20.0 has no marker table of its own" in w and "cuda-0.27.1" in w for w in r.warnings)


def test_timeline_shows_the_kernels_compiled_while_serving():
    from warmstart.timeline import render_timeline

    boot = report("file-0.2x-first-forward-118s-jit-serving.log").to_dict()
    page = render_timeline([boot], title="t")
    assert 'data-layer="compiled_while_serving" data-count="4"' in page
    assert "4 kernel(s) JIT-compiled while serving" in page
    assert 'data-status="unknown"' in render_timeline(
        [report("pr16848-0.8-shape-none-load-wrapped.log").to_dict()], title="t"
    )


def _warmup_window(ev):
    """The stamped lines from the KV cache's size to "init engine ... took": where vLLM warms up and captures."""
    kv = ev.last("kv_size", "kv_available")
    init = ev.last("init_engine", "init_engine_compiled", "init_engine_mm")
    if kv is None or init is None or kv.t is None or init.t is None:
        return None, []
    return kv, [(t, text) for t, text in ev.lines if kv.t <= t <= init.t]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_phase_absorbs_a_silence(name):
    """The KV-cache phase holds memory profiling (end of loading -> the KV cache's size) and, of the warm-up after
    it, only what the lines explain: a stretch within the clock's resolution or one after a line that starts a
    step. A longer stretch after any other line is `unlogged`, with the lines that bound it."""
    lines = (REAL / name).read_text(encoding="utf-8").splitlines()
    ev, _ = LogEvidence.from_log(lines, 2026)
    r = report(name)
    kv, window = _warmup_window(ev)
    start = ev.first("model_loaded") or ev.first("weights_loaded") or ev.first("load_start")
    if kv is None or start is None or r.phases["kv_cache"] is None:
        return
    explained = sum(
        t1 - t0 for (t0, opener), (t1, _) in pairwise(window) if t1 - t0 <= SILENCE_S or WORK_BEGINS.search(opener)
    )
    assert r.phases["kv_cache"] <= (kv.t - start.t) + explained + 0.01, (r.phases, r.phase_detail.get("unlogged"))
    for silence in r.phase_detail.get("unlogged", ()):
        assert silence["seconds"] > SILENCE_S
        assert not WORK_BEGINS.search(silence["after"])
        assert any(silence["after"] == text for _, text in window) and any(silence["before"] == t for _, t in window)


def test_a_silence_after_the_kv_cache_size_is_its_own_phase():
    """0.2x, a 27B FP4 model: 234 s pass between 'Maximum concurrency ...' and 'Graph capturing finished in 3 secs'
    with no line. 231 s of it are `unlogged`, not KV-cache time; what vLLM's code runs there is named as likely
    (kernel_warmup.py), and the verdict does not move."""
    r = report("file-0.2x-first-forward-118s-jit-serving.log")
    assert r.phases["unlogged"] == 231.0
    assert r.phases["kv_cache"] == pytest.approx(16.77, abs=0.01)  # 247.77 before: the silence was counted in it
    (silence,) = r.phase_detail["unlogged"]
    assert silence["after"].endswith("Maximum concurrency for 262,144 tokens per request: 5.74x")
    assert silence["before"].endswith("Graph capturing finished in 3 secs, took 0.62 GiB")
    assert silence["to_s"] - silence["from_s"] == 234.0
    assert "model_executor/warmup/kernel_warmup.py" in silence["likely"]
    assert "no config line in the log says whether" in silence["likely"]  # the fragment has no config line
    assert r.verdict == "cold" and r.caches["vllm_compile"].status == "miss"  # from the compile lines alone
    assert any(line.startswith("warmstart | phases   | unlogged 231.0 s") for line in r.lines())


def test_a_silence_after_the_capture_names_the_end_of_the_warm_up():
    """0.3x V2 runner on sm75: 59 s without a line after gpu_worker.py's post-capture memory line."""
    (silence,) = report("file-0.3x-v2-runner-jit-warmup-sm75.log").phase_detail["unlogged"]
    assert silence["seconds"] == 59.0
    assert "after CUDA graph capture" in silence["likely"] and "v1/worker/gpu_worker.py" in silence["likely"]


def test_the_likely_step_follows_the_engines_config_line():
    """FlashInfer autotune is named only where the config line turns it on (kernel_warmup.py flashinfer_autotune)."""
    head = "(EngineCore pid=9) INFO 05-01 21:11:{:02d} [x.py:1] "
    config = "Initializing a V1 LLM engine (v0.33.0) with config: model='m', kernel_config=KernelConfig({}) "

    def silence(autotune: str):
        lines = [
            head.format(0) + config.format(f"enable_flashinfer_autotune={autotune}, enable_jit_warmup=True"),
            head.format(10) + "Model loading took 1.0 GiB memory and 2.000000 seconds",
            head.format(12) + "GPU KV cache size: 1,000 tokens, Maximum concurrency for 100 tokens per request: 10.00x",
            head.format(50) + "Graph capturing finished in 1 secs, took 0.10 GiB",
            head.format(51) + "init engine (profile, create kv cache, warmup model) took 40.00 s",
        ]
        r = report_from_log(lines, year=2026)
        assert r.phases["unlogged"] == 37.0 and r.phases["kv_cache"] == 3.0
        return r.phase_detail["unlogged"][0]["likely"]

    assert "`enable_flashinfer_autotune=True` in the engine's config line" in silence("True")
    assert "FlashInfer autotune" not in silence("False")


def test_a_fully_logged_warm_up_has_no_silence():
    r = report("file-0.20-host-timestamps-wsl-nvfp4.log")
    assert r.phases["unlogged"] is None and "unlogged" not in r.phase_detail


# Lines only the start of a boot prints (engine, loading) and lines only what follows the first forward prints
# (memory profiling, KV cache, warm-up, capture, the server): written here from the logs, not from logread.py.
_BEFORE_FIRST_FORWARD = re.compile(
    r"Initializing a V1 LLM engine|Starting to load model|Loading model from scratch|Loading weights took"
    r"|Model loading took"
)
_AFTER_FIRST_FORWARD = re.compile(
    r"profiling/warmup run took|KV cache memory|KV cache size|Graph capturing finished|Capturing CUDA graphs"
    r"|init engine \(profile|Application startup complete|during inference|Kernel JIT monitor|\[Auto[Tt]uner\]"
)


@pytest.mark.parametrize("name", sorted(p.name for p in REAL.glob("*.log")))
def test_whether_a_log_passes_the_first_forward_is_read_from_its_lines(name):
    """logread.compile_outside_log: a log without a line of the boot's start, or without one of what follows
    the first forward, cannot show vLLM's compile cache."""
    text = (REAL / name).read_text(encoding="utf-8")
    ev, _ = LogEvidence.from_log(text.splitlines(), 2026)
    through = bool(_BEFORE_FIRST_FORWARD.search(text)) and bool(_AFTER_FIRST_FORWARD.search(text))
    assert (compile_outside_log(ev) is None) == through, compile_outside_log(ev)


def test_the_config_line_says_when_vllm_compiles_nothing():
    line = "INFO 05-01 21:11:40 [core.py:109] Initializing a V1 LLM engine (v0.33.0) with config: model='m', {}"
    for config, words in (
        ("enforce_eager=True, kv_cache_dtype=auto", "enforce_eager=True"),
        ("compilation_config={'mode': <CompilationMode.NONE: 0>}", "mode NONE"),
        ("device_config=cpu, seed=0", "stock Inductor"),
    ):
        ev, _ = LogEvidence.from_log([line.format(config)], 2026)
        assert words in (compile_off_in_config(ev) or "")
    ev, _ = LogEvidence.from_log([line.format("enforce_eager=False, compilation_config={'mode': 3}")], 2026)
    assert compile_off_in_config(ev) is None


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_unused_claim_on_a_fragment(name):
    """`unused` only where the log runs from the boot's start past the first forward (where vLLM's compile cache
    speaks) without a compile line, or where its config line turns compiling off; a cut log is `unknown`."""
    text = (REAL / name).read_text(encoding="utf-8")
    layer = report(name).caches["vllm_compile"]
    through = bool(_BEFORE_FIRST_FORWARD.search(text)) and bool(_AFTER_FIRST_FORWARD.search(text))
    if layer.status == "unused":
        assert through or "config line" in layer.detail, layer


def test_a_log_that_ends_before_the_compile_cache_speaks_says_so():
    cut = report("issue-club3090-1047-0.2x-cut-before-aot-load.log").caches["vllm_compile"]
    assert cut.status == "unknown" and cut.detail.startswith("log ends before vLLM's first forward")
    late = report("issue-vllmwindows17-0.3x-v2-capture-before-kv.log").caches["vllm_compile"]
    assert late.status == "unknown" and late.detail.startswith("log starts after vLLM's first forward")
    # A log that runs through the first forward with no compile line: unused, and it says why.
    whole = report("file-0.3x-v2-runner-jit-warmup-sm75.log").caches["vllm_compile"]
    assert whole.status == "unused" and "past the first forward" in whole.detail


def test_a_cut_log_whose_config_line_turns_compiling_off_is_unused():
    head = "(EngineCore pid=9) INFO 05-01 21:11:{:02d} [x.py:1] "
    lines = [
        head.format(0) + "Initializing a V1 LLM engine (v0.33.0) with config: model='m', enforce_eager=True, seed=0",
        head.format(9) + "Model loading took 1.0 GiB memory and 2.000000 seconds",
    ]
    layer = report_from_log(lines, year=2026).caches["vllm_compile"]
    assert layer.status == "unused" and "enforce_eager=True" in layer.detail
    without = report_from_log([lines[0].replace("enforce_eager=True", "enforce_eager=False"), lines[1]], year=2026)
    assert without.caches["vllm_compile"].status == "unknown"
