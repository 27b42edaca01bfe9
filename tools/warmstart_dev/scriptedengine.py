"""A scripted OpenAI server that answers at once, for `warmstart-dev bench serve`.

It gives the answers of tests/fake_vllm_server.py's `ok` mode (the echo of the body, three
or more stream chunks, `data: [DONE]`, 404 for another model), so that a benchmark sees
warmstart's cost and not an engine's. It is here, not in tests/, so the installed
`warmstart-dev bench serve` does not depend on the test tree; the fault-injecting fake stays
in tests/. Unlike that fake (stdlib `http.server`, HTTP/1.0, a connection and a thread per
request), it serves with aiohttp and keeps connections alive, as vLLM's uvicorn does: a
connection set up per request would cost more than the handler that is being measured.

    python -m warmstart_dev.scriptedengine --host 127.0.0.1 --port N [--chunks K] [--served NAME]
        [--first-chunk-ms MS] [--chunk-interval-ms MS] [--chat-deltas]

`--first-chunk-ms`/`--chunk-interval-ms` give a stream a fixed pace (an engine's prefill and
decode, without its noise), and `--chat-deltas` streams chat answers in the shape vLLM's own
benchmark client reads, one chunk per requested token: `warmstart-dev bench lb --engine
scripted` measures the load-balancing front with it, started by the wrapper in vLLM's place
(`serve_as_vllm`). Never used as proof that warmstart works with vLLM: only real vLLM is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time

from aiohttp import web

POST_ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")


def chat_chunk(i: int, tokens: int, served: str) -> dict:
    """One token of a chat stream as vLLM's benchmark client parses it (vLLM 0.32,
    vllm/benchmarks/lib/endpoint_request_func.py, `async_request_openai_chat_completions`:
    `choices[0]["delta"].get("content")`; the first chunk with `choices` is the first token). The
    role rides on the first token's delta, where vLLM sends it in a chunk of its own just before."""
    delta = {"role": "assistant", "content": " t"} if i == 0 else {"content": " t"}
    finish = "length" if i == tokens - 1 else None
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "model": served,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def make_app(
    served: str | None,
    chunks: int,
    *,
    first_chunk_s: float = 0.0,
    chunk_interval_s: float = 0.0,
    chat_deltas: bool = False,
) -> web.Application:
    """`served` None: any model name is accepted (standing in for vLLM, whatever it was asked to serve)."""

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({})

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": served, "object": "model"}]})

    async def post(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read() or b"{}")
        if served is not None and body.get("model") not in (None, served):
            return web.json_response(
                {"error": {"message": f"The model `{body.get('model')}` does not exist."}}, status=404
            )
        if not body.get("stream"):
            return web.json_response(
                {
                    "object": "text_completion",
                    "echo": body,
                    "route": request.path,
                    "choices": [{"index": 0, "text": "fake"}],
                }
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        chat = chat_deltas and request.path == "/v1/chat/completions"
        # As vLLM: as many tokens as asked for (the benchmark client sets max_completion_tokens).
        tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or chunks) if chat else chunks
        for i in range(tokens):
            if pause := first_chunk_s if i == 0 else chunk_interval_s:
                await asyncio.sleep(pause)
            if chat:
                chunk = chat_chunk(i, tokens, body.get("model") or "scripted")
            else:
                choice = {"index": 0, "text": f"t{i}", "finish_reason": "length" if i == tokens - 1 else None}
                chunk = {"object": "text_completion", "choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if chat and (body.get("stream_options") or {}).get("include_usage"):
            # The client takes the output length from here (`elif usage := data.get("usage")`, on a
            # chunk with no choices, as vLLM sends it). No prompt_tokens: the client would replace
            # the dataset's prompt length with it.
            usage = {"id": "chatcmpl-scripted", "choices": [], "usage": {"completion_tokens": tokens}}
            await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    for route in POST_ROUTES:
        app.router.add_post(route, post)
    return app


def add_pace_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--first-chunk-ms", type=float, default=0.0, help="wait before a stream's first chunk")
    parser.add_argument("--chunk-interval-ms", type=float, default=0.0, help="wait before each further chunk")
    parser.add_argument("--chat-deltas", action="store_true", help="chat streams shaped as vLLM's, a chunk a token")


def paced_app(served: str | None, chunks: int, pace: argparse.Namespace) -> web.Application:
    """`make_app` with the options `add_pace_args` parsed (milliseconds on the command line)."""
    return make_app(
        served,
        chunks,
        first_chunk_s=pace.first_chunk_ms / 1000,
        chunk_interval_s=pace.chunk_interval_ms / 1000,
        chat_deltas=pace.chat_deltas,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=3, help="chunks per streamed answer, before [DONE]")
    parser.add_argument("--served", default="fake", help="the model name the server accepts")
    add_pace_args(parser)
    args = parser.parse_args(argv)
    app = paced_app(args.served, args.chunks, args)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


def say(text: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) INFO {stamp} [scriptedengine.py:1] {text}", flush=True)


def serve_as_vllm(pace: list[str]) -> None:
    """Stand in for `python -m vllm.entrypoints.openai.api_server`, started by the wrapper: vLLM's
    argv (`--host`, `--port`, `--served-model-name`; the rest ignored) from sys.argv, the pace
    options in `pace`. It prints the lines the wrapper reads from vLLM's log as
    tests/helpers/fake_vllm_server.py does (the wrapper itself only waits for /health 200), and
    "compiles" one file into TORCHINDUCTOR_CACHE_DIR, so the wrapper's cache work after the boot
    runs as after a real cold boot."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", nargs="*")
    known, _ = parser.parse_known_args(sys.argv[1:])
    args = argparse.ArgumentParser()
    add_pace_args(args)
    opts = args.parse_args(pace)
    say("scripted engine standing in for vLLM, args " + " ".join(sys.argv[1:]))
    print(
        f"(EngineCore pid={os.getpid()}) INFO 11-29 10:00:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) "
        "with config: model='scripted'",
        flush=True,
    )
    say("Loading weights took 0.01 seconds")
    if cache := os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(cache, "scripted-kernel.so"), "wb") as handle:
            handle.write(b"\0" * 4096)
    say("init engine (profile, create kv cache, warmup model) took 0.10 s")
    app = paced_app(known.served_model_name[0] if known.served_model_name else None, 3, opts)
    sock = socket.create_server((known.host, known.port))  # bound before the lines that say it serves
    say(f"Starting vLLM server on http://{known.host}:{known.port}")
    print("INFO:     Application startup complete.", flush=True)
    web.run_app(app, sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main()
