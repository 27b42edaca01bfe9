"""Job input shapes (pure parsing) and the handler's forwarding, against the scripted engine."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request

import pytest

from helpers.run import REPO
from warmstart.engine.ports import free_port
from warmstart.worker.handler import (
    EngineRequest,
    InputError,
    JobHandler,
    SSEParser,
    WarmstartQuery,
    make_handler,
    parse_job_input,
)

SERVED = "org/model"


def parse(job_input):
    return parse_job_input(job_input, SERVED)


def test_openai_route_with_input_posts_with_model_filled_in():
    req = parse({"openai_route": "/v1/chat/completions", "openai_input": {"messages": [{"role": "user"}]}})
    assert req == EngineRequest(
        "/v1/chat/completions", "POST", {"model": SERVED, "messages": [{"role": "user"}]}, False, True
    )


def test_openai_route_without_input_is_a_get():
    assert parse({"openai_route": "/v1/models"}) == EngineRequest("/v1/models", "GET", None, False, True)


def test_explicit_model_is_kept_and_stream_is_read():
    req = parse({"openai_route": "/v1/completions", "openai_input": {"model": "x", "prompt": "a", "stream": True}})
    assert req.body == {"model": "x", "prompt": "a", "stream": True}
    assert req.stream is True


def test_route_body_method():
    assert parse({"route": "/tokenize", "body": {"prompt": "hi"}}).method == "POST"
    assert parse({"route": "/v1/models"}).method == "GET"
    assert parse({"route": "/v1/models", "method": "get"}).method == "GET"


def test_legacy_prompt_and_messages():
    req = parse({"prompt": "Hello", "sampling_params": {"max_tokens": 5, "temperature": 0.5}})
    assert req == EngineRequest(
        "/v1/completions",
        "POST",
        {"model": SERVED, "max_tokens": 5, "temperature": 0.5, "prompt": "Hello", "stream": False},
        False,
        False,
    )
    req = parse({"messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert (req.route, req.stream, req.raw_events) == ("/v1/chat/completions", True, False)


def test_boot_report_query():
    assert parse({"warmstart": "boot_report"}) == WarmstartQuery("boot_report")


@pytest.mark.parametrize(
    ("job_input", "message"),
    [
        ("just a string", "job input must be a JSON object, got string"),
        ([1, 2], "job input must be a JSON object, got array"),
        (None, "job input must be a JSON object, got NoneType"),
        ({}, "none of the accepted shapes"),
        ({"foo": 1}, "got keys: foo"),
        ({"openai_route": "/sleep"}, "route '/sleep' is not served by this worker"),
        ({"openai_route": "/collective_rpc", "openai_input": {"method": "x"}}, "is not served"),
        ({"route": "/v1/load_lora_adapter", "body": {}}, "is not served"),
        ({"route": "/v1/../sleep", "body": {}}, "is not served"),
        ({"route": "/v1/chat/completions", "method": "DELETE"}, "accepts POST, not DELETE"),
        ({"openai_route": 42}, "'openai_route' must be a string"),
        ({"openai_route": "/v1/completions", "openai_input": "text"}, "'openai_input' must be an object"),
        ({"prompt": 5}, "'prompt' must be a string"),
        ({"prompt": "a", "sampling_params": [1]}, "'sampling_params' must be an object"),
        ({"prompt": "a", "stream": "yes"}, "'stream' must be true or false"),
        ({"messages": "hi"}, "'messages' must be a non-empty array"),
        ({"warmstart": "secrets"}, "'warmstart' must be one of boot_report"),
        ({"route": "/v1/completions", "body": {"stream": 1}}, "'body.stream' must be true or false"),
    ],
)
def test_bad_input_says_what_was_wrong(job_input, message):
    with pytest.raises(InputError) as info:
        parse(job_input)
    assert message in str(info.value)


def test_the_engine_session_does_not_cap_concurrency_below_max_concurrency():
    """MAX_CONCURRENCY may exceed aiohttp's default pool of 100 connections; the SDK's
    concurrency modifier is the only limit."""
    state = JobHandler("http://127.0.0.1:1", SERVED, 5, lambda: None, lambda: None)

    async def limit() -> int:
        session = await state.session()
        try:
            return session.connector.limit
        finally:
            await session.close()

    assert asyncio.run(limit()) == 0


@pytest.fixture
def fake_engine(tmp_path, fake_vllm_python):
    """The scripted engine serving on loopback (for the handler's plumbing only)."""
    port = free_port()
    env = {**os.environ, "FAKE_SERVED": SERVED, "FAKE_VLLM_MODE": "ok"}
    proc = subprocess.Popen(
        [fake_vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}", proc
    os.killpg(proc.pid, 9)
    proc.wait()


def run_job(state: JobHandler, job_input) -> list:
    async def collect():
        out = [item async for item in make_handler(state)({"id": "j", "input": job_input})]
        if state._session is not None:
            await state._session.close()
        return out

    return asyncio.run(collect())


def test_forwarding_and_streams(fake_engine):
    url, _ = fake_engine
    state = JobHandler(url, SERVED, 10, lambda: {"verdict": "warm"}, lambda: None)
    (result,) = run_job(state, {"prompt": "hi", "sampling_params": {"max_tokens": 3}})
    assert result["route"] == "/v1/completions"
    assert result["echo"] == {"model": SERVED, "max_tokens": 3, "prompt": "hi", "stream": False}
    chunks = run_job(state, {"prompt": "hi", "stream": True})
    assert [c["choices"][0]["text"] for c in chunks] == ["t0", "t1", "t2"]
    raw = run_job(state, {"openai_route": "/v1/completions", "openai_input": {"prompt": "hi", "stream": True}})
    assert raw[-1] == "data: [DONE]\n\n"
    assert json.loads(raw[0].removeprefix("data: "))["choices"][0]["text"] == "t0"
    assert run_job(state, {"warmstart": "boot_report"}) == [{"verdict": "warm"}]
    (error,) = run_job(state, {"openai_route": "/v1/completions", "openai_input": {"model": "other", "prompt": "x"}})
    assert error == {"error": "vLLM answered HTTP 404 on /v1/completions: The model `other` does not exist."}
    (bad,) = run_job(state, {"nothing": True})
    assert bad["error"].startswith("bad input: job input has none of the accepted shapes")


def test_runpod_streams_a_jobs_chunks_one_by_one_and_aggregates_them(fake_engine, monkeypatch):
    """Through the Runpod SDK's own job runner (rp_job.handle_job, as `serve` configures it): each
    chunk is streamed as it comes, and /runsync's aggregated output is the list of them all."""
    from runpod.serverless.modules import rp_job

    streamed: list = []
    sent: list = []

    async def stream_result(session, output, job):
        streamed.append(output)

    async def send_result(session, result, job, is_stream=False):
        sent.append((result, is_stream))

    monkeypatch.setattr(rp_job, "stream_result", stream_result)
    monkeypatch.setattr(rp_job, "send_result", send_result)
    url, _ = fake_engine
    state = JobHandler(url, SERVED, 10, lambda: None, lambda: None)
    config = {"handler": make_handler(state), "return_aggregate_stream": True}

    async def one_job(job_input: dict) -> None:
        await rp_job.handle_job(None, config, {"id": "j", "input": job_input})

    async def both() -> None:
        await one_job({"prompt": "hi", "stream": True})
        await one_job({"prompt": "hi"})
        await state._session.close()

    asyncio.run(both())
    texts = [chunk["output"]["choices"][0]["text"] for chunk in streamed[:3]]
    assert texts == ["t0", "t1", "t2"]
    (streaming, is_stream), (single, _) = sent
    assert is_stream is True
    assert [c["choices"][0]["text"] for c in streaming["output"]] == ["t0", "t1", "t2"]
    assert len(streamed) == 4 and single["output"] == [streamed[3]["output"]]
    assert streamed[3]["output"]["echo"]["prompt"] == "hi"


def test_dead_engine_gives_a_clear_error(fake_engine):
    url, proc = fake_engine
    os.killpg(proc.pid, 9)
    proc.wait()
    unnoticed = JobHandler(url, SERVED, 5, lambda: None, lambda: None, death_grace_s=0.2)
    (error,) = run_job(unnoticed, {"prompt": "hi"})
    assert error["error"].startswith("request to vLLM failed: ClientConnectorError")
    noticed = JobHandler(url, SERVED, 5, lambda: None, lambda: "vLLM stopped serving (exit code -9)")
    assert run_job(noticed, {"prompt": "hi"}) == [{"error": "vLLM stopped serving (exit code -9)"}]
    # The connection fails before the exit status can be read (a busy machine, a process still
    # being torn down): the job waits for it rather than blaming the request.
    exits_at = time.monotonic() + 0.5
    racing = JobHandler(
        url,
        SERVED,
        5,
        lambda: None,
        lambda: "vLLM stopped serving (exit code -9)" if time.monotonic() >= exits_at else None,
    )
    assert run_job(racing, {"prompt": "hi"}) == [{"error": "vLLM stopped serving (exit code -9)"}]


def test_runpod_entry_is_thin():
    entry = (REPO / "handler" / "handler.py").read_text()
    assert 'main(["serve", *sys.argv[1:]])' in entry
    assert len(entry.splitlines()) < 20


STREAM = b"".join(
    [
        b'data: {"a": 1}\n\n',
        'data: {"t": "line\u2028sep \x85 \x0c \x1c"}\n\n'.encode(),
        b": a comment\r\n",
        b"event: message\r\n",
        b'data: {"b":\r\n',
        b"data: 2}\r\n\r\n",
        b"data:[DONE]\n\n",
        b"data: tail without its blank line",
    ]
)
# vLLM's JSON carries U+2028, NEL and form feeds unescaped in generated text: not line ends.
EVENTS = ['{"a": 1}', '{"t": "line\u2028sep \x85 \x0c \x1c"}', '{"b":\n2}', "[DONE]", "tail without its blank line"]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64, len(STREAM)])
def test_sse_parser_reads_events_whatever_the_read_boundaries(size):
    parser = SSEParser()
    events = []
    for start in range(0, len(STREAM), size):
        events += parser.feed(STREAM[start : start + size])
    events += parser.close()
    assert events == EVENTS


def test_scripted_engine_bench_runs_and_counts(tmp_path):
    """`warmstart-dev bench serve` end to end on a few jobs: every field, no error, both sides
    streamed the same chunks (the figures themselves are the bench's business, not a test's)."""
    from warmstart_dev.servebench import bench_serve

    result = bench_serve(jobs=40, concurrency=5, rounds=2, chunks=4)
    for name in ("jobs", "concurrency", "direct_p50_ms", "direct_p99_ms", "handler_p50_ms", "handler_p99_ms"):
        assert name in result
    assert (result["jobs"], result["concurrency"], result["errors"]) == (40, 5, 0)
    assert result["stream_chunks_per_s"] > 0 and result["direct_stream_chunks_per_s"] > 0
    assert result["overhead_p50_ms"] == pytest.approx(result["handler_p50_ms"] - result["direct_p50_ms"], abs=0.01)


def test_anthropic_messages_routes_are_allowed():
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        req = parse({"openai_route": route, "openai_input": body})
        assert (req.route, req.method, req.body["model"]) == (route, "POST", SERVED)
        assert parse({"route": route, "body": body}).route == route


def test_a_refused_job_run_locally_says_that_runpod_fails_it(caplog):
    """Runpod's local simulator shows {"error": ...} as "status": "COMPLETED"; on Runpod the job FAILS
    (README): a local run says so in the log (issue 38). On Runpod itself, no such line."""
    for local in (True, False):
        caplog.clear()
        state = JobHandler("http://127.0.0.1:1", SERVED, 5, lambda: None, lambda: None, local=local)
        assert run_job(state, {"route": "/sleep"})[0]["error"].startswith("bad input: route '/sleep'")
        said = [r.getMessage() for r in caplog.records if "status is FAILED" in r.getMessage()]
        assert len(said) == int(local), said
