"""The fit to the worker's concurrency (engine/concurrency.py): settings -> vLLM's argv, from plain dicts.

For every way a user can choose max_num_seqs or the CUDA graph capture sizes (variables, and the
spellings vLLM 0.33's parser takes in VLLM_EXTRA_ARGS), warmstart adds nothing and the user's value is
the one vLLM reads; with nothing chosen, vLLM gets `--max-num-seqs MAX_CONCURRENCY`. vLLM's own parser
reading these argvs is tests/vllm/test_vllm_hash.py's.
"""

from __future__ import annotations

import dataclasses
import io
import logging
from pathlib import Path

import pytest

from helpers.run import base_env
from helpers.spellings import USER_SEQS, USER_SIZES
from warmstart.boot import Boot
from warmstart.engine.concurrency import (
    ConcurrencyFit,
    dest_as_vllm_reads,
    fit_concurrency,
    fit_words,
    user_choice,
    vllm_default_words,
)
from warmstart.engine.process import engine_command, engine_flag_args
from warmstart.key import derive_key
from warmstart.plan import plan_boot
from warmstart.redact import Redactor
from warmstart.settings import from_env
from warmstart.vllm.argv import last_flag_value, parse_argv
from warmstart.vllm.argvalues import parsed_values
from warmstart.vllm.install import EngineInfo

CUDA = EngineInfo("/opt/vllm/bin/python", "vllm", "0.33.0", "2.10.0", None, "3.12.1")
BASE = {"MODEL_NAME": "org/model"}

# Compilation settings that leave the sizes to vLLM: the fit applies.
OTHER_COMPILATION = [
    {"COMPILATION_CONFIG": '{"mode": 3}'},
    {"VLLM_EXTRA_ARGS": """-cc '{"cudagraph_mode": "PIECEWISE"}'"""},
    {"VLLM_EXTRA_ARGS": "-cc.mode 3 --max-num-batched-tokens 4096"},
    {"ENFORCE_EAGER": "true"},
]


def settings(env: dict[str, str]):
    return from_env({**BASE, **env})


def vllm_reads(env: dict[str, str]) -> dict:
    """What vLLM's parser sets from the command line warmstart starts it with (after the model)."""
    argv = engine_command(CUDA, settings(env), Path("/snap"), 8000)
    return parsed_values(argv[5:])


def added_by_warmstart(env: dict[str, str]) -> list[str]:
    """The engine flags warmstart itself adds, beside the variables' own."""
    s = settings(env)
    return fit_concurrency(s).args


@pytest.mark.parametrize("concurrency", ["1", "4", "30", "256"])
def test_nothing_chosen_fits_max_num_seqs_to_max_concurrency(concurrency):
    env = {"MAX_CONCURRENCY": concurrency}
    assert engine_flag_args(settings(env)) == ["--max-num-seqs", concurrency]
    assert vllm_reads(env)["max_num_seqs"] == int(concurrency)
    assert "cudagraph_capture_sizes" not in vllm_reads(env)  # vLLM derives the sizes itself


def test_the_default_max_concurrency_is_worker_vllms_30():
    fit = fit_concurrency(settings({}))
    assert (fit.max_num_seqs, fit.reason) == (30, "max_num_seqs 30 fitted to MAX_CONCURRENCY=30")


@pytest.mark.parametrize(("env", "value"), USER_SEQS, ids=lambda v: repr(v))
@pytest.mark.parametrize("concurrency", [{}, {"MAX_CONCURRENCY": "2"}])
def test_a_chosen_max_num_seqs_wins(env, value, concurrency):
    both = {**concurrency, **env}
    assert added_by_warmstart(both) == []
    assert "not fitted" in fit_concurrency(settings(both)).reason
    seqs = [
        o
        for o in parse_argv(engine_command(CUDA, settings(both), Path("/s"), 1))
        if o.flag and dest_as_vllm_reads(o.flag)[0] == "max_num_seqs"
    ]
    assert seqs[-1].value == str(value)  # argparse keeps the last: the user's (vLLM's parser: test_vllm_hash.py)
    assert len(seqs) == 1 + ("MAX_NUM_SEQS" in env and "VLLM_EXTRA_ARGS" in env)


@pytest.mark.parametrize("env", USER_SIZES, ids=lambda v: repr(v))
def test_chosen_capture_sizes_leave_max_num_seqs_to_vllm(env):
    assert added_by_warmstart(env) == []
    assert "max_num_seqs" not in vllm_reads(env)
    assert "not fitted" in fit_concurrency(settings(env)).reason


@pytest.mark.parametrize("env", OTHER_COMPILATION, ids=lambda v: repr(v))
def test_other_compilation_settings_are_fitted(env):
    assert added_by_warmstart(env) == ["--max-num-seqs", "30"]
    assert vllm_reads(env)["max_num_seqs"] == 30


@pytest.mark.parametrize("env", [{}, {"MAX_CONCURRENCY": "4"}, *USER_SIZES[:2], USER_SEQS[1][0]], ids=repr)
def test_off_adds_nothing(env):
    off = {**env, "WARMSTART_FIT_CONCURRENCY": "0"}
    assert added_by_warmstart(off) == []
    assert fit_concurrency(settings(off)).reason == "WARMSTART_FIT_CONCURRENCY=0: max_num_seqs left to vLLM"
    assert "--max-num-seqs" not in engine_flag_args(settings(off))


def test_a_config_file_is_left_alone(tmp_path):
    """vLLM reads `--config FILE` below the command line (argparse_utils.py `_pull_args_from_config`:
    "cli > config > defaults"): a fitted flag would override the file's max-num-seqs. `--config FILE`
    in VLLM_EXTRA_ARGS is read as VLLM_CONFIG_FILE is (its flags, not its path)."""
    (config := tmp_path / "vllm.yaml").write_text("max-num-seqs: 8\n")
    env = {"VLLM_EXTRA_ARGS": f"--config {config}"}
    assert added_by_warmstart(env) == []
    assert "VLLM_CONFIG_FILE gives --max-num-seqs" in fit_concurrency(settings(env)).reason


def test_fitted_flag_comes_before_extra_args():
    """Were a spelling ever missed, the user's flag still comes last, and argparse keeps the last."""
    argv = engine_command(CUDA, settings({"VLLM_EXTRA_ARGS": "--uvicorn-log-level warning"}), Path("/s"), 1)
    assert argv.index("--max-num-seqs") < argv.index("--uvicorn-log-level")


@pytest.mark.parametrize(
    ("flag", "dest"),
    [
        ("--max-num-seqs", ("max_num_seqs", "")),
        ("--max_num_seqs", ("max_num_seqs", "")),
        ("--max-num-s", (None, "")),  # ambiguous: --max-num-scheduled-tokens too
        ("-cc.cudagraph_capture_sizes+", ("compilation_config", "cudagraph_capture_sizes")),
        ("--compilation_config.a.b", ("compilation_config", "a.b")),
        ("--config", ("config", "")),
        ("--nonexistent-flag", (None, "")),
    ],
)
def test_option_names_as_vllms_parser_reads_them(flag, dest):
    assert dest_as_vllm_reads(flag) == dest


def test_user_choice_names_what_was_chosen():
    assert user_choice({"MAX_NUM_SEQS": "8"}, ()) == "MAX_NUM_SEQS=8"
    assert user_choice({}, ("--max_num_seqs", "8")) == "VLLM_EXTRA_ARGS gives --max_num_seqs"
    assert user_choice({"COMPILATION_CONFIG": "{not json"}, ()) is None  # settings refuse it before this
    assert user_choice({}, ("--seed", "3")) is None


def test_fit_words_say_what_was_chosen_and_why():
    assert fit_words(fit_concurrency(settings({"MAX_CONCURRENCY": "4"})), "cpu") == (
        "max_num_seqs 4 fitted to MAX_CONCURRENCY=4 (vLLM's default here would be 128)"
    )
    assert fit_words(fit_concurrency(settings({"MAX_NUM_SEQS": "8"})), "gpu") == (
        "MAX_NUM_SEQS=8: not fitted to MAX_CONCURRENCY"
    )


def test_default_words_claim_only_what_warmstart_knows():
    assert vllm_default_words("cpu") == "vLLM's default here would be 128"
    assert vllm_default_words("cpu", 2) == "vLLM's default here would be 128 x TP x PP"
    gpu = vllm_default_words("gpu")
    assert "1024 on a GPU of 70 GiB or more" in gpu and "256" in gpu


def test_the_plan_decides_the_fit_once_and_the_argv_the_key_and_the_engine_stage_read_it(
    tmp_path, volume, tiny_model, fake_vllm_python, caplog
):
    """plan_boot decides the fit (BootPlan.fit); the key's args and the boot's argv and log line are read
    from that one decision, not recomputed from the settings: a plan that carries another decision starts
    vLLM with it and says so."""
    env = base_env(volume, fake_vllm_python, tmp_path, MAX_CONCURRENCY="6", WARMSTART_CACHE_MODE="direct")
    del env["MAX_NUM_SEQS"]  # a user's value would leave nothing to fit
    plan = plan_boot(from_env(env), write=False)
    assert plan.fit == fit_concurrency(plan.settings) and plan.fit.max_num_seqs == 6
    assert plan.key.factors["args"]["max_num_seqs"] == 6

    other = ConcurrencyFit(3, "max_num_seqs 3 decided elsewhere")
    assert (
        derive_key(plan.settings, plan.model, plan.hardware, plan.engine, plan.derived_env, fit=other).factors["args"][
            "max_num_seqs"
        ]
        == 3
    )
    for fit, seqs in ((plan.fit, "6"), (other, "3")):
        caplog.clear()
        boot = Boot(dataclasses.replace(plan, fit=fit), Redactor(), echo=io.StringIO())
        try:
            with caplog.at_level(logging.INFO, logger="warmstart"):
                boot.start()
            assert boot.engine is not None
            assert last_flag_value(boot.engine.argv, ("--max-num-seqs",)) == seqs
        finally:
            boot.stop()
        (line,) = [r.getMessage() for r in caplog.records if "starting vLLM" in r.getMessage()]
        assert fit.reason in line
