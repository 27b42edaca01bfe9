"""What a worker forwards to vLLM, in either front: the route allowlist and the body limits.

One table for both fronts, so that the queue worker's jobs (worker/handler.py) and the
load-balancing worker's HTTP requests (worker/front.py) reach exactly the same vLLM routes,
with the same methods, under the same limits.

Routes are compared as exact strings: no decoding, case folding or path normalisation happens
before the check, so `/v1/../sleep`, `%2e%2e`, `//v1/models`, `/v1/models?x`, `/V1/models` or
look-alike characters are all refused, and what is sent is the base URL plus an allowlisted
route, byte for byte. vLLM's admin and engine-control routes (/sleep, /wake_up,
/collective_rpc, /reset_prefix_cache, /pause, /v1/load_lora_adapter, /server_info,
/scale_elastic_ep, /start_profile, ...) are never in the table.

Limits: a body sent to vLLM is at most MAX_BODY_BYTES of JSON and nests at most MAX_DEPTH
containers deep. Runpod itself refuses payloads over 20 MB on /runsync; the depth limit keeps a
hostile body from reaching a recursion limit in a JSON encoder or decoder (vLLM's included).
"""

from __future__ import annotations

from collections.abc import Mapping

# Route -> allowed methods. Everything else is refused.
ROUTES: Mapping[str, frozenset[str]] = {
    "/v1/chat/completions": frozenset({"POST"}),
    "/v1/completions": frozenset({"POST"}),
    "/v1/models": frozenset({"GET"}),
    "/v1/embeddings": frozenset({"POST"}),
    "/v1/responses": frozenset({"POST"}),
    "/v1/score": frozenset({"POST"}),
    "/v1/rerank": frozenset({"POST"}),
    # Anthropic Messages: worker-vllm documents them and vLLM serves them
    # (vllm/entrypoints/anthropic/api_router.py, "/v1/messages", "/v1/messages/count_tokens").
    "/v1/messages": frozenset({"POST"}),
    "/v1/messages/count_tokens": frozenset({"POST"}),
    "/tokenize": frozenset({"POST"}),
    "/detokenize": frozenset({"POST"}),
}

# vLLM's uvicorn closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default (vllm 0.32
# envs.py; launchers/api_server/entry.py `timeout_keep_alive=`); aiohttp keeps one pooled for 15 s. A
# request sent on a connection that vLLM closes at that moment fails (with a large body, aiohttp's
# "Can not write request body"): both fronts' pools let go of a connection first.
POOLED_IDLE_S = 4.0
MAX_BODY_BYTES = 20 * 1024 * 1024  # JSON bytes sent to vLLM; Runpod's own /runsync limit is 20 MB
MAX_DEPTH = 64  # nested objects/arrays in a body; OpenAI bodies (tools' JSON schemas included) stay far below
SHOWN_CHARS = 80  # how much of a refused value an error message quotes


def show(value: str) -> str:
    """A refused string as quoted in an error: repr, cut short (a request may send megabytes)."""
    if len(value) <= SHOWN_CHARS:
        return repr(value)
    return f"{value[:SHOWN_CHARS]!r}... ({len(value)} characters)"


def route_refusal(route: str) -> str | None:
    """Why `route` is not forwarded (exact string: nothing is decoded or normalised first), or None."""
    if route in ROUTES:
        return None
    allowed = ", ".join(sorted(ROUTES))
    return f"route {show(route)} is not served by this worker; allowed routes: {allowed}"


def method_refusal(route: str, method: str) -> str | None:
    """Why `method` is not forwarded on the allowlisted `route`, or None."""
    if method in ROUTES[route]:
        return None
    shown = method if len(method) <= SHOWN_CHARS else show(method)
    return f"{route} accepts {'/'.join(sorted(ROUTES[route]))}, not {shown}"


_CONTAINERS = (dict, list, tuple)


def too_deep(value: object, budget: int = MAX_DEPTH) -> bool:
    """Does `value` nest more than `budget` objects/arrays deep? It recurses at most `budget`
    levels (never near Python's recursion limit) and stops at the first container too deep.
    Written for speed: it runs on every request (see `warmstart-dev bench serve`)."""
    if budget <= 0:
        return True
    children = value.values() if type(value) is dict else value
    for child in children:  # type: ignore[attr-defined]
        if type(child) in _CONTAINERS and too_deep(child, budget - 1):
            return True
    return False


def too_deep_message() -> str:
    return f"the request body nests deeper than {MAX_DEPTH} levels of objects/arrays"


def too_large_message(size: int) -> str:
    return f"the request body is {size} bytes of JSON; this worker forwards at most {MAX_BODY_BYTES}"
