"""vLLM's pipe is never held by reading its log (issue 37): the draining thread only stamps, redacts and
echoes; the boot's reader runs on a thread of its own behind a bounded queue that counts its drops; lines
of any length are echoed whole; and what the evidence keeps of a serving engine's output is bounded."""

from __future__ import annotations

import io
import os
import sys
import threading
import time

from warmstart.engine.logpipe import READ_LIMIT, LineHandoff, LogLine
from warmstart.engine.process import EngineProcess
from warmstart.report.model import BootReport
from warmstart.vllm import phases
from warmstart.vllm.logformats import MATCH_CAP
from warmstart.vllm.phases import LogEvidence


def child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_blocked_reader_does_not_hold_the_child():
    """The child writes 30,000 lines and exits while the reader is stuck on its first line: the pipe is drained
    all the same, the lines past the queue are dropped and counted (the old reader parsed on the pipe's thread:
    the child blocked on a full pipe until the reader came back)."""
    release = threading.Event()
    seen: list[LogLine] = []

    def stuck(line: LogLine) -> None:
        release.wait(30)
        seen.append(line)

    lines = 30_000
    echo = io.StringIO()
    proc = EngineProcess(
        child(f"import sys\nfor i in range({lines}): sys.stdout.write('INFO line %d %s\\n' % (i, 'x' * 80))"),
        dict(os.environ),
        0,
        on_line=stuck,
        echo=echo,
        queue_lines=1000,
    )
    proc.start()
    try:
        started = time.monotonic()
        assert proc.proc is not None
        proc.proc.wait(timeout=10)
        exited_s = time.monotonic() - started
        # The drain ends at EOF with the reader still stuck: the pipe's last lines (the child had exited
        # with them unread) are dropped too. Released before that, the reader would make room for them.
        proc._reader.join(10)
        assert not proc._reader.is_alive()
    finally:
        release.set()
    assert exited_s < 10
    assert proc.settle(10)
    stats = proc.reader_stats()
    assert stats is not None
    assert stats["lines"] == lines
    assert stats["handled"] == len(seen)
    assert stats["handled"] + stats["dropped"] == lines
    assert stats["dropped"] >= lines - 1000 - 2  # the queue held 1000, the reader one (or two, as it popped)
    assert echo.getvalue().count("\n") == lines  # every line echoed, dropped or not
    assert stats["lag_ms"]["max"] >= stats["lag_ms"]["p99"] >= stats["lag_ms"]["p50"] > 0


def test_lines_of_any_length_are_echoed_whole_and_read_by_their_head():
    """A 1 MB line, a line longer than the read limit, then a marker: the echo is what the child wrote, the
    reader gets each line once (its head), and the line after them is read as usual."""
    seen: list[LogLine] = []
    echo = io.StringIO()
    long = READ_LIMIT + 12345
    code = (
        "import sys\n"
        "sys.stdout.write('a' * (1 << 20) + '\\n')\n"
        f"sys.stdout.write('b' * {long} + '\\n')\n"
        "sys.stdout.write('INFO 01-01 00:00:00 Application startup complete.\\n')\n"
    )
    proc = EngineProcess(child(code), dict(os.environ), 0, on_line=seen.append, echo=echo)
    proc.start()
    assert proc.proc is not None
    proc.proc.wait(timeout=20)
    proc._reader.join(10)
    assert proc.settle(10)
    out = echo.getvalue().split("\n")
    assert [len(x) for x in out] == [1 << 20, long, len("INFO 01-01 00:00:00 Application startup complete."), 0]
    assert [len(line.text) for line in seen[:2]] == [MATCH_CAP, MATCH_CAP]
    assert seen[2].text.endswith("Application startup complete.")
    assert len(seen) == 3
    assert proc.reader_stats()["long_lines"] == 1
    assert all(len(t) < 5000 for t in proc.tail)  # the error message's tail is cut, never the echo


class _SlowEcho(io.StringIO):
    """An echo whose writes of long lines wait until released: a slow pipe to the worker's log."""

    def __init__(self, release: threading.Event, seen: list[LogLine]) -> None:
        super().__init__()
        self.release, self.seen, self.read_before_written = release, seen, []

    def write(self, text: str) -> int:
        self.read_before_written.append(any(text.startswith(line.text) for line in self.seen))
        if len(text) > MATCH_CAP:
            self.release.wait(10)
        return super().write(text)


def test_a_long_line_is_read_while_its_echo_is_written_and_a_short_one_after():
    """Issue 37: writing out a 1 MB line (into a slow pipe) must not delay its reading, so a line over
    MATCH_CAP is offered before its echo; the short line is offered after its echo, so that what the reader
    says of it follows it in the log."""
    release, seen = threading.Event(), []
    echo = _SlowEcho(release, seen)
    code = "import sys\nsys.stdout.write('a' * (1 << 20) + '\\n')\nsys.stdout.write('INFO short\\n')\n"
    proc = EngineProcess(child(code), dict(os.environ), 0, on_line=seen.append, echo=echo)
    proc.start()
    try:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [len(line.text) for line in seen] == [MATCH_CAP], "the long line was read while its echo waited"
    finally:
        release.set()
    assert proc.proc is not None
    proc.proc.wait(timeout=20)
    proc._reader.join(10)
    assert proc.settle(10)
    assert [line.text for line in seen][1:] == ["INFO short"]
    assert echo.read_before_written[1] is False  # the short line reached the reader only after its echo
    assert echo.getvalue() == "a" * (1 << 20) + "\nINFO short\n"


def test_a_megabyte_line_goes_into_the_pipe_at_once_while_the_drain_is_held(tmp_path):
    """vLLM's pipe holds 1 MiB (engine/logpipe.py PIPE_BYTES), not Linux's 64 KiB: with the drain held on a slow
    echo of one long line, vLLM still writes the next line of almost a megabyte at once and goes on (with
    64 KiB its write waited for the drain; issue 37: vLLM's start-up must never wait on the wrapper's log)."""
    release, seen = threading.Event(), []
    wrote = tmp_path / "wrote"
    code = (
        "import sys\n"
        "sys.stdout.write('a' * (1 << 20) + '\\n'); sys.stdout.flush()\n"
        "sys.stdout.write('b' * 1_000_000 + '\\n'); sys.stdout.flush()\n"
        f"open({str(wrote)!r}, 'w').close()\n"
    )
    proc = EngineProcess(child(code), dict(os.environ), 0, on_line=seen.append, echo=_SlowEcho(release, seen))
    proc.start()
    try:
        deadline = time.monotonic() + 10
        while not wrote.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert wrote.exists(), "vLLM's second line waited on the held drain"
    finally:
        release.set()
    assert proc.proc is not None
    proc.proc.wait(timeout=20)
    proc._reader.join(10)
    assert [len(line.text) for line in seen] == [MATCH_CAP, MATCH_CAP]


def test_a_long_lines_head_gets_the_readers_turn_and_a_stuck_reader_gets_one_only(monkeypatch):
    """Having offered a long line's head, the drain waits for the reader (READER_TURN_S at most) before it redacts
    and echoes the whole line, C calls that hold the GIL for milliseconds (issue 37: the head waited 5-15 ms
    for them). A reader slower than that is not waited for again: 40 long lines to a stuck reader, one wait."""
    from warmstart.engine import logpipe

    monkeypatch.setattr(logpipe, "READER_TURN_S", 5.0)  # room for any scheduler: the order is what is asserted
    seen: list[LogLine] = []
    released = threading.Event()
    released.set()
    echo = _SlowEcho(released, seen)  # records, at each write, whether the reader had the line already

    def slow(line: LogLine) -> None:
        time.sleep(0.05)
        seen.append(line)

    code = "import sys\nsys.stdout.write('a ' * (1 << 19) + '\\n')\n"
    proc = EngineProcess(child(code), dict(os.environ), 0, on_line=slow, echo=echo)
    proc.start()
    assert proc.proc is not None
    proc.proc.wait(timeout=20)
    proc._reader.join(10)
    assert echo.read_before_written == [True] and echo.getvalue() == "a " * (1 << 19) + "\n"
    assert proc._handoff is not None and proc._handoff.gives_turns

    monkeypatch.setattr(logpipe, "READER_TURN_S", 0.05)
    waits: list[float] = []
    settle = LineHandoff.settle
    monkeypatch.setattr(LineHandoff, "settle", lambda self, timeout: waits.append(timeout) or settle(self, timeout))
    release = threading.Event()
    lines = 40
    code = f"import sys\nfor _ in range({lines}): sys.stdout.write('b ' * 100_000 + '\\n')\n"
    stuck = EngineProcess(child(code), dict(os.environ), 0, on_line=lambda _line: release.wait(30), echo=io.StringIO())
    stuck.start()
    try:
        assert stuck.proc is not None
        stuck.proc.wait(timeout=20)
        stuck._reader.join(10)
        assert waits == [0.05] and stuck._handoff is not None and not stuck._handoff.gives_turns
    finally:
        release.set()


def test_starting_vllm_freezes_the_wrappers_heap():
    """The objects alive when vLLM starts (the wrapper's modules) are out of every later full collection, which
    walked them all holding the GIL: 6-41 ms pauses of the log reader (engine/logpipe.py freeze_heap)."""
    import gc

    gc.unfreeze()
    proc = EngineProcess(child("pass"), dict(os.environ), 0, on_line=lambda _line: None, echo=io.StringIO())
    try:
        proc.start()
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
        assert proc.proc is not None
        proc.proc.wait(timeout=20)


def test_the_handoff_never_blocks_and_counts_its_drops():
    gate = threading.Event()
    handoff = LineHandoff(lambda _line: gate.wait(10), time.monotonic, max_lines=3)
    started = time.monotonic()
    results = [handoff.offer(LogLine(time.monotonic(), f"line {i}")) for i in range(10)]
    assert time.monotonic() - started < 0.5
    gate.set()
    assert handoff.settle(5)
    stats = handoff.stats()
    assert stats["lines"] == 10
    assert stats["dropped"] == results.count(False) >= 6
    assert stats["handled"] == 10 - stats["dropped"]


def test_a_reader_that_raises_is_counted_and_reading_goes_on():
    def bad(line: LogLine) -> None:
        if "boom" in line.text:
            raise ValueError("a bug")

    handoff = LineHandoff(bad, time.monotonic)
    for text in ("a", "boom", "b"):
        handoff.offer(LogLine(time.monotonic(), text))
    assert handoff.settle(5)
    assert handoff.stats()["failed"] == 1
    assert handoff.stats()["handled"] == 3


def test_evidence_stays_bounded_while_the_engine_serves(monkeypatch):
    """After ready vLLM prints a line per request for hours: the evidence kept of them is bounded (it kept the
    time of every line before)."""
    monkeypatch.setattr(phases, "MAX_LINES", 200)
    monkeypatch.setattr(phases, "MAX_MARKERS", 200)
    ev = LogEvidence()
    ev.feed("INFO 01-01 00:00:00 Application startup complete.", 0.0)
    serving = 2000
    for i in range(serving):
        ev.feed(f"INFO 01-01 00:00:01 [loggers.py:1] POST /v1/completions 200 OK {i}", 1.0 + i)
        ev.feed(
            f"WARNING [jit_monitor.py:127] Triton kernel JIT compilation during inference: k{i}. This causes a "
            "latency spike; consider extending warmup to cover this shape/config.",
            1.5 + i,
        )
        ev.feed(f"an autotuning note no table reads {i}", 1.7 + i)
    assert len(ev.stamps) <= 200
    assert len(ev.lines) <= 200
    assert len(ev.markers) <= 200
    assert all(len(v) <= phases.MAX_HINTS for v in ev.hints.values())
    assert ev.last_stamp == 1.7 + serving - 1
    assert ev.dropped_markers > 0


def test_the_report_says_what_the_reader_dropped():
    reader = {"lines": 100, "handled": 97, "dropped": 3, "queued": 0, "failed": 0, "lag_ms": {}}
    report = BootReport(None, None, None, None, None, {}, {}, None, log_reader=reader)
    assert report.to_dict()["log_reader"] == reader
    assert any("dropped 3" in line for line in report.lines())
    quiet = BootReport(None, None, None, None, None, {}, {}, None, log_reader={**reader, "dropped": 0})
    assert not any("dropped" in line for line in quiet.lines())
