"""Jobs: worker-vllm's input shapes -> one request to vLLM on loopback -> output or stream.

Accepted inputs (as in runpod-workers/worker-vllm):

    {"openai_route": "/v1/chat/completions", "openai_input": {...}}   OpenAI route, POST (GET without input)
    {"route": "/v1/completions", "body": {...}, "method": "POST"}      explicit route
    {"prompt": "...", "sampling_params": {...}, "stream": false}      -> /v1/completions
    {"messages": [...], "sampling_params": {...}, "stream": false}    -> /v1/chat/completions
    {"warmstart": "boot_report"}                                      this worker's BootReport

Only the routes in ROUTES are forwarded; vLLM's admin routes (/sleep, /collective_rpc,
/v1/load_lora_adapter, ...) are refused with a message. Bad input never raises: it
becomes {"error": "<what was wrong>"}, which Runpod turns into a failed job with that
text, and the worker goes on serving.

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

# Route -> allowed methods. Everything else is refused.
ROUTES: Mapping[str, frozenset[str]] = {
    "/v1/chat/completions": frozenset({"POST"}),
    "/v1/completions": frozenset({"POST"}),
    "/v1/models": frozenset({"GET"}),
    "/v1/embeddings": frozenset({"POST"}),
    "/v1/responses": frozenset({"POST"}),
    "/v1/score": frozenset({"POST"}),
    "/v1/rerank": frozenset({"POST"}),
    "/tokenize": frozenset({"POST"}),
    "/detokenize": frozenset({"POST"}),
}

WARMSTART_QUERIES = ("boot_report",)


class InputError(ValueError):
    """The job input is not something this worker serves; the message says why."""


@dataclass(frozen=True)
class EngineRequest:
    route: str
    method: str
    body: Mapping[str, Any] | None
    stream: bool
    raw_events: bool  # yield SSE text (OpenAI relay) rather than parsed chunks


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
    if route not in ROUTES:
        allowed = ", ".join(sorted(ROUTES))
        raise InputError(f"route {route!r} is not served by this worker; allowed routes: {allowed}")
    if method not in ROUTES[route]:
        raise InputError(f"{route} accepts {'/'.join(sorted(ROUTES[route]))}, not {method}")
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
        if what not in WARMSTART_QUERIES:
            raise InputError(f"'warmstart' must be one of {', '.join(WARMSTART_QUERIES)}, got {what!r}")
        return WarmstartQuery(what)

    if "openai_route" in job_input or "openai_input" in job_input:
        body = job_input.get("openai_input")
        if body is not None and not isinstance(body, dict):
            raise InputError(f"'openai_input' must be an object, got {_type_name(body)}")
        method = "POST" if body else "GET"
        route = _check_route(job_input.get("openai_route", "/v1/chat/completions"), method, "openai_route")
        stream = _check_stream((body or {}).get("stream"), "openai_input.stream")
        return EngineRequest(route, method, _with_model(body, served_model), stream, raw_events=True)

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
        return EngineRequest(route, method, _with_model(body, served_model), stream, raw_events=True)

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
        return EngineRequest(route, "POST", _with_model(body, served_model), stream, raw_events=False)

    keys = ", ".join(sorted(map(str, job_input))) or "none"
    raise InputError(
        "job input has none of the accepted shapes: {openai_route, openai_input}, {route, body, method}, "
        f"{{prompt | messages, sampling_params, stream}} or {{warmstart: boot_report}}; got keys: {keys}"
    )


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
    _session: Any = field(default=None, repr=False)

    async def session(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=10)
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            self._session = aiohttp.ClientSession(timeout=timeout, headers=headers)
        return self._session

    async def handle(self, job: Mapping[str, Any]) -> AsyncIterator[Any]:
        try:
            request = parse_job_input(job.get("input"), self.served_model)
        except InputError as exc:
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
            async with session.request(request.method, url, json=request.body) as resp:
                if resp.status >= 400:
                    detail = _error_text(await resp.text())
                    yield {"error": f"vLLM answered HTTP {resp.status} on {request.route}: {detail}"}
                    return
                if not request.stream:
                    yield await resp.json(content_type=None)
                    return
                async for event in _sse_events(resp.content):
                    if request.raw_events:
                        yield f"data: {event}\n\n"
                    elif event != "[DONE]":
                        yield json.loads(event)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
            failure = self.engine_failure()
            if failure is not None:
                yield {"error": failure}
            else:
                yield {"error": f"request to vLLM failed: {type(exc).__name__}: {exc}"}


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


async def _sse_events(content: Any) -> AsyncIterator[str]:
    """`data:` payloads of a server-sent event stream, one per event."""
    data: list[str] = []
    async for raw in content:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        yield "\n".join(data)


def make_handler(state: JobHandler) -> Callable[[Mapping[str, Any]], AsyncIterator[Any]]:
    """A plain async generator function: runpod checks `inspect.isasyncgenfunction` on it."""

    async def handler(job: Mapping[str, Any]) -> AsyncIterator[Any]:
        async for item in state.handle(job):
            yield item

    return handler
