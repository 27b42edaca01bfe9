"""Packing a bundle: a cache directory's files as one tar stream, hashed on its way out, and
only the files whose bytes held still while they were read indexed.

Compilers write their caches while vLLM serves (lazy JIT, autotuning); a publish that runs
meanwhile must not freeze a half-written file into every later generation, and a hard link
must not become a tar link entry that the restore reader (regular files only) rejects.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .bundle import CHUNK
from .zst import FrameWriter


@dataclass(frozen=True)
class Packed:
    """What a bundle holds for its index: the files whose bytes held still while they were read."""

    size: int
    sha256: str
    files: Mapping[str, tuple[int, int, str]]  # path -> (size, mtime_ns, sha256) of the bytes packed
    unstable: tuple[str, ...] = ()  # packed bytes not to be indexed: the file changed, or is open for writing
    compressed: bool = False  # zstd frames (`store.zst`), not a bare tar stream


class _Exactly(io.RawIOBase):
    """A file's first `size` bytes, zeros past an early end: a member the tar stream can always take."""

    def __init__(self, handle: BinaryIO, size: int) -> None:
        self.handle = handle
        self.left = size
        self.short = False
        self.hash = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        view = memoryview(target).cast("B")[: self.left]
        if not view:
            return 0
        n = self.handle.readinto(view) or 0
        if n == 0:  # the file shrank since its stat
            self.short = True
            n = len(view)
            view[:n] = bytes(n)
        self.hash.update(view[:n])
        self.left -= n
        return n


def pack_bundle(
    local: Path,
    files: Iterable[str],
    sink: BinaryIO,
    *,
    writing: frozenset[str] = frozenset(),
    roots: Mapping[str, Path] | None = None,
    compress: bool = False,
) -> Packed:
    """Write the files (relative to `local`, or to `roots[path]`) as a GNU tar stream into `sink`,
    in zstd frames if `compress` (`store.zst`), hashing every byte on its way out.

    Every member is a regular file (a hard link's second name too: restore writes regular files
    only). A file is indexed only if its size and mtime are the same before and after its bytes
    were read and it is not in `writing` (open for writing, per /proc): a compiler still writing
    it would otherwise freeze its partial bytes into every later generation. Such a member's
    bytes stay in the stream, unindexed (restore skips members its index does not list). Owner
    names and ids are left out: a bundle is the same wherever it was packed."""
    digest = hashlib.sha256()

    class Hashing(io.RawIOBase):
        def __init__(self) -> None:
            self.size = 0

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            digest.update(data)
            self.size += len(data)
            sink.write(data)  # a buffered sink: it takes all of it
            return len(data)

    hashing = Hashing()
    frames = FrameWriter(hashing) if compress else None
    buffered = io.BufferedWriter(frames or hashing, CHUNK)
    packed: dict[str, tuple[int, int, str]] = {}
    unstable: list[str] = []
    with tarfile.open(fileobj=buffered, mode="w|", format=tarfile.GNU_FORMAT, bufsize=1 << 20) as tar:
        for rel in sorted(files):
            path = (roots or {}).get(rel, local) / rel
            try:
                handle = open(path, "rb")
            except FileNotFoundError:
                continue  # removed since the scan
            with handle:
                before = os.fstat(handle.fileno())
                info = tarfile.TarInfo(rel)
                info.size, info.mtime, info.mode = before.st_size, before.st_mtime, before.st_mode & 0o7777
                exactly = _Exactly(handle, before.st_size)
                tar.addfile(info, exactly)
                after = os.stat(path)
            same = (after.st_size, after.st_mtime_ns, after.st_ino) == (
                before.st_size,
                before.st_mtime_ns,
                before.st_ino,
            )
            if same and not exactly.short and rel not in writing:
                packed[rel] = (before.st_size, before.st_mtime_ns, exactly.hash.hexdigest())
            else:
                unstable.append(rel)
    buffered.flush()
    if frames is not None:
        frames.finish()
    return Packed(hashing.size, digest.hexdigest(), packed, tuple(unstable), compressed=compress)


_DIGESTS: dict[tuple[str, int, int, int], str] = {}  # (path, size, mtime_ns, inode) -> sha256, this process


def file_sha256(path: Path) -> str | None:
    """A file's SHA-256 (None if it is gone): whether a file rewritten in place holds other bytes.
    Remembered per (path, size, mtime, inode), so that a serving worker's periodic publishes hash
    a file that another worker also compiled once, not at every publish."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key in _DIGESTS:
        return _DIGESTS[key]
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
    except FileNotFoundError:
        return None
    if os.stat(path).st_mtime_ns == st.st_mtime_ns:  # not changed while it was read
        _DIGESTS[key] = digest.hexdigest()
    return digest.hexdigest()


def open_for_writing(local: Path) -> frozenset[str]:
    """Paths under `local` that a process this one can see holds open for writing (per /proc):
    a compiler is writing them now. Empty where /proc cannot tell."""
    prefix = str(local.resolve()) + "/"
    out: set[str] = set()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return frozenset()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if not target.startswith(prefix):
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                    flags = next((int(x.split()[1], 8) for x in info if x.startswith("flags:")), 0)
            except (OSError, ValueError):
                continue
            if flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
                out.add(target[len(prefix) :])
    return frozenset(out)
