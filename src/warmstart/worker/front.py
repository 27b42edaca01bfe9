"""The load-balancing front: vLLM's OpenAI routes over HTTP, and Runpod's `/ping`.

On a Runpod load-balancing endpoint, requests reach the worker's own HTTP server on `PORT`
(`https://ENDPOINT_ID.api.runpod.ai/<path>` -> `http://worker:PORT/<path>`), and Runpod polls
`GET /ping` on `PORT_HEALTH` (the same port by default): 204 while the worker initializes, 200
when it is healthy, anything else takes it out of the routing pool (Runpod's docs,
serverless/load-balancing/overview). This module is that server, on aiohttp's low-level server
(its C HTTP parser; no hand-written HTTP):

- `/ping`: 204 from the moment the front starts (before the model is resolved, during the
  restore, while vLLM boots), 200 once vLLM serves, 503 from the moment the worker stops (SIGTERM)
  or vLLM dies, so Runpod stops routing to it before it goes.
- The routes of worker/routes.py's table (the queue handler's allowlist), compared as exact
  strings against the request target as sent (no decoding or normalisation, the query string
  included), with their methods; anything else gets a JSON error and is never forwarded.
- The body limits of the table: at most MAX_BODY_BYTES (413), JSON nested at most MAX_DEPTH
  deep, no NaN or Infinity (400); a POST body must be JSON. What passes is forwarded byte for
  byte. A costly body is parsed in a checker process (worker/jsoncheck.py), so that no request
  holds the event loop (and `/ping`) for more than a few milliseconds.
- `Expect: 100-continue` is answered once the route, the method, the phase and the declared
  length pass (else the refusal comes at once, before the body). A request's head must arrive
  within HEAD_TIMEOUT_S of its first byte, its body within BODY_TIMEOUT_S (and never pause
  BODY_IDLE_S): else the connection is closed (408 for a body).
- A request counts as in flight (what the drain waits for) from the moment it is accepted,
  while its body still arrives.
- The answer is relayed as vLLM sends it: a body with a length in one piece, a stream (SSE) chunk
  by chunk as the bytes arrive, never gathered. A client that goes away cancels its handler
  (aiohttp's handler_cancellation), which closes the connection to vLLM, and vLLM aborts the
  request.
- Before vLLM serves, and while the worker stops, requests get 503 with `Retry-After`, at once.
- `GET /warmstart/boot_report`: this worker's boot report (JSON).

Headers: only Content-Type, Accept, Accept-Encoding and X-Request-Id reach vLLM. The caller's
Authorization header (on Runpod, the caller's Runpod API key) reaches vLLM only when vLLM was
started with an API key (`--api-key`/`VLLM_API_KEY`: then vLLM checks it); it is never logged
(no access log, and no line here names a header).

The front runs its own event loop in a thread (`FrontServer`), so the main thread can boot as
the queue worker does while `/ping` answers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from aiohttp.http_exceptions import HttpProcessingError

from .connections import BodyLate, Server, TooLarge, read_body, too_large
from .jsoncheck import BodyChecker, Busy
from .routes import (
    MAX_BODY_BYTES,
    POOLED_IDLE_S,
    ROUTES,
    method_refusal,
    route_refusal,
)


class _NoBadRequests(logging.Filter):
    """aiohttp logs a traceback for every request its parser refuses (it has answered 400 already):
    a port on the internet gets such requests all day. Those go; any other error stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], HttpProcessingError))


http_log = logging.getLogger("warmstart.front")
http_log.addFilter(_NoBadRequests())

PING = "/ping"
BOOT_REPORT = "/warmstart/boot_report"
RETRY_AFTER_BOOTING_S = 10  # a boot takes minutes: ask again in a while
RETRY_AFTER_STOPPING_S = 1  # another worker (or a new one) takes it: at once
# A request's head from its first byte, and its body: two half-sent requests stayed open for minutes.
HEAD_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 300.0  # 20 MiB at about 0.5 Mbit/s
BODY_IDLE_S = 30.0  # no byte of the body for this long
IDLE_CONNECTION_S = 75.0  # a connection that sends nothing (aiohttp's own default is an hour)
# Headers a client's request may carry to vLLM. X-Request-Id: vLLM's --enable-request-id-headers.
# A plain answer up to this size is read whole and written at once; a larger one (embeddings of a big batch)
# is relayed chunk by chunk, as a stream is, so that no single step of the loop copies megabytes.
WHOLE_ANSWER_BYTES = 1 << 20
FORWARDED = ("Content-Type", "Accept", "Accept-Encoding", "X-Request-Id")
# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp sets for the answer itself.
NOT_RELAYED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "date",
        "server",
    }
)

Phase = Literal["starting", "serving", "stopping"]


@dataclass(frozen=True)
class Engine:
    """Where vLLM serves, and whether it wants the caller's Authorization header."""

    base_url: str
    api_key_set: bool  # vLLM was started with --api-key / VLLM_API_KEY: it checks the header itself
    request_timeout_s: float


def error(status: int, message: str, kind: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """An OpenAI-shaped JSON error (what the openai SDK reads into its exception's message)."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status, headers=headers)


class Front:
    """The front's state and its request handlers. The main thread moves the phase; the
    front's event loop reads it (plain attribute reads and writes: atomic in CPython)."""

    def __init__(
        self,
        *,
        boot_report: Callable[[], Mapping[str, Any] | None] = lambda: None,
        engine_failure: Callable[[], str | None] = lambda: None,
        death_grace_s: float = 2.0,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        body_idle_s: float = BODY_IDLE_S,
    ) -> None:
        self.phase: Phase = "starting"
        self.engine: Engine | None = None
        self.boot_report = boot_report
        self.engine_failure = engine_failure
        # A reset connection is often the first sign of vLLM's death (its sockets close before its
        # exit status can be read): a failed request waits this long for it, to say what happened.
        self.death_grace_s = death_grace_s
        self.head_timeout_s = head_timeout_s
        self.body_timeout_s = body_timeout_s
        self.body_idle_s = body_idle_s
        self.inflight = 0  # requests accepted and not yet answered (read by the main thread while it drains)
        self.checker = BodyChecker()
        self._session: ClientSession | None = None

    # ------------------------------------------------------------------ the main thread's side

    def serve(self, engine: Engine, engine_failure: Callable[[], str | None]) -> None:
        """vLLM serves: forward from now on, and /ping says 200."""
        self.engine_failure = engine_failure
        self.engine = engine
        self.phase = "serving"

    def stop(self) -> None:
        """The worker stops: /ping turns 503 and new requests are refused, at once."""
        self.phase = "stopping"

    # ------------------------------------------------------------------ /ping and refusals

    def ping_status(self) -> int:
        if self.phase == "starting":
            return 204
        if self.phase == "serving" and self.engine_failure() is None:
            return 200
        return 503

    async def ping(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return error(405, f"{PING} accepts GET", "method_not_allowed", {"Allow": "GET, HEAD"})
        status = self.ping_status()
        if status == 204:
            return web.Response(status=204)
        return web.json_response({"status": "healthy" if status == 200 else "unhealthy"}, status=status)

    def unavailable(self) -> web.Response | None:
        """503 with Retry-After while vLLM does not serve (booting, stopping, dead), else None."""
        if self.phase == "starting":
            return error(
                503,
                "this worker is starting: vLLM does not serve yet",
                "unavailable",
                {"Retry-After": str(RETRY_AFTER_BOOTING_S)},
            )
        if self.phase == "stopping":
            message = "this worker is stopping; retry"
        elif (failure := self.engine_failure()) is not None:
            message = failure
        else:
            return None
        return error(503, message, "unavailable", {"Retry-After": str(RETRY_AFTER_STOPPING_S)})

    async def report(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return error(405, f"{BOOT_REPORT} accepts GET", "method_not_allowed", {"Allow": "GET, HEAD"})
        report = self.boot_report()
        if report is None:
            retry = {"Retry-After": str(RETRY_AFTER_BOOTING_S)}
            return error(503, "no boot report yet: vLLM does not serve yet", "unavailable", retry)
        return web.json_response(dict(report))

    # ------------------------------------------------------------------ the handlers

    async def health_only(self, request: web.BaseRequest) -> web.StreamResponse:
        """PORT_HEALTH, when it is not PORT: /ping alone."""
        if request.raw_path == PING:
            return await self.ping(request)
        return error(404, f"this port serves {PING} only", "not_found")

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """PORT: /ping, the boot report, and the allowlisted routes, forwarded to vLLM."""
        route = request.raw_path  # the request target as sent: nothing decoded or normalised
        if route == PING:
            return await self.ping(request)
        if route == BOOT_REPORT:
            return await self.report(request)
        if (refusal := route_refusal(route)) is not None:
            return error(404, refusal, "not_found")
        if (refusal := method_refusal(route, request.method)) is not None:
            return error(405, refusal, "method_not_allowed", {"Allow": ", ".join(sorted(ROUTES[route]))})
        if (refused := self.unavailable()) is not None:
            return refused
        # In flight from here: a SIGTERM while the body still arrives waits for this request (drain).
        self.inflight += 1
        try:
            body = b""
            if request.method == "POST":
                if (declared := request.content_length) is not None and declared > MAX_BODY_BYTES:
                    return error(413, too_large(declared), "request_too_large")
                if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= (1, 1):
                    # What aiohttp's router does (web_urldispatcher._default_expect_handler); the
                    # low-level server leaves it to us. The client sends the body once it reads this.
                    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    request.writer.output_size = 0
                try:
                    body = await read_body(request, self.body_timeout_s, self.body_idle_s)
                except TooLarge as exc:
                    return error(413, str(exc), "request_too_large")
                except BodyLate as exc:
                    answer = error(408, str(exc), "timeout")
                    answer.force_close()
                    return answer
                try:
                    problem = await self.checker.problem(body)
                except Busy as exc:
                    return error(503, str(exc), "unavailable", {"Retry-After": str(RETRY_AFTER_STOPPING_S)})
                if problem is not None:
                    return error(400, problem, "invalid_request_error")
            return await self.forward(request, route, body)
        finally:
            self.inflight -= 1

    # ------------------------------------------------------------------ forwarding

    def session(self) -> ClientSession:
        assert self.engine is not None
        if self._session is None or self._session.closed:
            # No pool limit of its own (aiohttp's default is 100 connections): how many requests
            # run at once is vLLM's business (its scheduler queues), not a hidden queue here.
            self._session = ClientSession(
                timeout=ClientTimeout(total=self.engine.request_timeout_s, sock_connect=10),
                connector=TCPConnector(limit=0, keepalive_timeout=POOLED_IDLE_S),
                auto_decompress=False,  # bytes pass as vLLM sent them, Content-Encoding and all
                skip_auto_headers=("Accept-Encoding", "User-Agent"),
            )
        return self._session

    async def close(self) -> None:
        self.checker.close()
        if self._session is not None:
            await self._session.close()

    async def _failure_within(self, seconds: float) -> str | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (failure := self.engine_failure()) is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return failure

    async def _upstream_error(self, route: str, exc: BaseException) -> web.Response:
        if (failure := await self._failure_within(self.death_grace_s)) is not None:
            return error(503, failure, "unavailable", {"Retry-After": str(RETRY_AFTER_STOPPING_S)})
        if isinstance(exc, asyncio.TimeoutError):
            return error(504, f"vLLM did not answer on {route} within REQUEST_TIMEOUT", "timeout")
        return error(502, f"request to vLLM failed on {route}: {type(exc).__name__}", "upstream_error")

    async def forward(self, request: web.BaseRequest, route: str, body: bytes) -> web.StreamResponse:
        engine = self.engine
        assert engine is not None
        headers = {name: value for name in FORWARDED if (value := request.headers.get(name)) is not None}
        if engine.api_key_set and (auth := request.headers.get("Authorization")) is not None:
            headers["Authorization"] = auth
        try:
            upstream = await self.session().request(
                request.method, engine.base_url + route, data=body if body else None, headers=headers
            )
        except (ClientError, asyncio.TimeoutError, OSError) as exc:
            return await self._upstream_error(route, exc)
        answer: web.StreamResponse | None = None
        whole = False  # vLLM's answer was read to its end
        try:
            relayed = {k: v for k, v in upstream.headers.items() if k.lower() not in NOT_RELAYED}
            if upstream.content_length is not None and upstream.content_length <= WHOLE_ANSWER_BYTES:
                body = await upstream.read()  # a plain body: one read, one write
                whole = True
                return web.Response(status=upstream.status, body=body, headers=relayed)
            answer = web.StreamResponse(status=upstream.status, headers=relayed)
            if upstream.content_length is not None:  # a large plain body, relayed as it comes, not chunked
                answer.content_length = upstream.content_length
            await answer.prepare(request)
            async for received in upstream.content.iter_any():  # each chunk as it arrives
                await answer.write(received)
            whole = True
            await answer.write_eof()
            return answer
        except (ClientError, asyncio.TimeoutError) as exc:
            if answer is None or not answer.prepared:
                return await self._upstream_error(route, exc)
            # Mid-stream: cut the client's connection, so that it sees a broken stream and not
            # one that ended cleanly without its last event.
            if request.transport is not None:
                request.transport.abort()
            return answer
        finally:
            if whole:
                upstream.release()  # the connection goes back to the pool
            else:
                # A client that left (its handler cancelled), an error: closing the connection
                # is what makes vLLM abort the request (its handlers watch for the disconnect).
                upstream.close()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop: each relayed chunk is a read and a write, and libuv's loop costs less per
    chunk than asyncio's (`warmstart-dev bench lb`); asyncio's where uvloop is missing."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - installed with uvicorn[standard] (runpod's fastapi[all])
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class FrontServer:
    """The front's HTTP server(s) in a thread with its own event loop: PORT, and PORT_HEALTH
    when it differs. `start` returns once the ports listen (or raises why they cannot)."""

    def __init__(self, front: Front, host: str, port: int, health_port: int | None = None) -> None:
        self.front = front
        self.host = host
        self.port = port
        self.health_port = health_port if health_port not in (None, port) else None
        self.ports: list[int] = []  # as bound (a requested 0 becomes a free port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future[None] | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="warmstart-front", daemon=True)

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise RuntimeError(f"the HTTP front did not start listening within {timeout_s:.0f} s")
        if self._failure is not None:
            raise self._failure

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the listeners and the connection pool; requests still open are cut."""
        loop, done = self._loop, self._done
        if loop is not None and done is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))
            self._thread.join(timeout_s)

    def _run(self) -> None:
        loop = new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # a port in use, most often: the main thread raises it
            self._failure = exc
            self._started.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._done = asyncio.get_running_loop().create_future()
        runners: list[web.BaseRunner] = []
        try:
            handlers = [(self.port, self.front.handle)]
            if self.health_port is not None:
                handlers.append((self.health_port, self.front.health_only))
            for port, handler in handlers:
                # No access log: nothing about a request (its headers above all) reaches a log line.
                server = Server(
                    handler,
                    head_timeout_s=self.front.head_timeout_s,
                    handler_cancellation=True,
                    access_log=None,
                    logger=http_log,
                    keepalive_timeout=IDLE_CONNECTION_S,
                )
                runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
                await runner.setup()
                runners.append(runner)
                site = web.TCPSite(runner, self.host, port, reuse_address=True)
                await site.start()
                self.ports.append(int(runner.addresses[-1][1]))
            self._started.set()
            await self._done
        finally:
            for runner in runners:
                await runner.cleanup()
            await self.front.close()
