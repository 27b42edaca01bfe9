"""Hostile job input, fuzzed: the handler refuses with InputError, never forwards outside the
allowlist, and bounds what it forwards. Then schemathesis against Runpod's local API server
with the worker running on the scripted engine: no 5xx.

Case counts (hypothesis examples per property) are set in FUZZ_EXAMPLES and stated in the
README; `make test-fast` runs a quarter of each (tests/helpers/fuzzbudget.py). The whole file runs in
about a minute of CPU on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yarl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.fuzzbudget import cases as fuzz_cases
from helpers.hostile import json_values, mutated_route, small_values
from helpers.worker import Worker
from warmstart.worker.handler import (
    EngineRequest,
    InputError,
    JobHandler,
    WarmstartQuery,
    make_handler,
    parse_job_input,
)
from warmstart.worker.routes import MAX_BODY_BYTES, MAX_DEPTH, ROUTES

SERVED = "org/model"
BASE = "http://127.0.0.1:8123"
FUZZ_EXAMPLES = {"any_input": 2000, "shaped_input": 2000, "routes": 3000, "handler": 1000, "depth": 300}


def fuzz(name: str):
    return settings(
        max_examples=fuzz_cases(FUZZ_EXAMPLES[name]),
        deadline=None,  # a loaded CI machine must not turn a slow case into a failure
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,  # nothing written into the work tree
    )


# ---------------------------------------------------------------------------------------------
# Strategies

route_values = mutated_route() | st.text(max_size=40) | small_values
methods = st.sampled_from(["GET", "POST", "get", "post", "Post", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"])
methods = methods | st.text(max_size=12) | small_values


@st.composite
def shaped_input(draw: st.DrawFn) -> dict[str, Any]:
    """Inputs near the accepted shapes, with each field sometimes of the wrong type."""
    shape = draw(st.sampled_from(["openai", "route", "prompt", "messages", "warmstart", "mixed"]))
    job: dict[str, Any] = {}
    if shape in ("openai", "mixed"):
        if draw(st.booleans()):
            job["openai_route"] = draw(route_values)
        if draw(st.booleans()):
            job["openai_input"] = draw(st.dictionaries(st.text(max_size=10), small_values, max_size=4) | small_values)
    if shape in ("route", "mixed"):
        job["route"] = draw(route_values)
        if draw(st.booleans()):
            job["body"] = draw(st.dictionaries(st.text(max_size=10), small_values, max_size=4) | small_values)
        if draw(st.booleans()):
            job["method"] = draw(methods)
    if shape in ("prompt", "mixed"):
        job["prompt"] = draw(st.text(max_size=30) | small_values)
    if shape in ("messages", "mixed"):
        job["messages"] = draw(
            st.lists(st.dictionaries(st.sampled_from(["role", "content"]), small_values, max_size=2), max_size=3)
            | small_values
        )
    if shape in ("prompt", "messages", "mixed"):
        if draw(st.booleans()):
            job["sampling_params"] = draw(
                st.dictionaries(st.text(max_size=10), small_values, max_size=4) | small_values
            )
        if draw(st.booleans()):
            job["stream"] = draw(st.booleans() | small_values)
    if shape in ("warmstart", "mixed") and draw(st.booleans()):
        job["warmstart"] = draw(st.sampled_from(["boot_report", "Boot_Report", "secrets"]) | small_values)
    return job


def check_outcome(job_input: Any) -> EngineRequest | WarmstartQuery | None:
    """parse_job_input's contract, for any input: InputError or a request inside the allowlist."""
    try:
        request = parse_job_input(job_input, SERVED)
    except InputError as exc:
        assert str(exc)
        assert len(str(exc)) < 2000, "an error message quotes only a short prefix of the input"
        return None
    if isinstance(request, WarmstartQuery):
        assert request.what == "boot_report"
        return request
    assert request.route in ROUTES, request.route  # exact string, nothing normalised
    assert request.method in ROUTES[request.route]
    # What actually goes on the wire: aiohttp builds the URL with yarl, which decodes and
    # normalises dot segments. It must still be the allowlisted route, byte for byte.
    assert yarl.URL(BASE + request.route).path == request.route
    assert str(yarl.URL(BASE + request.route)) == BASE + request.route
    if request.body is None:
        assert request.payload == b""
    else:
        assert len(request.payload) <= MAX_BODY_BYTES
        assert json.loads(request.payload) == json.loads(json.dumps(request.body))
        assert request.body.get("model") is not None
    return request


# ---------------------------------------------------------------------------------------------
# Properties of parse_job_input


@fuzz("any_input")
@given(json_values)
def test_any_json_value_is_parsed_or_refused_with_input_error(job_input):
    check_outcome(job_input)


@fuzz("shaped_input")
@given(shaped_input())
def test_inputs_near_the_accepted_shapes_are_parsed_or_refused_with_input_error(job_input):
    check_outcome(job_input)


@fuzz("routes")
@given(mutated_route(), st.sampled_from(["openai_route", "route"]), st.booleans())
def test_no_encoded_dotted_or_lookalike_route_gets_through(route, key, with_body):
    job: dict[str, Any] = {key: route}
    if with_body:
        job["openai_input" if key == "openai_route" else "body"] = {"prompt": "x"}
    request = check_outcome(job)
    if request is not None:
        assert route in ROUTES  # accepted only when the mutations gave back an allowlisted route


@pytest.mark.parametrize(
    "route",
    [
        "/v1/../sleep",
        "/v1/%2e%2e/sleep",
        "/v1/%2E%2E/sleep",
        "/v1/completions/../../sleep",
        "/v1/completions/%2e%2e/%2e%2e/collective_rpc",
        "//v1/models",
        "/v1//models",
        "/v1/models/",
        "/v1/models?x=1",
        "/v1/models#x",
        "/v1/models;x",
        "/V1/models",
        "/v1/MODELS",
        "/v1\\models",
        "\\v1\\models",
        "/v1／models",
        "/v1/m\u043edels",  # Cyrillic small o
        "/ｖ1/models",
        " /v1/models",
        "/v1/models ",
        "/v1/models\x00",
        "/v1/models%00",
        "%2Fv1%2Fmodels",
        "http://127.0.0.1:9/v1/models",
        "//evil/v1/models",
        "/v1/models\r\nX-Injected: 1",
        "/./v1/models",
        "v1/models",
    ],
)
@pytest.mark.parametrize("key", ["openai_route", "route"])
def test_known_route_tricks_are_refused(route, key):
    with pytest.raises(InputError, match="is not served by this worker"):
        parse_job_input({key: route}, SERVED)


@pytest.mark.parametrize("method", ["GET\r\nX: y", "post ", "TRACE", "CONNECT", "G\u0130T", "ＰＯＳＴ"])
def test_odd_methods_are_refused(method):
    with pytest.raises(InputError, match="accepts"):
        parse_job_input({"route": "/v1/completions", "body": {"prompt": "x"}, "method": method}, SERVED)


# ---------------------------------------------------------------------------------------------
# Limits: deep and large bodies get one clear error, fast


def nested(depth: int, leaf: Any = 1) -> Any:
    """`depth` nested arrays around `leaf`, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@fuzz("depth")
@given(st.integers(1, 3 * MAX_DEPTH), st.sampled_from(["openai", "prompt", "messages"]), st.booleans())
def test_nesting_is_accepted_up_to_the_limit_and_refused_past_it(depth, shape, as_dicts):
    inner = nested(depth - 1)  # depth - 1 containers
    if as_dicts:  # the same depth made of objects
        inner = 1
        for _ in range(depth - 1):
            inner = {"k": inner}
    if shape == "openai":  # the body object itself is level 1
        job = {"openai_route": "/v1/completions", "openai_input": {"prompt": "x", "extra": inner}}
        body_depth = depth
    elif shape == "prompt":
        job = {"prompt": "x", "sampling_params": {"logit_bias": inner}}
        body_depth = depth
    else:
        job = {"messages": [{"role": "user", "content": inner}]}
        body_depth = depth + 2  # body > messages array > message > content
    if body_depth <= MAX_DEPTH:
        assert isinstance(parse_job_input(job, SERVED), EngineRequest)
    else:
        with pytest.raises(InputError, match=f"nests deeper than {MAX_DEPTH} levels"):
            parse_job_input(job, SERVED)


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_very_deep_bodies_are_refused_at_once(depth):
    """Far past Python's recursion limit: the check does not recurse past MAX_DEPTH, so no
    RecursionError and no hang. (Timed loosely: a hang is what this guards against.)"""
    job = {"openai_route": "/v1/completions", "openai_input": {"prompt": nested(depth)}}
    started = time.monotonic()
    with pytest.raises(InputError, match="nests deeper"):
        parse_job_input(job, SERVED)
    assert time.monotonic() - started < 5


def test_a_body_over_the_byte_limit_is_refused_and_one_at_the_limit_passes():
    overhead = len(json.dumps({"model": SERVED, "prompt": ""}))
    fits = {"openai_route": "/v1/completions", "openai_input": {"prompt": "a" * (MAX_BODY_BYTES - overhead)}}
    assert len(parse_job_input(fits, SERVED).payload) == MAX_BODY_BYTES
    over = {"openai_route": "/v1/completions", "openai_input": {"prompt": "a" * (MAX_BODY_BYTES - overhead + 1)}}
    with pytest.raises(InputError, match=f"forwards at most {MAX_BODY_BYTES}"):
        parse_job_input(over, SERVED)
    # Many small items add up the same way (the limit is on the JSON sent, not on one field).
    wide = {"prompt": "x", "sampling_params": {"stop": ["ab"] * (MAX_BODY_BYTES // 6 + 1)}}
    with pytest.raises(InputError, match="bytes of JSON"):
        parse_job_input(wide, SERVED)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, object(), b"bytes", {1, 2}])
def test_values_json_cannot_carry_are_refused(value):
    with pytest.raises(InputError, match="not valid JSON"):
        parse_job_input({"prompt": "x", "sampling_params": {"temperature": value}}, SERVED)


def test_a_lone_surrogate_is_forwarded_as_an_escape():
    request = parse_job_input({"prompt": "a\ud800b"}, SERVED)
    assert b"\\ud800" in request.payload


def test_huge_refused_values_are_quoted_short():
    with pytest.raises(InputError) as info:
        parse_job_input({"openai_route": "/x" * 1_000_000}, SERVED)
    assert len(str(info.value)) < 1000 and "(2000000 characters)" in str(info.value)
    with pytest.raises(InputError) as info:
        parse_job_input({f"k{i}": 1 for i in range(100_000)}, SERVED)
    assert len(str(info.value)) < 1000 and "(100000 keys)" in str(info.value)
    with pytest.raises(InputError) as info:
        parse_job_input({"warmstart": nested(100_000)}, SERVED)
    assert str(info.value).endswith("got array")


# ---------------------------------------------------------------------------------------------
# The handler itself: what it sends, for any input (a recording session, no network)


class RecordingSession:
    """Stands in for aiohttp's session in JobHandler: records each request, answers at once."""

    closed = False

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes | None]] = []

    def request(self, method: str, url: str, data: Any = None) -> Any:
        self.sent.append((method, url, None if data is None else bytes(data._value)))
        return _Answer()


class _Content:
    async def iter_any(self):
        yield b'data: {"choices": [{"text": "a", "finish_reason": null}]}\n\n'
        yield b"data: [DONE]\n\n"


class _Answer:
    status = 200
    content = _Content()

    async def __aenter__(self) -> _Answer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def json(self, content_type: Any = None) -> dict[str, Any]:
        return {"object": "text_completion"}

    async def text(self) -> str:
        return "{}"


@fuzz("handler")
@given(shaped_input() | json_values)
def test_the_handler_never_raises_and_sends_only_allowlisted_requests(job_input):
    session = RecordingSession()
    state = JobHandler(BASE, SERVED, 5, lambda: {"verdict": "warm"}, lambda: None, _session=session)

    async def run() -> list[Any]:
        return [item async for item in make_handler(state)({"id": "fuzz", "input": job_input})]

    items = asyncio.run(run())
    assert items
    try:
        expected = parse_job_input(job_input, SERVED)
    except InputError:
        assert items == [{"error": items[0]["error"]}] and items[0]["error"].startswith("bad input: ")
        assert session.sent == []
        return
    if isinstance(expected, WarmstartQuery):
        assert items == [{"verdict": "warm"}] and session.sent == []
        return
    ((method, url, data),) = session.sent
    assert method in ROUTES[url.removeprefix(BASE)]
    assert yarl.URL(url).path in ROUTES
    assert data == (expected.payload if expected.body is not None else None)
    assert not any(isinstance(item, dict) and "error" in item for item in items)


# ---------------------------------------------------------------------------------------------
# schemathesis against Runpod's local API server, the worker on the scripted engine

SCHEMATHESIS_EXAMPLES = fuzz_cases(200)  # per operation and phase; about 2,000 requests in all


def test_schemathesis_finds_no_server_error(tmp_path: Path, volume, tiny_model, fake_vllm_python):
    """Runpod's local API server (runpod's FastAPI app, /openapi.json) with `warmstart serve`
    behind it: schemathesis' coverage, fuzzing and stateful phases (/run -> /stream/{id},
    /status/{id}). The SDK answers 500 when a handler raises (its runsync and stream paths
    index an item that has no "output"), so no 5xx means the handler never raised."""
    worker = Worker(volume, tmp_path, fake_vllm_python, "schema", FAKE_VLLM_MODE="ok", FAKE_SERVED=tiny_model.repo_id)
    try:
        worker.wait_serving(timeout=120)
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "schemathesis"),
                "run",
                f"http://127.0.0.1:{worker.port}/openapi.json",
                "--checks",
                "not_a_server_error",
                "--max-examples",
                str(SCHEMATHESIS_EXAMPLES),
                "--request-timeout",
                "30",
                "--generation-database",
                "none",
            ],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "NO_COLOR": "1"},
            cwd=tmp_path,  # its cache of crashes (.schemathesis/) stays out of the work tree
            capture_output=True,
            text=True,
            timeout=600,
        )
        summary = result.stdout[result.stdout.find("SUMMARY") :]
        assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
        assert "No issues found" in summary, summary
        cases = re.search(r"(\d+) generated, (\d+) passed", summary)
        assert (
            cases is not None and cases.group(1) == cases.group(2) and int(cases.group(1)) >= 5 * SCHEMATHESIS_EXAMPLES
        ), summary
        assert worker.proc.poll() is None  # the worker still serves
    finally:
        worker.stop()


@pytest.mark.parametrize("raw", ["0", "-1", "1.5", "nan", "a quarter"])
def test_a_fuzz_share_outside_zero_to_one_is_refused_by_name(raw):
    with pytest.raises(ValueError, match="WARMSTART_TEST_FUZZ_SCALE="):
        fuzz_cases(2000, {"WARMSTART_TEST_FUZZ_SCALE": raw})


def test_the_fuzz_share_scales_every_count_and_keeps_at_least_one():
    assert fuzz_cases(2000, {}) == 2000  # `make test`: the full counts
    assert fuzz_cases(2000, {"WARMSTART_TEST_FUZZ_SCALE": "0.25"}) == 500
    assert fuzz_cases(1, {"WARMSTART_TEST_FUZZ_SCALE": "0.25"}) == 1
