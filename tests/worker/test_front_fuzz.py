"""Hostile HTTP against the load-balancing front: whatever is sent, it answers with a status (no 5xx
of its own), and only an allowlisted route, with its method and a JSON body within the limits,
ever reaches the engine, byte for byte.

The front (worker/front.py's FrontServer) runs in this process against a recording engine (a
stdlib HTTP server that keeps what it was sent). Requests go out over raw sockets, so the request
target is exactly what hypothesis drew (no client normalises it); the answer is read with
http.client. The same strategies fuzz the queue handler (tests/worker/test_fuzz.py).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers.fuzzbudget import cases as fuzz_cases
from helpers.hostile import hostile_json_bodies, json_values, mutated_route
from warmstart.worker.front import Engine, Front, FrontServer
from warmstart.worker.jsoncheck import cheap
from warmstart.worker.loadbalancer import drain
from warmstart.worker.routes import MAX_BODY_BYTES, MAX_DEPTH, ROUTES

EXAMPLES = fuzz_cases(1500)  # a quarter in `make test-fast` (tests/helpers/fuzzbudget.py)


class Recorder(BaseHTTPRequestHandler):
    """The engine: records (method, path, body, headers), answers JSON, or SSE for `"stream": true`."""

    seen: list[tuple[str, str, bytes, dict[str, str]]] = []
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        Recorder.seen.append((self.command, self.path, body, dict(self.headers.items())))
        if b'"stream": true' in body:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            for i in range(3):
                self.wfile.write(f'data: {{"n": {i}}}\n\n'.encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return
        data = b'{"ok": true}'
        if body.startswith(b'{"answer_bytes": '):  # an answer of that many bytes (embeddings of a big batch)
            size = int(json.loads(body)["answer_bytes"])
            data = b'{"data": "' + bytes(48 + i % 10 for i in range(size - 12)) + b'"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _answer


class RecordingServer(ThreadingHTTPServer):
    request_queue_size = 512  # the listen backlog (socketserver's default is 5; vLLM's uvicorn has 2048)


@pytest.fixture(scope="module")
def front() -> Iterator[tuple[int, Front]]:
    engine = RecordingServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    state = Front(head_timeout_s=0.5, body_timeout_s=3.0, body_idle_s=0.5)
    server = FrontServer(state, "127.0.0.1", 0)
    server.start()
    state.serve(Engine(f"http://127.0.0.1:{engine.server_address[1]}", False, 30), lambda: None)
    try:
        yield server.ports[0], state
    finally:
        server.stop()
        engine.shutdown()


def send_raw(port: int, method: bytes, target: bytes, body: bytes | None, headers: bytes = b"") -> tuple:
    """One request, written as given; (status, content type, body) of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
        try:
            sock.sendall(head + b"\r\n" + (body or b""))
        except OSError:
            pass  # the front answered (a refusal) and closed before the whole body was sent
        response = http.client.HTTPResponse(sock, method=method.decode(errors="replace"))
        response.begin()
        try:
            answer = response.read()
        except http.client.IncompleteRead as exc:
            # A request the parser refused, with a body still unread on the front's side: its close
            # resets the connection, which may cut the answer's body on ours (the status came).
            assert response.status == 400, response.status
            answer = exc.partial
        return response.status, response.getheader("content-type") or "", answer


def encode(value: Any) -> bytes:
    try:
        return json.dumps(value).encode()
    except ValueError:
        return b"{}"


targets = mutated_route() | st.sampled_from(sorted(ROUTES)) | st.text(max_size=40).map(lambda t: "/" + t)
verbs = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "post", "G ET"])
bodies = st.none() | json_values.map(encode) | st.binary(max_size=64) | hostile_json_bodies()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
@given(target=targets, method=verbs, body=bodies)
@example(target=" /v1/models", method="GET", body=None)  # found: the parser reads `/v1/models`
@example(target="  /sleep ", method="POST", body=b"{}")
def test_any_request_is_answered_and_only_allowlisted_ones_reach_the_engine(front, target, method, body):
    port, state = front
    Recorder.seen.clear()
    raw_target = target.encode("utf-8", errors="surrogatepass")
    status, content_type, answer = send_raw(port, method.encode(), raw_target, body)
    assert status < 500, (target, method, status, answer[:300])
    # The target as the front's HTTP parser reads it: aiohttp's (llhttp) splits the request line on runs
    # of spaces, as RFC 9112 section 3 lets a recipient do, so `GET  /v1/models` asks for `/v1/models`
    # (found by this test: the front forwarded it, rightly). The front compares what the parser gives.
    effective = target.strip(" ")
    forwardable = " " not in effective and effective in ROUTES and method in ROUTES[effective]
    if method == "POST" and forwardable:
        try:
            value = json.loads(body or b"", parse_constant=_refused_constant)  # NaN/Infinity: refused
            forwardable = not (isinstance(value, (dict, list)) and _depth(value) > MAX_DEPTH)
        except (ValueError, RecursionError):
            forwardable = False
    if forwardable:
        ((seen_method, seen_path, seen_body, seen_headers),) = Recorder.seen
        assert (seen_method, seen_path) == (method, effective)
        assert seen_body == ((body or b"") if method == "POST" else b"")
        assert "Authorization" not in seen_headers
        assert status == 200
    else:
        assert Recorder.seen == [], (target, method)
        if method != "HEAD" and (status != 400 or content_type.startswith("application/json")):
            assert json.loads(answer)["error"]["message"], answer  # aiohttp's own parser answers 400 in text
    assert state.inflight == 0


def _refused_constant(name: str) -> Any:
    raise ValueError(name)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@pytest.mark.parametrize(
    "target",
    [b"/v1/../sleep", b"/v1/%2e%2e/sleep", b"//v1/models", b"/v1/models?x", b"/V1/models", b"/v1/models/",
     b"http://127.0.0.1/v1/models", b"/v1/models#x", b"/sleep", b"/collective_rpc", b"/v1/load_lora_adapter",
     b"/%761/models", b"/v1//models", b"*"],
)  # fmt: skip
def test_path_tricks_are_refused_and_never_forwarded(front, target):
    port, _ = front
    Recorder.seen.clear()
    status, _, _ = send_raw(port, b"GET", target, None)
    assert status in (400, 404) and Recorder.seen == []


def test_body_limits(front):
    port, _ = front
    Recorder.seen.clear()
    status, _, answer = send_raw(port, b"POST", b"/v1/completions", b" " * (MAX_BODY_BYTES + 1))
    assert status == 413 and "at most" in json.loads(answer)["error"]["message"]
    chunked = b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n"
    big = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:  # no Content-Length: counted
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + chunked + b"\r\n")
        try:
            for _ in range(21):
                sock.sendall(big)
        except OSError:
            pass  # the front may answer and close before all of it is sent
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 413
    deep = b'{"prompt": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}"
    assert send_raw(port, b"POST", b"/v1/completions", deep)[0] == 400
    fits = b'{"prompt": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"
    assert send_raw(port, b"POST", b"/v1/completions", fits)[0] == 200
    assert send_raw(port, b"POST", b"/v1/completions", b"[" * 200_000)[0] == 400
    assert send_raw(port, b"POST", b"/v1/completions", b'{"a": NaN')[0] == 400
    assert send_raw(port, b"POST", b"/v1/completions", b"\xff\xfe\x00")[0] == 400
    assert [path for _, path, _, _ in Recorder.seen] == ["/v1/completions"]  # only the one that fits


def test_authorization_and_other_headers_stay_with_the_front(front):
    port, _ = front
    Recorder.seen.clear()
    headers = b"Authorization: Bearer rpa_SECRET\r\nCookie: a=b\r\nX-Forwarded-For: 1.2.3.4\r\nX-Request-Id: r1\r\n"
    status, _, _ = send_raw(port, b"POST", b"/v1/completions", b'{"prompt": "x"}', headers)
    assert status == 200
    ((_, _, _, seen),) = Recorder.seen
    assert {k.lower() for k in seen} <= {"host", "content-type", "content-length", "x-request-id", "accept"}
    assert seen["X-Request-Id"] == "r1"


def test_streams_are_relayed_and_two_hundred_requests_at_once_are_each_answered(front):
    port, state = front

    async def run() -> list[tuple[int, bytes]]:
        url = f"http://127.0.0.1:{port}/v1/completions"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one(i: int) -> tuple[int, bytes]:
                async with session.post(url, json={"prompt": str(i), "stream": i % 2 == 0}) as resp:
                    return resp.status, await resp.read()

            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(200))), 120)

    results = asyncio.run(run())
    assert [status for status, _ in results] == [200] * 200
    assert all(body.endswith(b"data: [DONE]\n\n") for _, body in results[::2])
    assert state.inflight == 0


@pytest.mark.parametrize("body", [b'{"a": NaN}', b"[Infinity]", b'{"x": {"y": -Infinity}}', b'{"p": 1, "t": NaN}'])
def test_nan_and_infinity_are_refused_as_the_queue_worker_refuses_them(front, body):
    """docs/jobs.md: both fronts refuse NaN/Infinity; vLLM itself answered 200 to `{"foo": NaN}` (issue 38)."""
    port, _ = front
    Recorder.seen.clear()
    status, _, answer = send_raw(port, b"POST", b"/v1/completions", body)
    assert status == 400 and "JSON does not allow" in json.loads(answer)["error"]["message"]
    big = b'{"prompt": [' + b"1," * 100_000 + b"NaN]}"  # parsed by a checker process, not on the loop
    assert not cheap(big) and send_raw(port, b"POST", b"/v1/completions", big)[0] == 400
    assert Recorder.seen == []


def _nested(size: int, depth: int = 60) -> bytes:
    """A legal body (depth < MAX_DEPTH) of `size` bytes that costs the most to parse: small arrays nested deep."""
    unit = b"[" * depth + b"]" * depth
    return b'{"prompt": [' + b",".join([unit] * (size // (len(unit) + 1))) + b"]}"


def _ping_while(port: int, busy: threading.Event) -> list[float]:
    """/ping's latency (s), one after another on one keep-alive connection, while `busy` is set."""
    latencies = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while busy.is_set():
        t0 = time.perf_counter()
        conn.request("GET", "/ping")
        response = conn.getresponse()
        response.read()
        latencies.append(time.perf_counter() - t0)
        assert response.status == 200
        time.sleep(0.005)
    conn.close()
    return latencies


def test_ping_answers_at_once_while_costly_bodies_are_checked(front):
    """One request must not hold the event loop: a legal body of small arrays nested 60 deep costs
    ~0.25-0.5 us a byte to parse (5.5 s for 20 MiB), and json.loads holds the GIL throughout, so it is
    parsed in a checker process. Here 2 such bodies of 2 MiB at once (the old front: /ping waited
    seconds). The goal is 50 ms; the bound allows for a loaded 2-core machine (issue 38)."""
    port, state = front
    Recorder.seen.clear()
    body = _nested(2 << 20)
    answers: list[int] = []
    busy = threading.Event()
    busy.set()
    latencies: list[float] = []
    pinger = threading.Thread(target=lambda: latencies.extend(_ping_while(port, busy)))
    pinger.start()
    time.sleep(0.1)
    senders = [
        threading.Thread(target=lambda: answers.append(send_raw(port, b"POST", b"/v1/completions", body)[0]))
        for _ in range(2)
    ]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(120)
    busy.clear()
    pinger.join(60)
    assert answers == [200, 200] and len(Recorder.seen) == 2  # legal: checked, then forwarded
    worst, median = max(latencies), statistics.median(latencies)
    print(f"/ping while 2 x 2 MiB nested bodies were checked: {len(latencies)} pings, "
          f"median {median * 1000:.1f} ms, max {worst * 1000:.1f} ms")  # fmt: skip
    # The goal is 50 ms; the bound is for a 2-core machine shared with other work (load 20 seen: the
    # front's thread then waits for a core). The old front held /ping for 1.5 to 8 s here.
    assert median < 0.02 and worst < 0.5, (median, worst)
    assert state.inflight == 0


@pytest.fixture
def lone_front() -> Iterator[tuple[int, Front]]:
    """A front of its own (it is stopped, or its timeouts are short), before the same recording engine."""
    engine = RecordingServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    state = Front(head_timeout_s=0.5, body_timeout_s=3.0, body_idle_s=0.5)
    server = FrontServer(state, "127.0.0.1", 0)
    server.start()
    state.serve(Engine(f"http://127.0.0.1:{engine.server_address[1]}", False, 30), lambda: None)
    try:
        yield server.ports[0], state
    finally:
        server.stop()
        engine.shutdown()


def _head(body_size: int, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: "
        + str(body_size).encode()
        + b"\r\n\r\n"
    )


def test_the_drain_waits_for_a_request_whose_body_was_still_arriving_at_sigterm(lone_front):
    """SIGTERM (front.stop, then drain) while a request's body is half sent: the request was accepted
    before the signal, so the drain waits for it and it is forwarded, not cut (issue 38, finding 7)."""
    port, state = lone_front
    Recorder.seen.clear()
    body = b'{"prompt": "' + b"x" * 1000 + b'"}'
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_head(len(body)) + body[:100])
        time.sleep(0.2)  # the front has the head: the request is accepted, its body arrives
        state.stop()
        left: list[int] = []
        drainer = threading.Thread(target=lambda: left.append(drain(state, 5.0)))
        drainer.start()
        time.sleep(0.2)
        assert drainer.is_alive(), "the drain did not wait for the request still receiving its body"
        sock.sendall(body[100:])
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 200
        drainer.join(10)
    assert left == [0] and [path for _, path, _, _ in Recorder.seen] == ["/v1/completions"]


def test_expect_100_continue_is_answered_and_a_refusal_comes_before_the_body(lone_front):
    """curl sends `Expect: 100-continue` with a large POST and waits 1 s for an answer before sending
    the body anyway (issue 38, finding 8)."""
    port, _ = lone_front
    Recorder.seen.clear()
    body = b'{"prompt": "hi"}'
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
        sock.sendall(_head(len(body), b"Expect: 100-continue\r\n"))
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.settimeout(10)
        sock.sendall(body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 200
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:  # too large: 413 at once
        sock.sendall(_head(MAX_BODY_BYTES + 1, b"Expect: 100-continue\r\n"))
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 413
    assert len(Recorder.seen) == 1


def test_a_half_sent_head_or_body_is_closed_at_its_deadline(lone_front):
    """Two half-sent requests were still open after 65 s (issue 38, finding 8): a head is closed
    `head_timeout_s` after its first byte, a body that pauses gets 408 and the connection closes."""
    port, state = lone_front
    Recorder.seen.clear()
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-")
        assert sock.recv(100) == b""  # closed by the front
    assert time.monotonic() - t0 < 3
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_head(1000) + b'{"prompt": "')
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 408 and "did not arrive" in json.loads(response.read())["error"]["message"]
    assert time.monotonic() - t0 < 6
    assert Recorder.seen == [] and state.inflight == 0
    # A request that arrives whole is untouched by the head deadline on a kept-alive connection.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for _ in range(2):
        conn.request("GET", "/ping")
        assert conn.getresponse().read() is not None
        time.sleep(0.7)
    conn.close()


def test_a_large_plain_answer_is_relayed_whole_with_its_length(front):
    """An answer over 1 MiB (front.WHOLE_ANSWER_BYTES) is relayed chunk by chunk rather than read whole and
    written in one step of the loop, with vLLM's Content-Length kept (not re-sent chunked); a smaller one is
    read whole. Both arrive byte for byte."""
    port, _ = front
    for size in (3 << 20, 1000):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/embeddings", body=json.dumps({"answer_bytes": size}))
        response = conn.getresponse()
        data = response.read()
        conn.close()
        assert response.status == 200 and len(data) == size and json.loads(data)["data"][:3] == "012"
        assert response.getheader("content-length") == str(size) and response.getheader("transfer-encoding") is None


COSTLY_NAN = b'{"prompt": [' + b"1," * 100_000 + b"NaN]}"  # past the inline limit: a checker parses it


def checks_a_costly_body(checker: Any) -> None:
    """Through whatever path `checker` takes, a costly body with NaN is refused and the same body without it
    passes; the checker is closed after."""
    try:
        assert "JSON does not allow" in (asyncio.run(checker.problem(COSTLY_NAN)) or "")
        assert asyncio.run(checker.problem(COSTLY_NAN.replace(b"NaN", b"2"))) is None
    finally:
        checker.close()


def test_a_costly_body_reaches_its_checker_as_a_file_that_never_stays_behind(tmp_path, monkeypatch):
    """A costly body goes to its checker process as a file written on a thread (jsoncheck.spill): handed to
    the pool, it was pickled while holding the GIL, and /ping waited 15 ms per 20 MiB of fresh memory
    (`warmstart-dev bench hostile`: max 48-84 ms before, 15-30 ms after). Checked, refused, or never run
    (the pool broke while it waited), the body's file is gone afterwards."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from warmstart.worker import jsoncheck

    monkeypatch.setattr(jsoncheck, "SPILL_DIR", str(tmp_path))
    checker = jsoncheck.BodyChecker()
    checks_a_costly_body(checker)
    assert list(tmp_path.iterdir()) == []
    spilled: list[str] = []

    def broken(check: object, path: str) -> Future[str | None]:
        spilled.append(path)
        future: Future[str | None] = Future()
        future.set_exception(BrokenProcessPool("a checker was killed"))
        return future

    monkeypatch.setattr(checker, "_submit", broken)
    with pytest.raises(jsoncheck.Busy):
        asyncio.run(checker.problem(COSTLY_NAN))
    assert len(spilled) == 1 and spilled[0].startswith(str(tmp_path)) and list(tmp_path.iterdir()) == []


def test_a_body_that_cannot_be_spilled_goes_to_its_checker_pickled(tmp_path, monkeypatch):
    """Where the spill folder cannot take the body (Docker's default /dev/shm is 64 MiB; here a folder that is
    not there), the body goes to its checker as it is, pickled into the pool: checked all the same."""
    from warmstart.worker import jsoncheck

    monkeypatch.setattr(jsoncheck, "SPILL_DIR", str(tmp_path / "missing"))
    checker = jsoncheck.BodyChecker()
    submitted: list[str] = []
    submit = checker._submit
    monkeypatch.setattr(checker, "_submit", lambda check, arg: submitted.append(check.__name__) or submit(check, arg))
    checks_a_costly_body(checker)
    assert submitted == ["json_problem", "json_problem"] and list(tmp_path.iterdir()) == []


def test_where_no_checker_process_can_start_a_costly_body_is_checked_on_the_loop(monkeypatch, caplog):
    """A process that cannot start a checker (spawn from an unguarded main module, no fork allowed)
    still answers every request: the check runs on the loop, said once in the log."""
    from warmstart.worker.jsoncheck import BodyChecker

    checker = BodyChecker()

    def refuse() -> None:
        raise RuntimeError("An attempt has been made to start a new process before bootstrapping")

    monkeypatch.setattr(checker, "_executor", refuse)
    checks_a_costly_body(checker)
    assert sum("checked on the event loop" in r.getMessage() for r in caplog.records) == 1
