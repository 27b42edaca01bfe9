"""docs/development.md's source map is the tree's: `warmstart-dev sourcemap` writes it, and it is never stale."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers.run import REPO, WARMSTART_DEV
from warmstart_dev import sourcemap


def test_the_committed_map_is_the_trees():
    doc = (REPO / "docs" / "development.md").read_text()
    assert sourcemap.replace_section(doc, sourcemap.render(REPO)) == doc, (
        "docs/development.md's source map is stale: run `warmstart-dev sourcemap`"
    )


def _module(path: Path, docstring: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("" if docstring is None else f'"""{docstring}"""\n') + "X = 1\n")


def _tree(repo: Path) -> None:
    _module(repo / "src" / "warmstart" / "__init__.py", "The product.")
    _module(repo / "src" / "warmstart" / "key.py", "The cache key: which compiled artifacts a boot may reuse.\n\nMore.")
    _module(repo / "src" / "warmstart" / "store" / "__init__.py", "What lives on the volume.")
    _module(repo / "src" / "warmstart" / "store" / "markers.py", "Boots in progress: one marker file\nper worker.")
    _module(repo / "tools" / "warmstart_dev" / "__init__.py", "The tools.")
    _module(repo / "tools" / "warmstart_dev" / "bare.py", None)
    (repo / "docs").mkdir()
    (repo / "docs" / "development.md").write_text(
        f"# Development\n\nprose before\n\n{sourcemap.BEGIN}\nstale\n{sourcemap.END}\n\nprose after\n"
    )


def test_the_map_follows_the_tree_and_check_fails_while_the_doc_lags(tmp_path, capsys):
    _tree(tmp_path)
    doc = tmp_path / "docs" / "development.md"
    assert sourcemap.run(tmp_path, check=True) == 1
    assert "stale" in doc.read_text()  # --check changes nothing
    assert sourcemap.run(tmp_path, check=False) == 0
    text = doc.read_text()
    assert text.startswith("# Development\n\nprose before\n\n") and text.endswith("\n\nprose after\n")
    assert "- `key`: The cache key: which compiled artifacts a boot may reuse.\n" in text
    nested = "- `store/`: What lives on the volume.\n  - `markers`: Boots in progress: one marker file per worker.\n"
    assert nested in text
    assert "- `bare`\n" in text  # no docstring: listed bare, for a reader to notice
    assert sourcemap.run(tmp_path, check=True) == 0
    # A module renamed: the doc lags until the map is written again.
    (tmp_path / "src" / "warmstart" / "store" / "markers.py").rename(tmp_path / "src" / "warmstart" / "store" / "m.py")
    assert sourcemap.run(tmp_path, check=True) == 1
    assert "warmstart-dev sourcemap" in capsys.readouterr().err
    sourcemap.run(tmp_path, check=False)
    assert "`m`: Boots in progress" in doc.read_text() and "`markers`" not in doc.read_text()


def test_a_doc_without_the_markers_is_refused(tmp_path):
    _tree(tmp_path)
    (tmp_path / "docs" / "development.md").write_text("# Development\n")
    with pytest.raises(ValueError, match="markers"):
        sourcemap.run(tmp_path, check=False)


def test_the_command_checks_this_checkout():
    run = subprocess.run(
        [WARMSTART_DEV, "sourcemap", "--check", "--repo", str(REPO)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
