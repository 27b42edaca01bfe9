"""Each release table holds that release's own strings: checked against the release's wheel from PyPI.

The wheels (about 300 MB each) are downloaded once (helpers/vllm_sources.py) into a cache outside the
repository that CI on the same machine reuses: $WARMSTART_VLLM_WHEELS, else ~/.cache/warmstart-tests/vllm/. Only the few
source files a table names are read out of each wheel (no unpacking), so a cached run takes seconds.
A release whose wheel is not cached and cannot be downloaded (no registry) is skipped, saying so.
"""

from __future__ import annotations

import ast
import zipfile
from functools import cache

import pytest

from helpers.vllm_sources import dockerfile, wheel
from warmstart.vllm.logformats import EXTERNAL_SOURCES, log_format
from warmstart.vllm.releases import CUDA_RELEASES, RELEASES, WORDINGS, nearest_release, release_note


@cache
def opened(release: str) -> zipfile.ZipFile:
    """The release's wheel, opened once: its table of contents (about 5,800 entries) read again for each
    source file cost about 4 of this file's 16 s of CPU."""
    return zipfile.ZipFile(wheel(release))


@cache
def constants(release: str, source: str) -> tuple[str, ...] | None:
    """Every string literal of `vllm/<source>` in that release (implicit concatenations joined), or None."""
    try:
        text = opened(release).read(f"vllm/{source}").decode()
    except KeyError:
        return None
    tree = ast.parse(text)
    return tuple(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))


@pytest.mark.parametrize("release", RELEASES)
def test_release_table_strings_are_in_that_release(release):
    """Every marker of a release's table is a string in that release's file named beside it."""
    missing = []
    for spec in CUDA_RELEASES[release].markers:
        if spec.source in EXTERNAL_SOURCES:
            continue
        found = constants(release, spec.source)
        if found is None or not any(spec.fmt in s for s in found):
            missing.append(f"{spec.name}: {spec.source}: {spec.fmt!r}")
    assert missing == []


@pytest.mark.parametrize("release", RELEASES)
def test_a_changed_wording_is_absent_where_the_table_says(release):
    """A wording the table gives to other releases only is not in this release's file: the changes are real."""
    present = []
    own = {(s.name, s.fmt, s.source) for s in CUDA_RELEASES[release].markers}
    for w in WORDINGS:
        spec = w.spec
        if w.covers(release) or (spec.name, spec.fmt, spec.source) in own or spec.source in EXTERNAL_SOURCES:
            continue
        found = constants(release, spec.source) or ()
        # An untagged wording is a substring of the tagged one: only a whole literal counts as present then.
        if any(s == spec.fmt or (spec.fmt in s and not s.endswith(spec.fmt)) for s in found):
            present.append(f"{spec.name}: {spec.source}: {spec.fmt!r} (table: {w.since}..{w.until})")
    assert present == []


def test_the_newest_release_table_is_the_033_table():
    cuda = log_format("0.33.0", "cuda")
    assert cuda is not None
    assert {(s.name, s.fmt) for s in CUDA_RELEASES["0.33.0"].markers} == {(s.name, s.fmt) for s in cuda.markers}


def test_an_unknown_release_is_read_with_the_nearest_table_and_the_report_says_so():
    assert nearest_release("0.30.0") == ("0.30.0", True)
    assert nearest_release("0.30.0.dev7+gabc") == ("0.30.0", True)
    assert nearest_release("0.30.1") == ("0.30.0", False)
    assert nearest_release("0.20.0") == ("0.27.1", False)
    assert nearest_release("0.34.0") == ("0.33.0", False)
    assert release_note("0.33.0") is None
    assert release_note(None) is None
    assert "nearest release's (cuda-0.27.1)" in (release_note("0.26.0") or "")


# --------------------------------------------------------------------------- images.py: each release's Dockerfile


@pytest.mark.parametrize("release", RELEASES)
def test_image_cuda_is_read_from_each_releases_dockerfile(release):
    from warmstart.images import VLLM_IMAGES

    text = dockerfile(release)
    args = dict(line[4:].split("=", 1) for line in text.splitlines() if line.startswith("ARG ") and "=" in line)
    major, minor = args["CUDA_VERSION"].split(".")[:2]
    image = VLLM_IMAGES[f"v{release}"]
    assert image.cuda == f"{major}.{minor}"
    assert f"CUDA_VERSION={args['CUDA_VERSION']}" in image.source
    assert f"UBUNTU_VERSION={args['UBUNTU_VERSION']}" in image.source
    assert args["FINAL_BASE_IMAGE"] == "nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}"
    assert "ENV VLLM_ENABLE_CUDA_COMPATIBILITY=0" in text  # no forward compatibility: the host driver decides
