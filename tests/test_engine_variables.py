"""Every `vllm serve` flag as its UPPER_SNAKE variable (worker-vllm's args_builder.py), VLLM_CONFIG_FILE as
`--config`, removed flags warned about: the argv vLLM gets, and the key exactly where vLLM hashes the effect."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from warmstart.engine.concurrency import fit_concurrency
from warmstart.engine.process import engine_command, engine_flag_args, vllm_flags
from warmstart.engineflags import OWN_OPTIONS, env_name
from warmstart.hardware import Hardware, engine_world_size
from warmstart.key import derive_key
from warmstart.model import ResolvedModel
from warmstart.settings import SettingsError, from_env
from warmstart.variables import BY_NAME, CURATED_FLAGS, ENGINE_FLAGS, REMOVED_FLAGS
from warmstart.vllm.flagtypes import FLAGS
from warmstart.vllm.install import EngineInfo

BASE = {"MODEL_NAME": "org/model", "WARMSTART_FIT_CONCURRENCY": "0"}  # the fit's own flag: test_concurrency's
FIXTURES = Path(__file__).parent / "fixtures"
MODEL = ResolvedModel("org/model", "org/model", "a" * 40, Path("/snap"), "hf-cache", 3, 100)
GPU = Hardware("gpu", "NVIDIA H200", "9.0", 1)
CUDA = EngineInfo("/py", "vllm", "0.33.0", "2.10.0+cu129", "3.5.0", "3.12.3")


def args(**env: str) -> list[str]:
    return engine_flag_args(from_env({**BASE, **env}))


def key(**env: str) -> str:
    return derive_key(from_env({**BASE, **env}), MODEL, GPU, CUDA).digest


def problems(**env: str) -> list[str]:
    with pytest.raises(SettingsError) as info:
        from_env({**BASE, **env})
    return info.value.problems


def test_a_flag_outside_the_curated_table_is_its_variable():
    assert args(ENABLE_EXPERT_PARALLEL="true") == ["--enable-expert-parallel"]
    assert args(MAX_LOG_LEN="100") == ["--max-log-len", "100"]
    assert args(ALL2ALL_BACKEND="naive") == ["--all2all-backend", "naive"]
    assert args(CPU_OFFLOAD_GB="1.5") == ["--cpu-offload-gb", "1.5"]
    # a flag that takes several words gets the value's words
    assert args(CUDAGRAPH_CAPTURE_SIZES="1 2 4") == ["--cudagraph-capture-sizes", "1", "2", "4"]
    assert args(KERNEL_CONFIG='{"enable_flashinfer_autotune": false}') == [
        "--kernel-config",
        '{"enable_flashinfer_autotune": false}',
    ]


def test_a_paired_boolean_false_gives_its_other_side_and_a_store_true_flag_false_gives_nothing():
    assert args(ENABLE_EXPERT_PARALLEL="false") == ["--no-enable-expert-parallel"]
    assert args(ASYNC_SCHEDULING="0") == ["--no-async-scheduling"]
    # 0.33's `--disable-x`, whose other side has no `--no-` spelling: its `--enable-x`
    assert args(DISABLE_DBO="no") == ["--enable-dbo"]
    # store-true (no other side in either parser)
    assert args(AGGREGATE_ENGINE_LOGGING="false") == []
    assert args(AGGREGATE_ENGINE_LOGGING="true") == ["--aggregate-engine-logging"]


def test_bad_values_of_derived_variables_are_one_line_each_before_anything_starts():
    assert sorted(problems(MAX_LOG_LEN="many", ENABLE_EXPERT_PARALLEL="maybe", KERNEL_CONFIG="{no")) == [
        "ENABLE_EXPERT_PARALLEL='maybe': expected true/false (or 1/0, yes/no, on/off)",
        "KERNEL_CONFIG: not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        "MAX_LOG_LEN='many': expected an integer",
    ]


def test_every_option_of_vllms_parser_is_a_variable_or_said_why_not():
    """Derived from the flag table, not hand-listed: each long option is a variable's flag or its `false`
    side, or one warmstart sets itself; and each engine variable's flags are options of vLLM's parser.
    The `--no-` side of a curated "bool" (ENFORCE_EAGER) is vLLM's default False: `false` leaves it unset."""
    reachable = {v.flag for v in ENGINE_FLAGS} | {v.off_flag for v in ENGINE_FLAGS if v.off_flag}
    reachable |= {"--no-" + str(v.flag)[2:] for v in ENGINE_FLAGS if v.kind in ("pair_bool", "bool")}
    removed = {"--" + name.lower().replace("_", "-") for name in REMOVED_FLAGS}  # DISABLE_LOG_REQUESTS: 0.33 only
    missing = [o for o in FLAGS if o.startswith("--") and o not in reachable | OWN_OPTIONS | removed]
    assert missing == []
    for var in ENGINE_FLAGS:
        assert var.flag in FLAGS, var.env
        if var.off_flag:
            on, off = FLAGS[var.flag], FLAGS[var.off_flag]
            assert (off.dest, {on.kind, off.kind}) == (on.dest, {"true", "false"}), var.env
    derived = [v for v in ENGINE_FLAGS if v not in CURATED_FLAGS]
    assert len(derived) > 300 and all(v.env == env_name(str(v.flag)) for v in derived)


def test_the_curated_entries_keep_their_sentences_and_key_column():
    assert BY_NAME["MAX_MODEL_LEN"].doc == "context length in tokens"
    assert BY_NAME["TOKENIZER_NAME"].flag == "--tokenizer" and not BY_NAME["TOKENIZER_NAME"].in_key
    # a curated name and a derived one for one flag: the curated one comes last, and argparse keeps the last
    assert args(TOKENIZER="a/derived", TOKENIZER_NAME="a/curated")[-2:] == ["--tokenizer", "a/curated"]


@pytest.mark.parametrize("env", [{"ENABLE_EXPERT_PARALLEL": "true"}, {"ENABLE_DBO": "true"}, {"MAX_LOG_LEN": "9"}])
def test_a_derived_flag_vllm_may_hash_changes_the_key(env):
    assert key(**env) != key()


@pytest.mark.parametrize(
    "env",
    [
        # vLLM leaves these dests out of its hash (vllm/hashing.py, checked against vLLM): any spelling
        {"DISABLE_PREFIX_CACHING": "true"},
        {"DISABLE_CASCADE_ATTN": "true"},
        {"ENABLE_FLASHINFER_AUTOTUNE": "false"},
        {"UVICORN_LOG_LEVEL": "warning"},
        {"USE_TQDM_ON_LOAD": "false"},
    ],
)
def test_a_derived_flag_vllm_does_not_hash_keeps_the_key(env):
    assert key(**env) == key()
    assert not BY_NAME[next(iter(env))].in_key


def test_removed_flags_warn_once_naming_the_replacement_and_give_nothing():
    s = from_env({**BASE, "ROPE_THETA": "1e6", "SWAP_SPACE": "4"})
    assert [str(w) for w in s.warnings if "ROPE_THETA" in str(w) or "SWAP_SPACE" in str(w)] == [
        "ROPE_THETA is ignored: vLLM removed the flag it set (put rope_theta in HF_OVERRIDES)",
        "SWAP_SPACE is ignored: vLLM removed the flag it set (vLLM V1 has no swap space; no replacement)",
    ]
    assert engine_flag_args(s) == []


def test_removed_flags_are_in_neither_parser_and_name_replacements_that_exist():
    for name, instead in REMOVED_FLAGS.items():
        if name not in ("DISABLE_LOG_REQUESTS", "VLLM_ATTENTION_BACKEND"):  # 0.33-only; an environment variable
            assert "--" + name.lower().replace("_", "-") not in FLAGS, name
        assert name not in BY_NAME, name
        named = set(re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", instead))
        assert named <= set(BY_NAME), (name, named - set(BY_NAME))


def test_config_file_is_given_as_config_and_enters_the_key_only_with_settings_vllm_hashes():
    keyed, serving = FIXTURES / "vllm-config-keyed.yaml", FIXTURES / "vllm-config-serving.yaml"
    s = from_env({**BASE, "VLLM_CONFIG_FILE": str(keyed)})
    command = engine_command(CUDA, s, Path("/snap"), 8000)
    assert command[command.index("--config") + 1] == str(keyed)
    assert s.config_args == ("--max-num-seqs", "4", "--gpu-memory-utilization", "0.5")
    assert key(VLLM_CONFIG_FILE=str(keyed)) != key()
    assert key(VLLM_CONFIG_FILE=str(keyed)) == key(MAX_NUM_SEQS="4")  # the file's flag, not its path
    assert key(VLLM_CONFIG_FILE=str(serving)) == key()


def test_config_file_settings_rank_below_the_variables_as_vllm_ranks_them(tmp_path):
    (config := tmp_path / "c.yml").write_text("max-num-seqs: 4\nenforce-eager: true\n")
    assert key(VLLM_CONFIG_FILE=str(config), MAX_NUM_SEQS="8") == key(MAX_NUM_SEQS="8", ENFORCE_EAGER="1")
    # the fit leaves a file's max-num-seqs alone: a fitted flag on the command line would beat it
    fit = fit_concurrency(from_env({"MODEL_NAME": "org/model", "VLLM_CONFIG_FILE": str(config)}))
    assert fit.max_num_seqs is None
    assert fit.reason == "VLLM_CONFIG_FILE gives --max-num-seqs: not fitted to MAX_CONCURRENCY"


def test_config_file_as_vllm_reads_it(tmp_path):
    """vLLM's load_config_file (utils/argparse_utils.py, 0.32.0 and 0.33.0): `false` is `--no-<key>` where the
    parser has it, else nothing; a list is its items; a mapping its JSON."""
    (config := tmp_path / "c.yaml").write_text(
        "enable-prefix-caching: false\nenforce-eager: false\ndisable-log-stats: false\n"
        "cudagraph-capture-sizes: [1, 2]\ncompilation-config: {level: 3}\n"
    )
    s = from_env({**BASE, "VLLM_CONFIG_FILE": str(config)})
    assert s.config_args == (
        "--no-enable-prefix-caching",
        "--no-enforce-eager",
        "--cudagraph-capture-sizes",
        "1",
        "2",
        "--compilation-config",
        '{"level": 3}',
    )


def test_a_config_file_vllm_would_refuse_is_one_line_before_anything_starts(tmp_path):
    (bad := tmp_path / "c.yaml").write_text("max-model-length: 256\nport: 9\n")
    (json_file := tmp_path / "c.json").write_text("{}")
    assert problems(VLLM_CONFIG_FILE=str(bad)) == [
        "VLLM_CONFIG_FILE: --port is set by warmstart and cannot be overridden",
        "VLLM_CONFIG_FILE: --max-model-length is not a flag of vLLM's serve (did you mean --max-model-len?)",
    ]
    assert problems(VLLM_CONFIG_FILE=str(json_file)) == [
        f"VLLM_CONFIG_FILE={str(json_file)!r}: must be a .yaml or .yml file, as vLLM requires ('json' given)"
    ]
    assert problems(VLLM_CONFIG_FILE=str(tmp_path / "absent.yaml"))[0].startswith("VLLM_CONFIG_FILE=")


def test_the_gpu_count_reads_the_config_file_and_every_parallel_variable(tmp_path):
    """TP x PP x PCP x DP from every source vLLM reads, ranked as vLLM ranks them (plan.detect_engine_hardware)."""
    (config := tmp_path / "c.yaml").write_text("tensor-parallel-size: 2\npipeline-parallel-size: 2\n")
    s = from_env({**BASE, "VLLM_CONFIG_FILE": str(config), "PIPELINE_PARALLEL_SIZE": "1"})
    assert engine_world_size({}, vllm_flags(s)) == 2  # the variable beats the file's pipeline size
    s = from_env({**BASE, "PREFILL_CONTEXT_PARALLEL_SIZE": "2", "DATA_PARALLEL_SIZE_LOCAL": "3"})
    assert engine_world_size({}, vllm_flags(s)) == 6


def test_a_stray_zero_batch_budget_is_vllms_default_with_a_warning_as_in_worker_vllm():
    s = from_env({**BASE, "MAX_NUM_BATCHED_TOKENS": "0"})
    assert engine_flag_args(s) == []
    assert [str(w) for w in s.warnings] == [
        "MAX_NUM_BATCHED_TOKENS=0 is refused by vLLM (it must be at least 1): read as unset, vLLM's default"
    ]
    assert args(SEED="0") == ["--seed", "0"]  # not general: a seed of 0 is a seed


def test_one_config_file_only_as_vllm_allows():
    """utils/argparse_utils.py `_pull_args_from_config`: `assert args.count("--config") <= 1`."""
    assert problems(VLLM_CONFIG_FILE=str(FIXTURES / "vllm-config-serving.yaml"), VLLM_EXTRA_ARGS="--config x.yaml") == [
        "VLLM_EXTRA_ARGS: --config and VLLM_CONFIG_FILE both name a config file; vLLM takes one"
    ]
