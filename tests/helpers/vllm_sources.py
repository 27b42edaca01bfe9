"""vLLM's own sources, cached outside the repository: the wheels and sdists of the releases warmstart reads.

$WARMSTART_VLLM_WHEELS, else ~/.cache/warmstart-tests/vllm/ (wheels), and its sdist/ folder (sdists).
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

WHEELS = Path(os.environ.get("WARMSTART_VLLM_WHEELS") or Path.home() / ".cache" / "warmstart-tests" / "vllm")
SDISTS = WHEELS / "sdist"


def dockerfile(release: str) -> str:
    """docker/Dockerfile of a release's sdist, cached under SDISTS. `pip download vllm==X --no-binary :all:`
    prepares vLLM's metadata before it saves the file, which needs vLLM's own build environment (torch,
    setuptools-rust); where the sdist is not cached, the test says how to fetch it rather than failing."""
    path = SDISTS / f"vllm-{release}.tar.gz"
    if not path.exists():
        pytest.skip(
            f"{path} not cached: fetch it with `pip download 'vllm @ <the vllm-{release}.tar.gz URL PyPI lists>' "
            "--no-deps --no-build-isolation` from an environment that has torch and setuptools-rust"
        )
    with tarfile.open(path) as tar:
        member = tar.extractfile(f"vllm-{release}/docker/Dockerfile")
        assert member is not None
        return member.read().decode()
