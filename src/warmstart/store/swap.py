"""The local side of a restore: a private staging directory, swapped in whole, and what dead restores left.

A restore writes into `<cache>.restoring-<pid>`, which nothing else reads; only once every bundle
passed its checks does it become the cache, the old one renamed aside first, so the cache's path
holds at every moment a complete cache or nothing. A restore killed midway leaves its staging
directory behind: the next restore into the same cache removes it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
from pathlib import Path

from .deadline import Deadline


def clear_leftovers(dest: Path) -> None:
    """Remove what restores into `dest` that no longer run left beside it:
    `<dest>.restoring-<pid>-<store>` (a staging directory, complete or not) and `<dest>.replaced-<pid>`
    (the cache it replaced). Nothing ever reads them; they only hold disk. A process still running
    keeps its own, this one included: a tier's restore that its deadline left behind may still be
    writing into its staging directory, and removes it itself (`replace_cache`)."""
    for path in dest.parent.glob(f"{glob.escape(dest.name)}.*-*"):
        kind, _, rest = path.name[len(dest.name) + 1 :].partition("-")
        pid = rest.partition("-")[0]
        if kind not in ("restoring", "replaced") or not pid.isdigit():
            continue
        if int(pid) == os.getpid() or process_alive(int(pid)):
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
    replaced = dest.with_name(dest.name + f".replaced-{os.getpid()}")
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
