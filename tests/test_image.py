"""The image installs the product, never its tools: the wheel the Dockerfile's `pip install`
builds holds no test model, mock volume, scripted engine or benchmark, and the `warmstart`
it puts on PATH offers only what a user of the image needs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.run import REPO, WARMSTART

# Every module of the tools' package, by name (a product module of the same name, e.g. cli, is no tool).
_PRODUCT = {p.stem for p in (REPO / "src" / "warmstart").rglob("*.py")}
DEV_NAMES = (
    "warmstart_dev",
    *sorted({p.stem for p in (REPO / "tools" / "warmstart_dev").glob("*.py")} - _PRODUCT - {"__init__"}),
)
DEV_COMMANDS = ("testmodel", "bench")
USER_COMMANDS = (
    "key",
    "boot",
    "serve",
    "fetch",
    "report",
    "ls",
    "export",
    "verify",
    "explain",
    "gc",
    "timeline",
    "predict",
)


@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from exactly what the Dockerfile copies into the image."""
    dockerfile = (REPO / "Dockerfile").read_text()
    copies = re.findall(r"^COPY (.+) (/opt/warmstart-src/\S*)$", dockerfile, flags=re.M)
    assert copies, "the Dockerfile copies no source?"
    context = tmp_path_factory.mktemp("image") / "warmstart-src"
    context.mkdir()
    for sources, dest in copies:
        target = context / dest.removeprefix("/opt/warmstart-src/")
        for source in sources.split():
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            else:
                shutil.copy(REPO / source, target)
    dist = context.parent / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(dist), str(context)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("warmstart-*.whl")
    return wheel


def test_the_image_wheel_holds_no_dev_tool(image_wheel):
    names = zipfile.ZipFile(image_wheel).namelist()
    assert any(n == "warmstart/boot.py" for n in names), names
    tools = [n for n in names if any(dev in n for dev in DEV_NAMES)]
    assert tools == []
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(image_wheel).read(entry_points).decode()
    assert "warmstart-dev" not in scripts and "warmstart = warmstart.cli:main" in scripts


def test_the_image_wheel_ships_the_flag_table_and_the_installed_package_reads_it(image_wheel, tmp_path):
    """vLLM's option table is package data (vllm/flagtypes.json): a wheel without it would fail at import."""
    assert "warmstart/vllm/flagtypes.json" in zipfile.ZipFile(image_wheel).namelist()
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(image_wheel)], check=True, timeout=300)
    probe = "import warmstart.vllm.flagtypes as t; print(t.__file__, len(t.FLAGS), t.FLAGS['--max-num-seqs'].kind)"
    read = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {probe}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert read.returncode == 0, read.stderr
    where, rows, kind = read.stdout.split()
    assert where.startswith(str(target)) and int(rows) > 100 and kind == "int"


def test_warmstart_help_names_only_what_a_user_of_the_image_needs():
    result = subprocess.run([WARMSTART, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    offered = re.search(r"\{([a-z,]+)\}", result.stdout)
    assert offered is not None, result.stdout
    assert tuple(offered.group(1).split(",")) == USER_COMMANDS
    for dev in DEV_COMMANDS:
        assert re.search(rf"\b{dev}\b", result.stdout) is None, dev
        refused = subprocess.run([WARMSTART, dev, "--help"], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "invalid choice" in refused.stderr
