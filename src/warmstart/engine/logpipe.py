"""vLLM's output, drained by one thread and read by another, so that reading a line never holds the pipe.

vLLM writes its log into a pipe (of 1 MiB here, Linux's 64 KiB raised). If the thread that drains it also
parsed each line, a slow parse (issue 37: one 4 KB config line cost seconds) would stamp every later line
late and, with the pipe full, stall vLLM's own start-up. So the draining thread (engine/process.py) only
stamps, redacts, echoes and offers each line to a `LineHandoff`: a bounded queue that never blocks its
producer (past one bounded turn for a long line's head, `offer_long`) and counts what it drops, and whose
own thread hands each line to the boot's reader (Boot._on_line). The reader's lag (a line's stamp -> its
handling) is measured here and reported as the boot report's `log_reader`.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import gc
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

# vLLM's pipe holds 1 MiB (Linux's 64 KiB raised, as far as /proc/sys/fs/pipe-max-size allows: 1 MiB by
# default): a megabyte config line goes in at one write, not sixteen each waiting on the reader, and vLLM
# waits on no reader meanwhile (issue 37). The pipe is read as much at a time.
PIPE_BYTES = 1 << 20
# Read from the pipe at most this much at a time: a longer line is echoed whole, in pieces, and only its
# first piece is read for markers (memory stays bounded by a line that never ends).
READ_LIMIT = 4 << 20
# What waits for the reader: this many lines, or this many characters, whichever comes first.
QUEUE_LINES = 20_000
QUEUE_CHARS = 64 << 20
# How long the drain gives the reader for a long line's head before it redacts and echoes the whole line.
READER_TURN_S = 0.02
# A line kept in the tail (the error message's last lines) is cut here; the echo is never cut.
TAIL_CHARS = 4096
# Lags kept for the percentiles (the most recent ones); the maximum is kept over every line.
LAG_SAMPLES = 65_536


@dataclass(frozen=True)
class LogLine:
    t: float  # seconds since the engine was started, when the line was read from the pipe
    text: str


def pieces(stream: BinaryIO) -> Iterator[tuple[bytes, bool, bool]]:
    """(piece, continues a longer line, ends its line) for each read of at most READ_LIMIT bytes, until EOF."""
    continued = False
    while raw := stream.readline(READ_LIMIT):
        ends = raw.endswith(b"\n")
        yield raw, continued, ends
        continued = not ends


def widen_pipe(fd: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # a smaller pipe where the system allows less
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def tail_entry(text: str) -> str:
    return text if len(text) <= TAIL_CHARS else text[:TAIL_CHARS] + " [...]"


def percentile(sorted_values: list[float], share: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(share * len(sorted_values)))]


def freeze_heap() -> None:
    """Leave every object alive now out of the collector's later full passes (`gc.freeze`). The wrapper's
    modules live as long as its process; a full collection walked them all, holding the GIL: 6-9 ms at the
    wrapper's 26k objects, 15-41 ms at the queue front's 96k once the Runpod SDK is imported, and a line
    the reader meets in such a pause waits it out (`bench rehearsal`, issue 37). Called as vLLM starts
    and after the SDK's import."""
    gc.freeze()


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No collection while a large import runs (the SDK's ~70k objects set off full passes in the middle of
    it); what it made is frozen after (`freeze_heap`)."""
    gc.disable()
    try:
        yield
    finally:
        freeze_heap()
        gc.enable()


class LineHandoff:
    """Lines from the draining thread to `handle`, on a thread of its own; `offer` never blocks."""

    def __init__(
        self,
        handle: Callable[[LogLine], None],
        clock: Callable[[], float],
        *,
        max_lines: int = QUEUE_LINES,
        max_chars: int = QUEUE_CHARS,
        name: str = "vllm-log-reader",
    ) -> None:
        self.handle = handle
        self.clock = clock  # the same clock as LogLine.t
        self.max_lines = max_lines
        self.max_chars = max_chars
        self._queue: collections.deque[LogLine] = collections.deque()
        self._chars = 0
        self._cond = threading.Condition()
        self._closed = False
        self._busy = False
        self.offered = 0
        self.handled = 0
        self.dropped = 0
        self.failed = 0  # lines whose handling raised (the reader goes on)
        self.gives_turns = True  # offer_long waits for the reader, until it once took longer than READER_TURN_S
        self._lags: collections.deque[float] = collections.deque(maxlen=LAG_SAMPLES)
        self._max_lag = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def offer(self, line: LogLine) -> bool:
        """Queue a line for the reader; False (and counted) where the queue is full."""
        with self._cond:
            self.offered += 1
            if len(self._queue) >= self.max_lines or self._chars + len(line.text) > self.max_chars:
                self.dropped += 1
                return False
            self._queue.append(line)
            self._chars += len(line.text)
            self._cond.notify()
            return True

    def close(self) -> None:
        """No more lines: the reader handles what is queued, then ends."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def offer_long(self, line: LogLine) -> None:
        """Offer a long line's head, then give the reader its turn, READER_TURN_S at most: the drain's next work,
        redacting and echoing the whole line, is milliseconds of C calls that hold the GIL, and it had kept the
        reader from the head for 5-15 ms (`bench rehearsal --long-line 1048576`, issue 37; 7-11 ms with the
        turn, against 12-20). A reader slower than that is never waited for again: the pipe is not held by it."""
        self.offer(line)
        if self.gives_turns and not self.settle(READER_TURN_S):
            self.gives_turns = False

    def settle(self, timeout: float) -> bool:
        """Wait until every queued line was handled; False if that took longer than `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                line = self._queue.popleft()
                self._chars -= len(line.text)
                self._busy = True
            try:
                self.handle(line)
            except Exception:  # a reader's bug must not end the log's reading; counted, and the boot goes on
                self.failed += 1
            lag = self.clock() - line.t
            with self._cond:
                self._busy = False
                self.handled += 1
                self._lags.append(lag)
                self._max_lag = max(self._max_lag, lag)
                self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        """Lines read, handled, dropped; the lag from a line's read to its handling (ms)."""
        with self._cond:
            lags = sorted(self._lags)
            queued = len(self._queue)
            counts = {"lines": self.offered, "handled": self.handled, "dropped": self.dropped, "queued": queued}
            max_lag = self._max_lag
        return {
            **counts,
            "failed": self.failed,
            "lag_ms": {
                "p50": _ms(percentile(lags, 0.50)),
                "p99": _ms(percentile(lags, 0.99)),
                "max": _ms(max_lag if lags else None),
            },
        }


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 3) if seconds is not None else None
