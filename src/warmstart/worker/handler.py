"""Jobs: worker-vllm's input shapes -> one request to vLLM on loopback -> output or stream.

Accepted inputs (as in runpod-workers/worker-vllm):

    {"openai_route": "/v1/chat/completions", "openai_input": {...}}   OpenAI route, POST (GET without input)
    {"route": "/v1/completions", "body": {...}, "method": "POST"}      explicit route
    {"prompt": "...", "sampling_params": {...}, "stream": false}      -> /v1/completions
    {"messages": [...], "sampling_params": {...}, "stream": false}    -> /v1/chat/completions
    {"warmstart": "boot_report"}                                      this worker's BootReport

Only the routes of worker/routes.py's table are forwarded, compared as exact strings (the
load-balancing front shares the table), and the body sent is checked against the same limits
(MAX_BODY_BYTES of JSON, MAX_DEPTH containers deep) before anything is sent: Runpod itself
refuses payloads over 20 MB on /runsync, so the byte limit only bites for local or relayed
jobs; the depth limit keeps a hostile body from reaching a recursion limit in the JSON encoder
(which would crash the job with a traceback rather than say what was wrong).

Bad input never raises: parse_job_input raises only InputError, which becomes
{"error": "<what was wrong>"}, which Runpod turns into a failed job with that text, and
the worker goes on serving. Error messages quote at most a short prefix of what was sent.

Streams: for `openai_route` and `route` jobs each SSE event is yielded as its text
(`data: {...}\\n\\n`), which is what Runpod's OpenAI-compatible endpoint relays; for
`prompt`/`messages` jobs each event is yielded as the parsed chunk object.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import log
from ..errors import InputError
from .routes import (
    MAX_BODY_BYTES,
    MAX_DEPTH,
    POOLED_IDLE_S,
    SHOWN_CHARS,
    method_refusal,
    route_refusal,
    show,
    too_deep,
    too_deep_message,
    too_large_message,
)

WARMSTART_QUERIES = ("boot_report",)


@dataclass(frozen=True)
class EngineRequest:
    route: str
    method: str
    body: Mapping[str, Any] | None
    stream: bool
    raw_events: bool  # yield SSE text (OpenAI relay) rather than parsed chunks
    # The body as sent, encoded once while checking its size (b"" without a body).
    payload: bytes = field(default=b"", compare=False, repr=False)


@dataclass(frozen=True)
class WarmstartQuery:
    what: str


def _type_name(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


def _check_route(route: object, method: str, key: str) -> str:
    if not isinstance(route, str):
        raise InputError(f"'{key}' must be a string like '/v1/chat/completions', got {_type_name(route)}")
    if (refusal := route_refusal(route) or method_refusal(route, method)) is not None:
        raise InputError(refusal)
    return route


def _check_stream(value: object, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InputError(f"'{where}' must be true or false, got {_type_name(value)}")
    return value


def parse_job_input(job_input: object, served_model: str) -> EngineRequest | WarmstartQuery:
    """Validate one job's input and decide the request to send. Raises InputError."""
    if not isinstance(job_input, dict):
        raise InputError(f"job input must be a JSON object, got {_type_name(job_input)}")
    if "warmstart" in job_input:
        what = job_input["warmstart"]
        if not isinstance(what, str) or what not in WARMSTART_QUERIES:
            shown = show(what) if isinstance(what, str) else _type_name(what)
            raise InputError(f"'warmstart' must be one of {', '.join(WARMSTART_QUERIES)}, got {shown}")
        return WarmstartQuery(what)

    if "openai_route" in job_input or "openai_input" in job_input:
        body = job_input.get("openai_input")
        if body is not None and not isinstance(body, dict):
            raise InputError(f"'openai_input' must be an object, got {_type_name(body)}")
        method = "POST" if body else "GET"
        route = _check_route(job_input.get("openai_route", "/v1/chat/completions"), method, "openai_route")
        stream = _check_stream((body or {}).get("stream"), "openai_input.stream")
        return _request(route, method, _with_model(body, served_model), stream, raw_events=True)

    if "route" in job_input:
        body = job_input.get("body")
        if body is not None and not isinstance(body, dict):
            raise InputError(f"'body' must be an object, got {_type_name(body)}")
        method = job_input.get("method") or ("POST" if body is not None else "GET")
        if not isinstance(method, str):
            raise InputError(f"'method' must be GET or POST, got {_type_name(method)}")
        method = method.upper()
        route = _check_route(job_input["route"], method, "route")
        stream = _check_stream((body or {}).get("stream"), "body.stream")
        return _request(route, method, _with_model(body, served_model), stream, raw_events=True)

    if "prompt" in job_input or "messages" in job_input:
        params = job_input.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise InputError(f"'sampling_params' must be an object, got {_type_name(params)}")
        stream = _check_stream(job_input.get("stream"), "stream")
        if "messages" in job_input:
            messages = job_input["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages) or not messages:
                raise InputError("'messages' must be a non-empty array of {role, content} objects")
            body: dict[str, Any] = {**params, "messages": messages, "stream": stream}
            route = "/v1/chat/completions"
        else:
            prompt = job_input["prompt"]
            if not isinstance(prompt, str) and not (isinstance(prompt, list) and prompt):
                raise InputError(f"'prompt' must be a string (or a non-empty array), got {_type_name(prompt)}")
            body = {**params, "prompt": prompt, "stream": stream}
            route = "/v1/completions"
        return _request(route, "POST", _with_model(body, served_model), stream, raw_events=False)

    names = sorted(map(str, job_input))
    keys = ", ".join(k if len(k) <= SHOWN_CHARS else show(k) for k in names[:20]) or "none"
    if len(names) > 20:
        keys += f", ... ({len(names)} keys)"
    raise InputError(
        "job input has none of the accepted shapes: {openai_route, openai_input}, {route, body, method}, "
        f"{{prompt | messages, sampling_params, stream}} or {{warmstart: boot_report}}; got keys: {keys}"
    )


# Built once: json.dumps with any option builds a new encoder per call.
_ENCODER = json.JSONEncoder(allow_nan=False)


def _request(route: str, method: str, body: dict[str, Any] | None, stream: bool, *, raw_events: bool) -> EngineRequest:
    """The checked request: body within MAX_DEPTH and MAX_BODY_BYTES, encoded as it will be sent."""
    if body is None:
        return EngineRequest(route, method, None, stream, raw_events)
    if too_deep(body, MAX_DEPTH):
        raise InputError(too_deep_message())
    try:
        # ASCII escapes as aiohttp's json= did: a lone surrogate stays valid JSON on the wire.
        payload = _ENCODER.encode(body).encode("ascii")
    except (TypeError, ValueError, RecursionError) as exc:  # NaN/Infinity, non-JSON values
        raise InputError(f"the request body is not valid JSON: {exc}") from None
    if len(payload) > MAX_BODY_BYTES:
        raise InputError(too_large_message(len(payload)))
    return EngineRequest(route, method, body, stream, raw_events, payload)


def _with_model(body: Mapping[str, Any] | None, served_model: str) -> dict[str, Any] | None:
    if body is None:
        return None
    return {"model": served_model, **body} if "model" not in body else dict(body)


@dataclass
class JobHandler:
    """State shared by jobs: where vLLM is, whether it lives, and this worker's boot report."""

    base_url: str
    served_model: str
    request_timeout_s: float
    boot_report: Callable[[], Mapping[str, Any] | None]
    engine_failure: Callable[[], str | None]  # a message once vLLM has died, else None
    api_key: str | None = field(default=None, repr=False)  # vLLM started with --api-key wants it on /v1
    # A reset connection is often the first sign of vLLM's death: a killed process's sockets
    # close before its exit status can be read. A failed request waits this long for that status,
    # so the job says "vLLM stopped serving" rather than "connection reset".
    death_grace_s: float = 2.0
    # Runpod's local test run or API server (--test_input, --rp_serve_api): its simulator shows a job
    # that returned {"error": ...} as COMPLETED, where Runpod fails it; a log line says what Runpod will.
    local: bool = False
    _session: Any = field(default=None, repr=False)

    async def engine_failure_within(self, seconds: float) -> str | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (failure := self.engine_failure()) is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return failure

    async def session(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=10)
            # No pool limit of its own (aiohttp's default is 100 connections): how many jobs run
            # at once is the Runpod SDK's concurrency modifier's call (MAX_CONCURRENCY), and a
            # hidden cap here would queue jobs that Runpod counts as running.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=POOLED_IDLE_S)  # below vLLM's
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            self._session = aiohttp.ClientSession(timeout=timeout, headers=headers, connector=connector)
        return self._session

    async def handle(self, job: Mapping[str, Any]) -> AsyncIterator[Any]:
        try:
            request = parse_job_input(job.get("input"), self.served_model)
        except InputError as exc:
            if self.local:
                log.warning(
                    "job",
                    "job %s refused (bad input: %s): on Runpod its status is FAILED with this error; "
                    "the local simulator shows it as COMPLETED with an error output",
                    str(job.get("id"))[:80],
                    exc,
                )
            yield {"error": f"bad input: {exc}"}
            return
        if isinstance(request, WarmstartQuery):
            yield dict(self.boot_report() or {"error": "no boot report yet"})
            return
        if (failure := self.engine_failure()) is not None:
            yield {"error": failure}
            return
        import aiohttp

        session = await self.session()
        url = self.base_url + request.route
        try:
            # A ready payload: aiohttp neither looks up a payload type nor merges headers for it.
            data = None if request.body is None else aiohttp.BytesPayload(request.payload, content_type=_JSON)
            async with session.request(request.method, url, data=data) as resp:
                if resp.status >= 400:
                    detail = _error_text(await resp.text())
                    yield {"error": f"vLLM answered HTTP {resp.status} on {request.route}: {detail}"}
                    return
                if not request.stream:
                    yield await resp.json(content_type=None)
                    return
                # Whatever bytes arrived, parsed in one plain call: no awaits per line, and no
                # generator between vLLM's socket and the SDK but this one.
                events = SSEParser()
                async for received in resp.content.iter_any():
                    for event in events.feed(received):
                        if request.raw_events:
                            yield f"data: {event}\n\n"
                        elif event != "[DONE]":
                            yield json.loads(event)
                for event in events.close():
                    if request.raw_events:
                        yield f"data: {event}\n\n"
                    elif event != "[DONE]":
                        yield json.loads(event)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
            failure = await self.engine_failure_within(self.death_grace_s)
            if failure is not None:
                yield {"error": failure}
            else:
                yield {"error": f"request to vLLM failed: {type(exc).__name__}: {exc}"}
        except ValueError as exc:  # an answer that is not JSON: say so instead of a traceback
            yield {"error": f"vLLM's answer on {request.route} was not JSON: {str(exc)[:200]}"}


_JSON = "application/json"


def _error_text(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:500]
        if isinstance(data.get("message"), str):
            return data["message"][:500]
    return text[:500]


class SSEParser:
    """The `data:` payloads of a server-sent event stream, fed the bytes as they arrive.

    Bytes are parsed up to the last complete line; the rest waits for the next feed, so a
    line (or a CR LF) split across reads is read whole. An event ends at a blank line;
    its `data:` lines are joined with newlines; other fields and comments are skipped.
    """

    __slots__ = ("_data", "_rest")

    def __init__(self) -> None:
        self._rest = b""
        self._data: list[str] = []

    def feed(self, received: bytes) -> list[str]:
        buffer = self._rest + received if self._rest else received
        cut = buffer.rfind(b"\n") + 1
        if not cut:
            self._rest = buffer
            return []
        self._rest = buffer[cut:]
        return self._lines(buffer[:cut])

    def close(self) -> list[str]:
        """The events still open when the stream ended (a last event without its blank line)."""
        events = self._lines(self._rest) if self._rest else []
        self._rest = b""
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _lines(self, complete: bytes) -> list[str]:
        events: list[str] = []
        data = self._data
        text = complete.decode("utf-8", errors="replace")
        # Split on "\n" only: str.splitlines() would also cut at U+2028, U+0085 or a form
        # feed, which vLLM's JSON carries unescaped inside generated text.
        for line in (text[:-1] if text.endswith("\n") else text).split("\n"):
            if line.endswith("\r"):
                line = line[:-1]
            if not line:
                if data:
                    events.append("\n".join(data))
                    data.clear()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        return events


def make_handler(state: JobHandler) -> Callable[[Mapping[str, Any]], AsyncIterator[Any]]:
    """The handler for `runpod.serverless.start`: the bound `state.handle` itself. Runpod picks
    its streaming path with `inspect.isasyncgenfunction`, which sees through bound methods
    (runpod/serverless/modules/rp_handler.py: is_generator). A wrapping generator would add
    one more frame switch to every streamed chunk."""
    return state.handle
