"""The load-balancing front's check of a POST body (JSON, nested at most MAX_DEPTH, no NaN or
Infinity), kept off its event loop when the body is costly.

`json.loads` holds the GIL for the whole parse, so a thread would not help: a legal 20 MiB body of
small arrays nested 60 deep costs seconds of CPU and most of a GiB (issue 38), and while it is
parsed no other request is answered, `/ping` included. The cost grows with the number of JSON
values, not with the bytes: a body with few structural characters (`[{,:`, counted with
`bytes.count`, which runs at memory speed) is parsed on the loop, within a few milliseconds even on a
loaded machine; any other body is parsed in a separate process (a small pool, spawned, bounded),
and the front waits for its verdict without blocking. Only the verdict comes back (a refusal or
None), never the parsed value: the body is forwarded as it came. The body reaches its checker as a file
written on a thread (`spill`): pickled into the pool, it held the GIL, and so `/ping`, for 15 ms per
20 MiB of fresh memory (`warmstart-dev bench hostile`, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .. import log
from .routes import MAX_DEPTH, too_deep, too_deep_message

# On the loop: at most this many bytes, and this many structural characters. Measured on the
# 2-core development machine (the costliest shape, arrays nested 60 deep): about 0.2-0.5 us a
# value, so 16,384 values parse in at most about 8 ms; 256 KiB of one string (escapes, UTF-8 or
# UTF-16) in under 1 ms. Chat requests, tools' schemas and prompts of a few thousand token ids
# stay on the loop.
INLINE_BYTES = 256 * 1024
INLINE_VALUES = 16384
# Where a costly body waits for its checker: memory where /dev/shm is (a container has it), else the temp folder.
SPILL_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
CHECKERS = 2  # processes parsing costly bodies at once (each may take ~1 GiB for a hostile 20 MiB body)
WAITING = 8  # costly bodies waiting for a checker beyond those; more are refused with 503 (retry)


class Busy(Exception):
    """Too many costly bodies are being checked: the request is refused with 503 and Retry-After."""


def _no_constant(name: str) -> float:
    raise ValueError(f"the request body holds {name}, which JSON does not allow")


def json_problem(body: bytes) -> str | None:
    """Why a POST body is not forwarded (not JSON, NaN/Infinity, nested too deep), or None. Pure: it
    runs on the front's loop for cheap bodies and in a checker process for the others."""
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except RecursionError:  # the C decoder's own depth limit, far past MAX_DEPTH
        return too_deep_message()
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, bytes that are not UTF-8/16/32
        text = str(exc)
        if "JSON does not allow" in text:
            return text
        return f"the request body is not valid JSON: {text[:200]}"
    if type(value) in (dict, list) and too_deep(value, MAX_DEPTH):
        return too_deep_message()
    return None


def json_problem_in(path: str) -> str | None:
    """`json_problem` of the body spilled to `path` (removed once read): what a checker process runs."""
    try:
        with open(path, "rb") as handle:
            body = handle.read()
    finally:
        os.unlink(path)
    return json_problem(body)


def spill(body: bytes) -> str:
    """Write `body` to a file of its own (in memory where /dev/shm is) for a checker to read; its path. Run on
    a thread: the write lets go of the GIL, where handing the bytes to the pool would pickle them while
    holding it (15 ms for 20 MiB of fresh memory here, with /ping waiting)."""
    fd, path = tempfile.mkstemp(prefix="warmstart-body-", dir=SPILL_DIR)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path


def cheap(body: bytes) -> bool:
    """Can `body` be parsed on the event loop without holding it more than a few milliseconds?
    Structural characters inside strings count too: an overestimate only sends a body to a checker."""
    if len(body) > INLINE_BYTES:
        return False
    values = body.count(b",") + body.count(b":") + body.count(b"[") + body.count(b"{")
    return values <= INLINE_VALUES


class BodyChecker:
    """`json_problem` for any body, without holding the event loop: in a process of its own for a
    costly one. Used from one event loop; the pool starts with the first costly body."""

    def __init__(self, checkers: int = CHECKERS, waiting: int = WAITING) -> None:
        self.checkers = checkers
        self.limit = checkers + waiting
        self.pending = 0
        self.warned = False
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: the worker has threads (the front's, the watchdog's), which fork would copy mid-lock.
            # Niced: a check is background work; the relay and /ping come first on a busy machine.
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(self.checkers, context, initializer=os.nice, initargs=(10,))
        return self._pool

    async def problem(self, body: bytes) -> str | None:
        if cheap(body):
            return json_problem(body)
        if self.pending >= self.limit:
            raise Busy(f"{self.pending} large request bodies are being checked; retry")
        self.pending += 1
        try:
            path = None
            try:
                path = await asyncio.to_thread(spill, body)
            except OSError:  # no room for the file: the body goes to the checker as it is (pickled)
                future = self._submit(json_problem, body)
            else:
                future = self._submit(json_problem_in, path)
            try:
                if future is None:  # no process can be started here: check on the loop
                    return json_problem(body)
                return await asyncio.wrap_future(future)
            finally:
                if path is not None:  # a check that never ran (cancelled, a killed checker) leaves its file
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        except BrokenProcessPool:  # a checker was killed (out of memory, most likely): a fresh pool next time
            self.close()
            raise Busy("the request body's check was interrupted; retry") from None
        finally:
            self.pending -= 1

    def _submit(self, check: Callable[[Any], str | None], argument: Any) -> Future[str | None] | None:
        try:
            return self._executor().submit(check, argument)
        except (RuntimeError, OSError) as exc:
            if not self.warned:
                self.warned = True
                log.warning("front", "large request bodies are checked on the event loop: %s", str(exc)[:200])
            return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
