"""Every marker of every release's table reads a line in time linear in its length (issue 37).

The worst shapes of a line, up to 1 MB: runs of spaces, a format's own literals repeated, each marker's
near miss (its message less its last character, over and over), and the real 4.3 KB engine config line of
tests/fixtures/gpu-0.33-fitted-capture.log grown. Each call is timed against a linear baseline over the
same line (`str.find` of a string that is not there), with a generous absolute floor for a loaded 2-core
machine; a call that runs past a hard limit is cut by SIGALRM (Python's regex engine checks signals), so
a quadratic matcher fails here instead of hanging. And on every line of the corpus the linear matcher
captures exactly what the format's regex captures.
"""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.run import FIXTURES
from warmstart.redact import Redactor
from warmstart.vllm import logformats
from warmstart.vllm.logformats import ALL_MARKERS, FORMATS, MarkerSpec, format_to_regex
from warmstart.vllm.phases import LogEvidence
from warmstart.vllm.releases import CUDA_RELEASES

MB = 1 << 20
# Per call on a 1 MB line: a linear matcher needs a few ms; the bound is generous for a loaded machine.
ABSOLUTE_S = 0.05
BASELINE_FACTOR = 40  # or this many times a str.find over the same line, whichever is larger
HARD_LIMIT_S = 2.0  # a call still running after this is cut (the quadratic regex took minutes)


def tables() -> dict[str, tuple[MarkerSpec, ...]]:
    out = {f.name: f.markers for f in FORMATS}
    out |= {f.name: f.markers for f in CUDA_RELEASES.values()}
    out["all"] = ALL_MARKERS
    return out


@cache
def every_spec() -> tuple[MarkerSpec, ...]:
    """Each distinct marker of every table (the same wording in two tables is read by the same matcher)."""
    seen: dict[tuple[str, str, bool], MarkerSpec] = {}
    for specs in tables().values():
        for s in specs:
            seen.setdefault((s.name, s.fmt, s.anchored), s)
    return tuple(seen.values())


def config_line() -> str:
    lines = (FIXTURES / "gpu-0.33-fitted-capture.log").read_text().splitlines()
    return max(lines, key=len)


def render(fmt: str) -> str:
    """The message with plausible values in place of its conversions."""
    return (
        fmt.replace("%%", "\0")
        .replace("%.2f", "1.25")
        .replace("%.0f", "3")
        .replace("%.3f", "0.125")
        .replace("%.4f", "1.5")
        .replace("%.6f", "2.5")
        .replace("%d", "7")
        .replace("%s", "x")
        .replace("\0", "%")
    )


def literals(fmt: str) -> list[str]:
    import re

    return [p for p in re.split(r"%(?:\.\d+)?[sdf%]", fmt) if p]


def shape(kind: str, spec: MarkerSpec, size: int) -> str:
    if kind == "spaces":
        return "a" + " " * size + "b"
    if kind == "literals":  # the format's literals repeated, each one with a space: no conversion between them
        chunk = " ".join(literals(spec.fmt)) + " "
        return chunk * (size // max(1, len(chunk)) + 1)
    if kind == "near_miss":  # the message less its last character, again and again
        chunk = render(spec.fmt)[:-1] + " "
        return chunk * (size // len(chunk) + 1)
    if kind == "first_literal":  # the first words of the message, then never the rest
        first = (literals(spec.fmt) or ["x"])[0]
        return first * (size // len(first) + 1)
    if kind == "config":  # the real 4.3 KB config line grown: its field list repeated
        line = config_line()
        head, _, fields = line.partition("with config: ")
        return head + "with config: " + fields * (size // len(fields) + 1)
    raise AssertionError(kind)


class Overran(Exception):
    pass


@contextmanager
def hard_limit(seconds: float):
    def _raise(_signum, _frame):
        raise Overran(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def timed_once(call, line: str) -> float:
    with hard_limit(HARD_LIMIT_S):
        start = time.perf_counter()
        call(line)
        return time.perf_counter() - start


def timed(call, line: str, over: float | None = None) -> float:
    """Seconds of one call; where it is over `over`, the better of two (a loaded machine preempts a thread for
    tens of ms now and then; a quadratic call is over both times)."""
    seconds = timed_once(call, line)
    if over is not None and seconds > over:
        seconds = min(seconds, timed_once(call, line))
    return seconds


def bound(line: str) -> float:
    start = time.perf_counter()
    line.find("\x00never in a line\x00")
    baseline = time.perf_counter() - start
    return max(ABSOLUTE_S * max(1.0, len(line) / MB), BASELINE_FACTOR * baseline)


SHAPES = ("spaces", "literals", "near_miss", "first_literal", "config")
SIZES = st.sampled_from([4 * 1024, 6 * 1024, 64 * 1024, MB])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(index=st.integers(min_value=0), kind=st.sampled_from(SHAPES), size=SIZES)
def test_every_marker_reads_a_line_in_linear_time(index, kind, size):
    """One marker's worst shapes, and the line through every marker of every table: each call within bound."""
    specs = every_spec()
    spec = specs[index % len(specs)]
    line = shape(kind, spec, size)
    limit = bound(line)
    slow = []
    for other in specs:
        seconds = timed(other.pattern.search, line, over=limit)
        if seconds > limit:
            slow.append(f"{other.name} {other.fmt[:40]!r}: {seconds * 1000:.1f} ms")
    assert not slow, f"{kind} line of {len(line)} chars (bound {limit * 1000:.1f} ms): {slow}"


@pytest.mark.parametrize("kind", SHAPES)
def test_a_whole_line_is_read_in_linear_time(kind):
    """Everything the evidence does with a line (markers, hints, stamps), on a 1 MB line of each shape."""
    spec = next(s for s in every_spec() if s.name == "jit_during_inference")
    line = "(EngineCore pid=1) WARNING 12-31 23:59:59 [jit_monitor.py:127] " + shape(kind, spec, MB)
    for name, specs in tables().items():
        if name not in ("all", "cpu-0.32", "cuda-0.33"):  # the releases' tables are subsets of "all"
            continue
        seconds = timed(lambda text, specs=specs: LogEvidence(specs=specs).feed(text, 1.0), line)
        assert seconds <= max(len(specs) * bound(line), 0.5), f"{name}: {seconds:.3f} s"


def test_the_redactor_reads_a_line_in_linear_time():
    """The reader thread redacts every line before echoing it: its URL-password pattern too."""
    redactor = Redactor(["s3cr3t-value-long-enough"])
    for line in ("a." * (MB // 2), "x a-b+c." * (MB // 8) + "://", "https://u:" + "p" * MB):
        assert timed(redactor.text, line) <= max(3 * bound(line), 0.2)


def corpus_lines() -> list[str]:
    paths = sorted(FIXTURES.glob("*.log")) + sorted((FIXTURES / "real").glob("*.log"))
    return sorted(
        {part for p in paths for line in p.read_text(errors="replace").splitlines() for part in line.split("\r")}
    )


def test_the_matcher_captures_what_the_formats_regex_captures():
    """On every line of the corpus, for every marker: found where the regex finds it, with the same captures.
    The regex only runs where every literal of the format is in the line (elsewhere it cannot match)."""
    differ = []
    for spec in every_spec():
        regex = format_to_regex(spec.fmt, anchored=spec.anchored)
        need = literals(spec.fmt[2:] if spec.fmt.startswith("%s") and not spec.fmt.startswith("%s ") else spec.fmt)
        for line in corpus_lines():
            ours = spec.pattern.search(line)
            theirs = regex.search(line) if all(part in line for part in need) else None
            got = ours.groups() if ours else None
            want = tuple(g or "" for g in theirs.groups()) if theirs else None
            if got != want:
                differ.append((spec.name, line[:160], got, want))
    assert differ == []


def test_only_the_head_of_a_very_long_line_is_read():
    message = "Starting vLLM server on http://127.0.0.1:8000"
    assert next(s for s in ALL_MARKERS if s.name == "server_start").pattern.search(message) is not None
    padded = " " * logformats.MATCH_CAP + message
    assert all(s.pattern.search(padded) is None for s in ALL_MARKERS if s.name == "server_start")


def test_the_other_patterns_on_a_captured_field_are_linear():
    """tqdm's elapsed time is read from a capture bar's field, which may be long: a run of digits."""
    from warmstart.vllm.cudagraphs import config_sizes
    from warmstart.vllm.phases import tqdm_seconds

    digits = "1" * MB
    assert timed(tqdm_seconds, digits) <= bound(digits) * 3 + ABSOLUTE_S
    config = "'cudagraph_capture_sizes': [" + "1, " * (MB // 3)
    assert timed(config_sizes, config) <= bound(config) * 3 + ABSOLUTE_S
