"""A scripted OpenAI server that answers at once, for `warmstart-dev bench serve`.

It gives the answers of tests/fake_vllm_server.py's `ok` mode (the echo of the body, three
or more stream chunks, `data: [DONE]`, 404 for another model), so that a benchmark sees
warmstart's cost and not an engine's. It is here, not in tests/, so the installed
`warmstart-dev bench serve` does not depend on the test tree; the fault-injecting fake stays
in tests/. Unlike that fake (stdlib `http.server`, HTTP/1.0, a connection and a thread per
request), it serves with aiohttp and keeps connections alive, as vLLM's uvicorn does: a
connection set up per request would cost more than the handler that is being measured.

    python -m warmstart_dev.scriptedengine --host 127.0.0.1 --port N [--chunks K] [--served NAME]

Never used as proof that warmstart works with vLLM: only real vLLM is.
"""

from __future__ import annotations

import argparse
import json

from aiohttp import web

POST_ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")


def make_app(served: str, chunks: int) -> web.Application:
    async def health(_request: web.Request) -> web.Response:
        return web.json_response({})

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": served, "object": "model"}]})

    async def post(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read() or b"{}")
        if body.get("model") not in (None, served):
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
        for i in range(chunks):
            finish = "length" if i == chunks - 1 else None
            chunk = {"object": "text_completion", "choices": [{"index": 0, "text": f"t{i}", "finish_reason": finish}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    for route in POST_ROUTES:
        app.router.add_post(route, post)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=3, help="chunks per streamed answer, before [DONE]")
    parser.add_argument("--served", default="fake", help="the model name the server accepts")
    args = parser.parse_args(argv)
    web.run_app(make_app(args.served, args.chunks), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
