"""Both fronts' connections to vLLM (the load-balancing front's and the queue handler's): kept and
reused while fresh (no handshake per request), let go before vLLM's uvicorn closes them
(VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default),
so that no request is sent on a connection vLLM is closing at that moment.

The engine is a stdlib HTTP/1.1 server that keeps connections alive and records the client port
of each request: the same port is the same pooled connection.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from warmstart.worker.front import Engine, Front, FrontServer
from warmstart.worker.handler import JobHandler, make_handler
from warmstart.worker.routes import POOLED_IDLE_S

VLLM_KEEP_ALIVE_S = 5  # vllm 0.32 envs.py: VLLM_HTTP_TIMEOUT_KEEP_ALIVE defaults to "5"


class PortRecorder(BaseHTTPRequestHandler):
    ports: list[int] = []
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        PortRecorder.ports.append(self.client_address[1])
        data = b'{"object": "list", "data": []}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def front_url() -> Iterator[str]:
    engine = ThreadingHTTPServer(("127.0.0.1", 0), PortRecorder)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    state = Front()
    server = FrontServer(state, "127.0.0.1", 0)
    server.start()
    state.serve(Engine(f"http://127.0.0.1:{engine.server_address[1]}", False, 30), lambda: None)
    PortRecorder.ports.clear()
    try:
        yield f"http://127.0.0.1:{server.ports[0]}"
    finally:
        server.stop()
        engine.shutdown()


def get(url: str) -> int:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        resp.read()
        return resp.status


def test_a_fresh_connection_is_reused_and_an_idle_one_let_go_before_vllm_closes_it(front_url):
    assert POOLED_IDLE_S < VLLM_KEEP_ALIVE_S
    assert get(front_url) == 200
    assert get(front_url) == 200  # at once: the pooled connection
    time.sleep(POOLED_IDLE_S + 1.0)  # past the front's idle limit, still short of vLLM's
    assert get(front_url) == 200
    first, again, later = PortRecorder.ports
    assert first == again and later != first


def test_the_queue_handler_lets_go_of_an_idle_connection_before_vllm_closes_it():
    """The same pool rule in the queue handler: a 10 MB prompt sent on a connection vLLM was closing
    failed with aiohttp's `ClientOSError: Can not write request body` instead of vLLM's answer."""
    engine = ThreadingHTTPServer(("127.0.0.1", 0), PortRecorder)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    state = JobHandler(f"http://127.0.0.1:{engine.server_address[1]}", "m", 30, lambda: None, lambda: None)
    PortRecorder.ports.clear()

    async def jobs() -> list[list]:
        out = []
        for pause in (0.0, 0.0, POOLED_IDLE_S + 1.0):
            await asyncio.sleep(pause)
            job = {"id": "j", "input": {"openai_route": "/v1/models"}}
            out.append([item async for item in make_handler(state)(job)])
        await state._session.close()
        return out

    try:
        answers = asyncio.run(jobs())
    finally:
        engine.shutdown()
    assert all(answer == [{"object": "list", "data": []}] for answer in answers), answers
    first, again, later = PortRecorder.ports
    assert first == again and later != first
