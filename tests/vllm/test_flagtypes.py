"""The committed table of vLLM's options (warmstart/vllm/flagtypes.json) is what the installed vLLM's parser says.

The key reads flag values the way vLLM's parser converts them (vllm/argvalues.py) from that
table; a vLLM whose parser changed must regenerate it:
`.vllm-venv/bin/python tools/warmstart_dev/flagtable.py src/warmstart/vllm/flagtypes.json`.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers.run import REPO
from warmstart.vllm import flagtypes

pytestmark = pytest.mark.vllm


def test_the_committed_table_is_the_installed_vllms(vllm_python, tmp_path):
    run = subprocess.run(
        [vllm_python, str(REPO / "tools" / "warmstart_dev" / "flagtable.py"), "-"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    committed = (REPO / "src" / "warmstart" / "vllm" / "flagtypes.json").read_text()
    assert run.stdout == committed, "vLLM's parser changed: regenerate src/warmstart/vllm/flagtypes.json"
    assert flagtypes.load(json.loads(run.stdout)) == (flagtypes.VLLM_VERSION, flagtypes.FLAGS)


def test_the_kinds_the_key_relies_on():
    """Spot checks of what the table says (read from vLLM 0.32's engine/arg_utils.py)."""
    rows = flagtypes.FLAGS
    assert rows["--max-model-len"][:2] == ("max_model_len", "int")
    assert rows["--max-num-seqs"] == ("max_num_seqs", "int", "one", False)
    assert rows["--enforce-eager"][1:3] == ("true", "none") and rows["--no-enforce-eager"][1] == "false"
    assert rows["-tp"][0] == rows["--tensor-parallel-size"][0] == "tensor_parallel_size"
    assert rows["--compilation-config"][1] == rows["--hf-overrides"][1] == "json"
    assert rows["--api-key"][2] == "many"
