"""A faulty mock volume: the slow FUSE passthrough (`slowfs`) failing chosen operations with a real errno.

A network volume fails in ways a local disk seldom does: a listing that answers EIO while the
server recovers, a write that meets ENOSPC on a full volume, an open or a rename that fails
once. Code that reads a store must tell "not there" from "could not look" (an EIO listing is
not an empty folder). This layer makes the kernel return those errors to the process under
test: every operation the rules name raises `FuseOSError(errno)` in the filesystem process, so
the caller sees a real `OSError` from a real syscall, with no mock in its own code.

Rules live in a JSON file that the filesystem re-reads whenever it changes, so a test or the
chaos bench turns faults on and off while the volume stays mounted:

    [{"op": "readdir", "errno": "EIO", "rate": 1.0, "path": "/generations"},
     {"op": "write", "errno": "ENOSPC", "rate": 0.02}]

`op` is a FUSE operation (`getattr`, `readdir`, `open`, `create`, `read`, `write`, `mkdir`,
`rmdir`, `unlink`, `rename`, `link`, `fsync`, `utimens`, `truncate`; `*` for all of them),
`path` a substring of the path inside the mount (optional), `rate` the share of matching calls
that fail (seeded). Counts of what was injected go to a JSON stats file, for the bench.

    with faulty_mounted(source, mountpoint, rules=[...]) as (mnt, faults):
        faults.set([...])   # change the rules while mounted
        faults.injected()   # {"readdir:EIO": 3, ...}
"""

from __future__ import annotations

import errno as errnos
import json
import os
import random
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

OPERATIONS = (
    "getattr",
    "readdir",
    "open",
    "create",
    "read",
    "write",
    "mkdir",
    "rmdir",
    "unlink",
    "rename",
    "link",
    "fsync",
    "utimens",
    "truncate",
)


@dataclass(frozen=True)
class FaultRule:
    """Fail `rate` of the calls of `op` (on paths containing `path`) with `errno` (a name: EIO)."""

    op: str
    errno: str = "EIO"
    rate: float = 1.0
    path: str = ""

    def matches(self, op: str, path: str) -> bool:
        return (self.op == op or self.op == "*") and self.path in path

    @property
    def code(self) -> int:
        return int(getattr(errnos, self.errno))


def read_rules(path: Path) -> tuple[FaultRule, ...]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return ()
    return tuple(FaultRule(**r) for r in raw if isinstance(r, dict))


def write_rules(path: Path, rules: Sequence[FaultRule]) -> None:
    """Atomically, so that the filesystem never reads half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps([asdict(r) for r in rules]))
    os.replace(tmp, path)


class FaultSwitch:
    """The filesystem process's side: the rules (re-read when their file changes) and the counts."""

    def __init__(self, rules_file: str, stats_file: str = "", seed: int = 0) -> None:
        self.rules_file = Path(rules_file)
        self.stats_file = Path(stats_file) if stats_file else None
        self.random = random.Random(seed)
        self.rules: tuple[FaultRule, ...] = ()
        self.stamp: tuple[int, int] | None = None
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def _reload(self) -> None:
        try:
            st = self.rules_file.stat()
            stamp = (st.st_mtime_ns, st.st_ino)
        except OSError:
            stamp = None
        if stamp != self.stamp:
            self.stamp = stamp
            self.rules = read_rules(self.rules_file) if stamp else ()

    def draw(self, op: str, path: str) -> int | None:
        """The errno this call fails with, or None."""
        with self.lock:
            self._reload()
            for rule in self.rules:
                if rule.matches(op, path) and self.random.random() < rule.rate:
                    key = f"{op}:{rule.errno}"
                    self.counts[key] = self.counts.get(key, 0) + 1
                    if self.stats_file is not None:
                        tmp = self.stats_file.with_name(self.stats_file.name + ".tmp")
                        tmp.write_text(json.dumps(self.counts))
                        os.replace(tmp, self.stats_file)
                    return rule.code
        return None


def with_faults(operations: Any, switch: FaultSwitch) -> Any:
    """Wrap the passthrough's operations so that each first asks the switch whether to fail."""
    import mfusepy as fuse

    cls = type(operations)
    for op in OPERATIONS:
        original = getattr(cls, op, None)
        if original is None:
            continue

        def wrapped(self: Any, path: str, *args: Any, _original: Any = original, _op: str = op) -> Any:
            code = switch.draw(_op, path)
            if code is not None:
                raise fuse.FuseOSError(code)
            return _original(self, path, *args)

        wrapped.__name__ = original.__name__
        setattr(cls, op, wrapped)
    return operations


@dataclass(frozen=True)
class Faults:
    """The test's side of a mounted faulty volume: set the rules, read the counts."""

    rules_file: Path
    stats_file: Path

    def set(self, rules: Sequence[FaultRule]) -> None:
        write_rules(self.rules_file, rules)

    def clear(self) -> None:
        self.set(())

    def injected(self) -> dict[str, int]:
        try:
            return dict(json.loads(self.stats_file.read_text()))
        except (OSError, ValueError):
            return {}
