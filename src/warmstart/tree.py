"""A file tree, scanned: which files a directory holds, and what changed between two scans.

The boot report compares each cache directory before and after a boot (a layer that
gained no files was reused), and the staged store and the volume scan size and list the
same trees. A ground-floor module, importing nothing from warmstart, so that `store/` and
`vllm/` can both use it without either importing the other.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TreeScan:
    """Files under a directory: relative path -> (size, mtime_ns). Unreadable entries are warnings."""

    root: str
    files: Mapping[str, tuple[int, int]]
    warnings: tuple[str, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.files.values())

    def under(self, prefix: str) -> TreeScan:
        prefix = prefix.rstrip("/") + "/"
        return TreeScan(self.root, {k: v for k, v in self.files.items() if k.startswith(prefix)})


def scan_tree(root: Path) -> TreeScan:
    """Every regular file under `root` (symlinks not followed); a missing root is an empty scan."""
    files: dict[str, tuple[int, int]] = {}
    warnings: list[str] = []
    stack = [root]
    base = len(str(root)) + 1
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            st = entry.stat(follow_symlinks=False)
                            files[entry.path[base:]] = (st.st_size, st.st_mtime_ns)
                    except OSError as exc:
                        warnings.append(f"{entry.path}: {exc.strerror or exc}")
        except FileNotFoundError:
            continue
        except OSError as exc:
            warnings.append(f"{current}: {exc.strerror or exc}")
    return TreeScan(str(root), files, tuple(warnings))


@dataclass(frozen=True)
class TreeDelta:
    """What a tree gained between two scans: counts and bytes before, added and rewritten."""

    files_before: int
    bytes_before: int
    files_added: int
    bytes_added: int
    files_changed: int


def tree_delta(before: TreeScan, after: TreeScan) -> TreeDelta:
    added = [k for k in after.files if k not in before.files]
    changed = [k for k in after.files if k in before.files and after.files[k] != before.files[k]]
    return TreeDelta(
        files_before=len(before.files),
        bytes_before=before.bytes,
        files_added=len(added),
        bytes_added=sum(after.files[k][0] for k in added),
        files_changed=len(changed),
    )
