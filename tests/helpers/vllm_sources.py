"""vLLM's own sources, cached outside the repository: the wheels and sdists of the releases warmstart reads.

$WARMSTART_VLLM_WHEELS, else ~/.cache/warmstart-tests/vllm/ (wheels), and its sdist/ folder (sdists).
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
import urllib.request
from pathlib import Path

import pytest

WHEELS = Path(os.environ.get("WARMSTART_VLLM_WHEELS") or Path.home() / ".cache" / "warmstart-tests" / "vllm")
SDISTS = WHEELS / "sdist"


SIMPLE_INDEX = "https://pypi.org/simple/vllm/"


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
