"""The command line's output as a shell uses it: a reader that stops early (`| head`) ends the
command quietly, as any Unix tool ends (issue 38)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers.run import WARMSTART, base_env

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_reader_that_closes_early_gets_no_broken_pipe_traceback():
    """`warmstart report LOG | head`: the pipe is closed before the first write."""
    for args in (["report", str(FIXTURES / "cpu-0.32-cold.log")],):
        proc = subprocess.Popen([WARMSTART, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the command writes a byte
        stderr = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
        assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
        assert code == 141, (code, stderr)  # 128 + SIGPIPE, what a shell shows for `cmd | head`


def test_explain_and_predict_write_nothing_to_the_volume(volume, tiny_model, fake_vllm_python, tmp_path):
    """Commands that only read leave the volume as they found it: no empty `<volume>/warmstart`
    (they used to create it while judging whether the volume is writable)."""
    before = sorted(str(p.relative_to(volume)) for p in volume.rglob("*"))
    env = base_env(volume, fake_vllm_python, tmp_path)
    for command in ("explain", "predict"):
        out = subprocess.run([WARMSTART, command], capture_output=True, text=True, env=env, timeout=120)
        assert "Traceback" not in out.stderr and "key      | tiny-llama" in out.stderr, out.stderr  # a full plan
        assert sorted(str(p.relative_to(volume)) for p in volume.rglob("*")) == before, command
