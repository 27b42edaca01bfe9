"""Files as the tests write and compare them."""

from __future__ import annotations

import os
from pathlib import Path


def write(base: Path, rel: str, data: bytes) -> None:
    path = base / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def tree(base: Path) -> dict[str, bytes]:
    """Every file under base, by relative path, with its bytes."""
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in base.rglob("*") if p.is_file()}


def stat_tree(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file and directory link under root: any change shows."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out
