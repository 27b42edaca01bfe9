"""vllm/argv.py: one reading of vLLM's command line for every part of warmstart that scans it."""

from __future__ import annotations

from warmstart.key import key_extra_args
from warmstart.redact import Redactor, secret_flag_values
from warmstart.secrets import MASK
from warmstart.settings import from_env
from warmstart.vllm.argv import VOLATILE_FLAGS, Occurrence, flags, last_flag_value, parse_argv, without_flags


def test_the_forms_of_a_flag():
    occ = parse_argv(["serve", "/m", "--dtype=half", "-tp", "2", "--api-key", "k1", "k2", "--no-enforce-eager", "-dp"])
    assert occ == (
        Occurrence(None, ("serve",), ("serve",)),
        Occurrence(None, ("/m",), ("/m",)),
        Occurrence("--dtype", ("half",), ("--dtype=half",)),
        Occurrence("-tp", ("2",), ("-tp", "2")),
        Occurrence("--api-key", ("k1", "k2"), ("--api-key", "k1", "k2")),
        Occurrence("--no-enforce-eager", (), ("--no-enforce-eager",)),
        Occurrence("-dp", (), ("-dp",)),
    )
    assert occ[2].inline and not occ[3].inline


def test_a_flag_is_named_as_vllms_parser_names_it_and_kept_as_written():
    # utils/argparse_utils.py FlexibleArgumentParser.parse_args: `_` -> `-` between `--` and the first `.`.
    occ = parse_argv(["--max_num_seqs", "4", "--enforce_eager", "--compilation_config.cudagraph_capture_sizes=[1]"])
    assert [o.flag for o in occ] == [
        "--max-num-seqs",
        "--enforce-eager",
        "--compilation-config.cudagraph_capture_sizes",
    ]
    assert [o.tokens for o in occ] == [
        ("--max_num_seqs", "4"),
        ("--enforce_eager",),
        ("--compilation_config.cudagraph_capture_sizes=[1]",),
    ]
    assert parse_argv(["-t_p", "2"])[0].flag == "-t_p", "single-dash flags are left alone"
    assert Redactor().argv(["--api_key", "sk-first-111"]) == ["--api_key", MASK]


def test_a_flag_takes_one_word_a_boolean_none_a_number_is_a_value():
    assert [o.flag for o in parse_argv(["--seed", "-1", "--enforce-eager", "x"])] == ["--seed", "--enforce-eager", None]
    assert parse_argv(["--seed", "-1"])[0].values == ("-1",)
    assert flags(["--a", "--", "--b"]) == ["--a"]


def test_last_flag_value_is_argparses_last():
    assert last_flag_value(["-tp", "2", "--tensor-parallel-size=4"], ("--tensor-parallel-size", "-tp")) == "4"
    assert last_flag_value(["--device-ids", "0,1", "--device-ids"], ("--device-ids",)) == "0,1"
    assert last_flag_value(["--seed", "3"], ("--device-ids",)) is None


def test_without_flags_keeps_everything_else_as_written():
    argv = ["-m", "vllm.entrypoints.cli.main", "serve", "/m", "--host", "127.0.0.1", "--port", "8000"]
    argv += ["--served-model-name", "a/b", "--max-num-seqs", "4"]
    assert without_flags(argv, VOLATILE_FLAGS) == [
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "/m",
        "--max-num-seqs",
        "4",
    ]


def test_every_value_of_a_multi_valued_secret_flag_is_masked_and_kept_out_of_the_key():
    extra = ("--api-key", "sk-first-111", "sk-second-222", "--max-num-seqs", "4")
    assert secret_flag_values(extra) == ["sk-first-111", "sk-second-222"]
    assert Redactor().argv(extra) == ["--api-key", MASK, MASK, "--max-num-seqs", "4"]
    assert Redactor().argv(["--hf-token=hf_abcdef"]) == [f"--hf-token={MASK}"]
    assert key_extra_args(extra) == ["--max-num-seqs", "4"]
    settings = from_env({"MODEL_NAME": "a/b", "VLLM_EXTRA_ARGS": "--api-key sk-first-111 sk-second-222"})
    assert settings.engine_api_key == "sk-first-111"


def test_refused_flags_are_found_in_any_form():
    # vLLM reads `--download_dir` as `--download-dir` (utils/argparse_utils.py): so does the refusal.
    for extra in ("--port 9000", "--host=0.0.0.0", "--seed 1 --download-dir /x", "--download_dir=/x"):
        try:
            from_env({"MODEL_NAME": "a/b", "VLLM_EXTRA_ARGS": extra})
        except ValueError as exc:
            assert "is set by warmstart" in str(exc)
        else:
            raise AssertionError(extra)
