"""`make run` writes the random-weight test model only under its own name (issue 29): written under a
real model's name it would be served as that model."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers.run import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def make_dry(*args: str) -> str:
    # -n: print, run nothing; -o: take the venv as built (nothing is installed by this test).
    done = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_test_model_is_written_only_for_the_default_model():
    assert "warmstart-dev testmodel" in make_dry("testmodel")
    real = make_dry("testmodel", "MODEL_NAME=Qwen/Qwen2.5-0.5B-Instruct")
    assert "warmstart-dev testmodel" not in real
    assert "is not the embedded test model" in real and "MODEL_NAME=/path/to/dir" in real
