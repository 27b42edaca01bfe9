"""The error tree: every error of the wrapper is a WarmstartError, keeps the builtin base code catches it
by, and reaches the user as one `warmstart | STAGE | ...` line with its class's exit status (cli.dispatch)."""

from __future__ import annotations

import argparse
import logging

import pytest

from warmstart import cli, errors
from warmstart.engine.process import EngineFailed
from warmstart.hardware import HardwareError
from warmstart.model import ModelError
from warmstart.settings import SettingsError
from warmstart.store.bundle import StoreError, StoreUnavailable
from warmstart.store.deadline import DeadlinePassed
from warmstart.vllm.install import EngineNotFound
from warmstart.worker.handler import InputError

SECRET = "hf_secretvalue0123456789"

# The statuses as the docs and the end-to-end tests know them (2: configuration, 3: vLLM died).
STATUSES = [
    (SettingsError(["MODEL_NAME is required"]), 2, "settings"),
    (ModelError("m: download failed"), 2, "error"),
    (HardwareError("no GPU named"), 2, "error"),
    (EngineNotFound("no vllm"), 2, "error"),
    (EngineFailed("vLLM exited with code 1 before it was ready", ["boom"], 1), 3, "engine"),
    (StoreError("bad bundle", "b1"), None, "store"),
    (StoreUnavailable("unreachable"), None, "store"),
    (DeadlinePassed("too slow"), None, "store"),
    (InputError("bad input"), None, "input"),
]


@pytest.mark.parametrize(("exc", "status", "stage"), STATUSES, ids=lambda v: type(v).__name__)
def test_each_error_is_in_the_tree_with_its_status_and_stage(exc, status, stage):
    assert isinstance(exc, errors.WarmstartError)
    assert exc.exit_code == status
    assert exc.stage == stage


def test_the_builtin_bases_stay_so_old_excepts_still_catch():
    assert issubclass(SettingsError, ValueError) and issubclass(InputError, ValueError)
    for cls in (ModelError, HardwareError, EngineNotFound, EngineFailed, StoreError):
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(DeadlinePassed, StoreUnavailable) and issubclass(StoreUnavailable, StoreError)


def test_the_old_names_are_the_tree_classes():
    assert SettingsError is errors.SettingsError and StoreError is errors.StoreError
    assert EngineFailed is errors.EngineFailed and InputError is errors.InputError


def test_exit_code_three_is_defined_once():
    from warmstart.worker import serve

    assert errors.EXIT_ENGINE == 3 and errors.EXIT_CONFIG == 2
    assert not hasattr(serve, "EXIT_ENGINE_DIED")
    assert cli.EXIT_CONFIG is errors.EXIT_CONFIG


@pytest.fixture
def lines():
    """What the `warmstart` logger writes, message by message (as cli.setup_logging formats it)."""
    got: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    logger = logging.getLogger("warmstart")
    handler = Collect()
    logger.addHandler(handler)
    yield got
    logger.removeHandler(handler)


def run(exc: BaseException) -> int:
    def func(_args: argparse.Namespace) -> int:
        raise exc

    return cli.dispatch(argparse.Namespace(func=func))


def test_dispatch_turns_a_hub_error_into_one_redacted_line_and_exit_two(lines, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert run(ModelError(f"m: download failed with {SECRET}\n  is the Hub reachable?")) == 2
    assert lines == ["warmstart | error    | m: download failed with *** is the Hub reachable?"]


def test_dispatch_keeps_the_settings_problems_one_per_line(lines):
    assert run(SettingsError(["A is bad", "B is bad"])) == 2
    assert lines == ["warmstart | settings | invalid configuration: \n  A is bad\n  B is bad"]


def test_dispatch_keeps_vllms_last_lines_and_exits_three(lines):
    assert run(EngineFailed("vLLM exited with code 1 before it was ready", ["a", "b"], 1)) == 3
    assert lines == [
        "warmstart | engine   | vLLM exited with code 1 before it was ready\n--- last lines of vLLM's log ---\na\nb"
    ]


@pytest.mark.parametrize("exc", [StoreError("bad"), InputError("bad"), KeyError("bug")], ids=lambda e: type(e).__name__)
def test_dispatch_lets_errors_meant_to_be_handled_inside_keep_their_traceback(exc, lines):
    with pytest.raises(type(exc)):
        run(exc)
    assert lines == []
