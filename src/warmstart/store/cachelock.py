"""Who may replace the local cache: an `flock` on `<cache>.lock`, held for the life of the process.

Two workers may share one local cache (`WARMSTART_LOCAL_CACHE` on one host), in one pid namespace
or in two containers where both are pid 1: a pid says nothing about whose a directory is there.
The kernel's `flock` does: it belongs to an open file, whichever namespace opened it, and goes
with the process, however it ends. A restore replaces the cache only under the exclusive lock;
after it the worker keeps a shared one while it serves, so another worker's restore never swaps
the cache away from under a running vLLM (and the kernels it has not published yet); that worker
uses the cache as it is. Staging directories are created and leftovers removed only under the
exclusive lock, so a leftover is never another live restore's.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

_HELD: dict[str, tuple[int, str]] = {}  # lock path -> (fd, "exclusive" | "shared"), this process
_GUARD = threading.Lock()


def lock_path(cache: Path) -> Path:
    return cache.with_name(cache.name + ".lock")


def _fd(cache: Path) -> int:
    path = str(lock_path(cache))
    if path not in _HELD:
        cache.parent.mkdir(parents=True, exist_ok=True)
        _HELD[path] = (os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "")
    return _HELD[path][0]


def try_exclusive(cache: Path) -> bool:
    """Take (or keep) the exclusive lock without waiting: False while another process holds it,
    shared or exclusive. Raises OSError where the lock file cannot be made (a full disk)."""
    with _GUARD:
        fd = _fd(cache)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        _HELD[str(lock_path(cache))] = (fd, "exclusive")
        return True


def share(cache: Path, wait_s: float = 0.0, poll_s: float = 0.1) -> bool:
    """Hold the lock shared (an exclusive one of this process is turned into it): the cache is in
    use. Waits up to `wait_s` for another process's restore to finish; False if it did not, or where
    no lock file can be made (a full disk: there is nothing to protect either)."""
    deadline = time.monotonic() + wait_s
    while True:
        with _GUARD:
            try:
                fd = _fd(cache)
            except OSError:
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                _HELD[str(lock_path(cache))] = (fd, "shared")
                return True
            except BlockingIOError:
                pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def held_exclusive(cache: Path) -> bool:
    return _HELD.get(str(lock_path(cache)), (0, ""))[1] == "exclusive"


def release(cache: Path) -> None:
    """Let go of this process's lock on the cache (a restore that took it for itself alone)."""
    with _GUARD:
        held = _HELD.pop(str(lock_path(cache)), None)
        if held is not None:
            os.close(held[0])  # closing the file releases its flock
