"""`warmstart-dev bench capture`: vLLM 0.33.0's own config code on an H200 profile, with and without the fit.

The figures are vLLM's (tools/warmstart_dev/captureprobe.py runs its code from the wheel); this test holds
them to what the issue and the docs say, and the docs' table and the synthetic fixture's config line to the
command's output, so neither can drift from what vLLM computes."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers.run import FIXTURES, REPO, WARMSTART_DEV
from helpers.vllm_sources import wheel
from warmstart_dev.capturebench import PER_GRAPH_S, markdown, side


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> dict:
    work = tmp_path_factory.mktemp("capture")
    done = subprocess.run(
        [WARMSTART_DEV, "bench", "capture", "--json", "--workdir", str(work), "--wheel", str(wheel("0.33.0"))],
        env={"PATH": "/usr/bin:/bin", "HOME": str(work), "WARMSTART_VLLM_PYTHON": vllm_python},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.vllm
def test_unfitted_is_vllms_default_of_1024_and_51_sizes_up_to_512(result):
    """engine/arg_utils.py get_batch_defaults (>= 70 GiB, not an A100: 1024) and config/vllm.py
    _set_cudagraph_sizes (largest min(max_num_seqs * 1 * 2, 512)), as the issue read them."""
    u = result["unfitted"]
    assert result["vllm"] == "0.33.0"
    assert (u["max_num_seqs"], u["sizes_count"], u["largest"], u["cudagraph_mode"]) == (
        1024,
        51,
        512,
        "FULL_AND_PIECEWISE",
    )
    assert u["graphs"] == {"PIECEWISE": 51, "FULL": 51}


@pytest.mark.vllm
def test_fitted_sizes_follow_max_concurrency(result):
    rows = {row["max_concurrency"]: row["fitted"] for row in result["rows"]}
    assert sorted(rows) == [1, 4, 30, 100, 256]
    for n, fitted in rows.items():
        assert fitted["max_num_seqs"] == n
        assert fitted["largest"] <= min(2 * n, 512)  # the bound; vLLM's grid may stop below it
        assert n in fitted["sizes"] or n > fitted["largest"]  # vLLM appends the widest decode batch
        assert fitted["graphs"]["FULL"] == len([s for s in fitted["sizes"] if s <= n])
    assert rows[30]["sizes"] == [1, 2, 4, 8, 16, 24, 30, 32, 40, 48, 56]
    assert rows[1]["sizes"] == [1, 2]


@pytest.mark.vllm
def test_the_docs_table_and_the_fixture_are_this_commands_output(result):
    table = markdown(result)
    assert table in (REPO / "docs" / "BENCHMARKS.md").read_text(), "rerun the command and update the table"
    config = (FIXTURES / "gpu-0.33-h200-fitted-30.config").read_text().strip()
    assert config == result["config_line_fitted_30"], "rewrite the fixture from `bench capture --json`"


def test_the_estimate_is_the_rfcs_rate_times_the_graphs():
    case = {"max_num_seqs": 30, "max_num_batched_tokens": 8192, "cudagraph_mode": "FULL_AND_PIECEWISE"}
    got = side({**case, "sizes": [1, 2, 4], "graphs": {"PIECEWISE": 11, "FULL": 7}}, samples=2)
    assert PER_GRAPH_S == pytest.approx(10 / 67)
    assert got["graphs_total"] == 18 and got["estimate_s"] == round(18 * 10 / 67, 1)
    assert got["profiling_graphs"] == 13  # every PIECEWISE graph and 2 FULL ones (profile_cudagraph_memory)
    assert (got["sizes_count"], got["largest"]) == (3, 4)
