"""The local side of a restore: a private staging directory, swapped in whole, and what dead restores left.

A restore writes into `<cache>.restoring-<token>-<store>`, which nothing else reads; only once every
bundle passed its checks does it become the cache, the old one renamed aside first, so the cache's
path holds at every moment a complete cache or nothing. The token is this process's pid and a random
part: two containers sharing a local cache both run as pid 1, and a pid alone named the other one's
directory as this one's. A restore killed midway leaves its staging directory behind: the next
restore into the same cache removes it, under the cache's exclusive lock (`store.cachelock`), so
what it removes is never a live restore's.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import uuid
from pathlib import Path

from .deadline import Deadline

_TOKEN: tuple[int, str] | None = None


def process_token() -> str:
    """This process's part of a staging name: its pid (for people) and a random part (pids repeat
    across pid namespaces); a forked child gets its own."""
    global _TOKEN
    if _TOKEN is None or _TOKEN[0] != os.getpid():
        _TOKEN = (os.getpid(), f"{os.getpid()}_{uuid.uuid4().hex[:8]}")
    return _TOKEN[1]


def staging_dir(dest: Path, kind: str) -> Path:
    return dest.with_name(f"{dest.name}.restoring-{process_token()}-{kind}")


def clear_leftovers(dest: Path) -> None:
    """Remove what other restores into `dest` left beside it: `<dest>.restoring-<token>-<store>` (a
    staging directory, complete or not) and `<dest>.replaced-<token>` (the cache it replaced), and
    what a killed compaction left, `<dest>.compacting-<token>` (store/publish.py's carried copies).
    Run only under the cache's exclusive lock: no other process restores into or publishes from
    `dest` meanwhile (a worker that uses the cache holds the shared lock), so each is a dead one's.
    This process keeps its own: a tier's restore that its deadline left behind may still be writing
    into its staging directory, and removes it itself (`replace_cache`)."""
    own = process_token()
    for path in dest.parent.glob(f"{glob.escape(dest.name)}.*-*"):
        kind, _, rest = path.name[len(dest.name) + 1 :].partition("-")
        token = rest.partition("-")[0] if kind == "restoring" else rest
        if kind not in ("restoring", "replaced", "compacting") or token == own:
            continue
        shutil.rmtree(path, ignore_errors=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def swap_in(staging: Path, dest: Path) -> None:
    """Make the complete staging directory the cache: the old one is renamed aside first, so that
    `dest` is at every moment either the old complete cache, absent, or the new complete one."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    replaced = dest.with_name(dest.name + f".replaced-{process_token()}")
    shutil.rmtree(replaced, ignore_errors=True)
    try:
        os.rename(dest, replaced)
    except FileNotFoundError:
        pass
    os.replace(staging, dest)
    shutil.rmtree(replaced, ignore_errors=True)


def replace_cache(dest: Path, staging: Path, guard: Deadline | None = None) -> None:
    """`dest` becomes the complete `staging` directory (`swap_in`), unless the guard's deadline passed:
    a restore its tier's deadline left behind never replaces the cache the boot went on with. The
    staging directory is gone afterwards either way."""
    try:
        with guard.committing() if guard is not None else contextlib.nullcontext():
            swap_in(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
