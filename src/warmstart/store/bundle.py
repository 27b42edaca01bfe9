"""The staged cache format, shared by every place that holds it (a volume folder, an S3 prefix).

A key's published caches are immutable *bundles* (tar files) and *generations* (JSON
indexes naming the bundles and every file in them; see `Generation.to_json`). This module
is the format alone: the index dataclasses, writing a bundle while hashing it, and reading
one back (from any stream of byte chunks) while checking its SHA-256, its size, every tar
header's checksum and every member's size against the index. Where the bytes live, and how
a generation is created without clobbering another, is a `store.backend.BundleStore`.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .layout import CACHE_LAYERS

FORMAT_VERSION = 1
CHUNK = 8 * 1024 * 1024  # large sequential reads and writes


class StoreError(RuntimeError):
    """A generation or bundle in a store cannot be used. `bundle` names the bad bundle."""

    def __init__(self, message: str, bundle: str | None = None) -> None:
        super().__init__(message)
        self.bundle = bundle


class StoreUnavailable(StoreError):
    """The store could not be reached, or refused the request (credentials, permissions).
    Nothing in it is known to be bad: a restore starts cold, a publish is skipped."""


def now() -> float:
    return time.time()


# --------------------------------------------------------------------------- what is stored


@dataclass(frozen=True)
class BundleRef:
    name: str  # file name under bundles/
    sha256: str
    size: int
    files: int


@dataclass(frozen=True)
class FileEntry:
    size: int
    mtime_ns: int
    bundle: str  # the bundle that holds this version of the file
    sha256: str = ""  # of the bytes packed ("" in generations written before it was recorded)


@dataclass(frozen=True)
class Generation:
    number: int
    bundles: tuple[BundleRef, ...]
    files: Mapping[str, FileEntry]  # relative to the cache base: "inductor/ab/c.so"
    created: float
    publisher: str

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "generation": self.number,
            "created": self.created,
            "publisher": self.publisher,
            "bundles": [asdict(b) for b in self.bundles],
            "files": {
                path: [f.size, f.mtime_ns, f.bundle, *([f.sha256] if f.sha256 else [])]
                for path, f in sorted(self.files.items())
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Generation:
        try:
            bundles = tuple(BundleRef(**b) for b in data["bundles"])
            files = {
                p: FileEntry(int(v[0]), int(v[1]), str(v[2]), str(v[3]) if len(v) > 3 else "")
                for p, v in data["files"].items()
            }
            if not all(safe_relpath(p) for p in files):
                raise StoreError("a file path in the index leaves the cache directory or is no file name")
            names = {b.name for b in bundles}
            if any(f.bundle not in names for f in files.values()):
                raise StoreError("a file names a bundle the generation does not list")
            return cls(int(data["generation"]), bundles, files, float(data["created"]), str(data["publisher"]))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise StoreError(f"malformed generation index: {exc}") from exc


def gen_name(number: int) -> str:
    return f"g{number:08d}.json"


def parse_gen_name(name: str) -> int | None:
    """The number of a generation file name (`g00000007.json`), or None for anything else."""
    if name.startswith("g") and name.endswith(".json") and name[1:-5].isdigit():
        return int(name[1:-5])
    return None


# --------------------------------------------------------------------------- reading a bundle


class Prefetch(io.RawIOBase):
    """Pull a bundle's byte chunks on a thread (hashing as it goes) ahead of the consumer.

    The store's round trips and bandwidth waits overlap with tar extraction and local
    writes. `chunks` is any iterator of bytes: a file read in CHUNK blocks, or ranged GETs
    fetched in parallel and yielded in order.
    """

    def __init__(self, chunks: Iterator[bytes], depth: int = 16) -> None:
        self.hash = hashlib.sha256()
        self.size = 0
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(depth)
        self._buffer = b""
        self._done = False
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(chunks,), daemon=True)
        self._thread.start()

    def _put(self, item: bytes | BaseException | None) -> None:
        while not self._cancel.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _run(self, chunks: Iterator[bytes]) -> None:
        try:
            for chunk in chunks:
                if self._cancel.is_set():
                    break
                self.hash.update(chunk)
                self.size += len(chunk)
                self._put(chunk)
            self._put(None)
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(exc)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    @property
    def finished(self) -> bool:
        """The whole bundle was read (so `hash` and `size` cover all of it)."""
        return self._done and not self._cancel.is_set()

    def close(self) -> None:
        self._cancel.set()
        super().close()

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        view = memoryview(target).cast("B")
        while not self._buffer and not self._done:
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._cancel.is_set():
                    return 0
                continue
            if item is None:
                self._done = True
            elif isinstance(item, BaseException):
                self._done = True
                raise item
            else:
                self._buffer = item
        n = min(len(view), len(self._buffer))
        view[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n

    def drain(self) -> None:
        """Read to the end (so that the hash covers the whole bundle)."""
        while self.readinto(bytearray(CHUNK)):
            pass


def file_chunks(path: Path) -> Iterator[bytes]:
    """A file in CHUNK-sized reads (a bundle on a mounted volume)."""
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def layer_of(path: str) -> str | None:
    top = path.split("/", 1)[0]
    for layer, sub, _ in CACHE_LAYERS:
        if sub == top:
            return layer
    return None


def per_layer(paths: Iterable[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = {}
    for path, size in paths:
        layer = layer_of(path)
        if layer is not None:
            c = counts.setdefault(layer, [0, 0])
            c[0] += 1
            c[1] += size
    return {k: (v[0], v[1]) for k, v in counts.items()}


def safe_relpath(rel: str) -> bool:
    """A relative path that stays inside the directory it is joined to, and that a file system takes."""
    parts = rel.split("/")
    if "\0" in rel:  # no file system takes it: mkdir raises ValueError
        return False
    try:
        rel.encode("utf-8")  # a lone surrogate (JSON can spell one) cannot be a file name either
    except UnicodeEncodeError:
        return False
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _octal(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256, for members over 8 GiB
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def iter_tar(stream: BinaryIO) -> Iterator[tuple[str, bytes]]:
    """(name, data) of each regular file in a ustar/GNU tar stream.

    A lean reader for the bundles warmstart writes: one pass, large reads, each header's
    checksum checked. It is several times cheaper than `tarfile` on thousands of small
    members, which matters when restoring shares two cores with the volume's client.
    """

    def exact(n: int) -> bytes:
        data = stream.read(n)
        if len(data) != n:
            raise StoreError(f"truncated: wanted {n} bytes, got {len(data)}")
        return data

    long_name: bytes | None = None
    while True:
        header = stream.read(512)
        if not header or header == bytes(512):
            return
        if len(header) != 512:
            raise StoreError("truncated tar header")
        stored = _octal(header[148:156])
        if stored != sum(header[:148]) + 256 + sum(header[156:]):
            raise StoreError("tar header checksum mismatch")
        size = _octal(header[124:136])
        kind = header[156:157]
        data = exact(size)
        if size % 512:
            exact(512 - size % 512)
        if kind == b"L":  # GNU long name for the next member
            long_name = data.rstrip(b"\0")
            continue
        name = header[:100].split(b"\0", 1)[0]
        if header[257:263] == b"ustar\0" and header[345] != 0:
            name = header[345:500].split(b"\0", 1)[0] + b"/" + name
        if long_name is not None:
            name, long_name = long_name, None
        if kind in (b"0", b"\0", b"7"):
            yield name.decode("utf-8", "surrogateescape"), data


def extract_bundle(chunks: Iterator[bytes], ref: BundleRef, gen: Generation, dest: Path) -> int:
    """Stream one bundle into `dest`, writing only the members this generation takes from it.

    Raises StoreError naming the bundle when it is missing, truncated, fails its checksum
    or lacks a file the index lists: such a bundle is never to be referenced again.
    """
    wanted = {p: f for p, f in gen.files.items() if f.bundle == ref.name}
    for parent in {os.path.dirname(p) for p in wanted}:
        (dest / parent).mkdir(parents=True, exist_ok=True)
    reader = Prefetch(chunks)
    # Kept in a name until the end: a collected BufferedReader closes (cancels) the prefetch.
    buffered = io.BufferedReader(reader, CHUNK)
    written = 0
    try:
        for name, data in iter_tar(buffered):
            entry = wanted.get(name)
            if entry is None:
                continue
            if len(data) != entry.size:
                raise StoreError(f"{ref.name}: {name} has {len(data)} bytes, index says {entry.size}", ref.name)
            target = os.path.join(dest, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.utime(target, ns=(entry.mtime_ns, entry.mtime_ns))
            written += 1
        reader.drain()
        if not reader.finished:
            raise StoreError("read was cut short")
    except StoreUnavailable:
        raise  # the store, not the bundle: nothing is known to be wrong with it
    except StoreError as exc:
        if exc.bundle == ref.name and "is missing" in str(exc):
            raise
        raise StoreError(f"bundle {ref.name} is truncated or corrupt: {exc}", ref.name) from exc
    finally:
        reader.close()
    if reader.size != ref.size or reader.hash.hexdigest() != ref.sha256:
        raise StoreError(
            f"bundle {ref.name} fails its checksum ({reader.size} bytes, sha256 {reader.hash.hexdigest()[:12]}; "
            f"index: {ref.size} bytes, {ref.sha256[:12]})",
            ref.name,
        )
    if written != len(wanted):
        raise StoreError(f"bundle {ref.name} holds {written} of the {len(wanted)} files its generation lists", ref.name)
    return written


def bundle_name(sha256: str, unique: str) -> str:
    """`<sha256 prefix>-<unique>.tar`: content-addressed for people, unique for stores."""
    return f"{sha256[:16]}-{unique[:8]}.tar"
