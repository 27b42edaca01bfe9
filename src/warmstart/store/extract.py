"""Reading a bundle back into files: the store's reads, decompression and local writes overlapped.

    store chunks --[thread: read, SHA-256]--> zstd? --[thread: inflate]--> tar stream
        --[caller: parse]--> members --[2 threads: write]--> files

A restore is as fast as its slowest stage, not as the sum of them: while one chunk's files
are written, the next chunk is being read (and inflated). The tar stream is parsed in place,
a member's bytes written straight from the chunk that holds them (a member that spans two
chunks is written in two parts, each at its offset); per file, four system calls: open,
pwrite, futimens, close. Nothing is fsynced: files land in a private staging directory
that becomes the cache only once every bundle of the generation has passed its checks
(`store.swap`), and every boot restores anew, so a file cut short by a crash is never
read as complete.

Checks, as strong for both formats: the SHA-256 and size of the stored bytes (compressed or
not) against the index, each tar header's checksum, each member's size against the index,
every listed file present; zstd frames carry their own content checksum besides.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..settings import step_hooks
from .backend import step
from .bundle import BundleRef, FileEntry, Generation, StoreError, StoreUnavailable
from .zst import INFLATE_PIECE, is_zstd, zstd_error

T = TypeVar("T")
BLOCK = 512
WRITERS = 2  # threads copying members' bytes into files
IN_FLIGHT = 64 * 1024 * 1024  # bytes handed to them and not yet written, at most
_ZERO_BLOCK = bytes(BLOCK)
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)


class Ahead(Generic[T]):
    """Iterate `items` on a thread, up to `depth` items ahead of the consumer.

    An exception raised by the items is raised in the consumer, in order. `close()` stops the
    thread (it also closes `items`, so a source can cancel what it has in flight)."""

    def __init__(self, items: Iterable[T], depth: int, name: str) -> None:
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue(depth)
        self._cancel = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._run, args=(items,), name=name, daemon=True)
        self._thread.start()

    def _put(self, item: tuple[int, Any]) -> None:
        while not self._cancel.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _run(self, items: Iterable[T]) -> None:
        try:
            for item in items:
                if self._cancel.is_set():
                    break
                self._put((0, item))
            self._put((1, None))
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put((2, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        while not self._ended:
            try:
                kind, item = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._cancel.is_set():
                    break
                continue
            if kind == 0:
                return item
            self._ended = True
            if kind == 2:
                raise item
        raise StopIteration

    def close(self) -> None:
        self._cancel.set()


class Hashed:
    """The chunks as they pass, hashed and counted: what the index's sha256 and size are checked against."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = chunks
        self.hash = hashlib.sha256()
        self.size = 0
        self.complete = False  # every chunk passed: `hash` and `size` cover the whole bundle

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.hash.update(chunk)
            self.size += len(chunk)
            yield chunk
        self.complete = True

    def close(self) -> None:
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()


class _ChunkStream(io.RawIOBase):
    """The chunks as a readable stream (zstd's stream reader pulls from it), without copying them whole."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.view = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self.view:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.view = memoryview(chunk)
        out = memoryview(target).cast("B")
        n = min(len(out), len(self.view))
        out[:n] = self.view[:n]
        self.view = self.view[n:]
        return n


def inflate(chunks: Iterator[bytes], bundle: str) -> Iterator[bytes]:
    """The tar stream inside a zstd bundle, in pieces of at most INFLATE_PIECE bytes (so a corrupt
    or hostile frame cannot claim unbounded memory). Frames follow one another; skippable ones
    (the bundle's note) are skipped."""
    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(
        _ChunkStream(chunks), read_size=1 << 20, read_across_frames=True, closefd=False
    )
    try:
        while True:
            try:
                piece = reader.read(INFLATE_PIECE)
            except zstandard.ZstdError as exc:
                raise StoreError(zstd_error(bundle, exc), bundle) from exc
            if not piece:
                return
            yield piece
    finally:
        reader.close()
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


class _Writer:
    """Members' bytes written by WRITERS threads, so that copying them into the page cache (the
    restore's largest cost) runs beside the parsing, the inflating and the reading. Parts of one
    file go with os.pwrite at their offsets, in any order; the file is closed (its mtime set first)
    when its last part is written. At most IN_FLIGHT bytes wait at a time."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="bundle-write")
        self.cond = threading.Condition()
        self.in_flight = 0
        self.files: dict[int, list[int]] = {}  # fd -> [parts pending, all parts given (0/1), mtime_ns]
        self.error: BaseException | None = None
        self.written = 0

    def open(self, path: str, mtime_ns: int) -> int:
        fd = os.open(path, _FLAGS, 0o644)
        with self.cond:
            self.files[fd] = [0, 0, mtime_ns]
        return fd

    def part(self, fd: int, data: memoryview, offset: int) -> None:
        with self.cond:
            while self.in_flight and self.in_flight + len(data) > IN_FLIGHT and self.error is None:
                self.cond.wait()
            self._raise()
            self.in_flight += len(data)
            self.files[fd][0] += 1
        self.pool.submit(self._write, fd, data, offset)

    def _write(self, fd: int, data: memoryview, offset: int) -> None:
        n = len(data)
        try:
            while data:
                done = os.pwrite(fd, data, offset)
                data, offset = data[done:], offset + done
        except BaseException as exc:
            with self.cond:
                self.error = self.error or exc
        with self.cond:
            self.in_flight -= n
            self.files[fd][0] -= 1
            last = self.files[fd][:2] == [0, 1]
            self.cond.notify_all()
        if last:
            self._close(fd)

    def close(self, fd: int) -> None:
        """All of the file's parts are given: it is closed once they are written."""
        with self.cond:
            self.files[fd][1] = 1
            last = self.files[fd][0] == 0
        if last:
            self._close(fd)

    def _close(self, fd: int) -> None:
        with self.cond:
            _, _, mtime_ns = self.files.pop(fd)
        try:
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        except BaseException as exc:
            with self.cond:
                self.error = self.error or exc
        finally:
            os.close(fd)
        with self.cond:
            self.written += 1

    def drain(self) -> None:
        with self.cond:
            while self.in_flight and self.error is None:
                self.cond.wait()
            self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        """Wait for every write; raise the first that failed."""
        self.finish_quietly()
        self._raise()

    def finish_quietly(self) -> None:
        """Wait for every write; close what is still open (a stream cut inside a member)."""
        self.pool.shutdown(wait=True)
        for fd in list(self.files):
            os.close(fd)
        self.files.clear()


class _Members:
    """The tar stream's state between pieces: parse headers, write wanted members, skip the rest."""

    def __init__(self, wanted: Mapping[str, FileEntry], dest: Path, bundle: str, writer: _Writer) -> None:
        self.wanted = wanted
        self.dest = str(dest)
        self.bundle = bundle
        self.writer = writer
        self.header = bytearray()  # a header cut by a piece boundary
        self.fd = -1
        self.offset = 0  # where the current member's next bytes go in its file
        self.left = 0  # data bytes of the current member still to come
        self.pad = 0  # padding after it
        self.long_name: bytearray | None = None  # GNU long name being read ('L' member)
        self.next_name: bytes | None = None  # ...for the member after it
        self.ended = False  # the end-of-archive block was read
        self._stepped = False

    def feed(self, piece: bytes) -> None:
        view = memoryview(piece)
        pos, end = 0, len(view)
        while pos < end and not self.ended:
            if self.left:
                n = min(self.left, end - pos)
                if self.fd >= 0:
                    self.writer.part(self.fd, view[pos : pos + n], self.offset)
                    self.offset += n
                elif self.long_name is not None:
                    self.long_name += view[pos : pos + n]
                pos += n
                self.left -= n
                if not self.left:
                    self._member_done()
                elif self.fd >= 0 and not self._stepped:
                    self._stepped = True
                    if step_hooks() is not None:  # a file cut between chunks, first part written
                        self.writer.drain()
                        step("restore:file_partly_written")
            elif self.pad:
                n = min(self.pad, end - pos)
                pos += n
                self.pad -= n
            elif not self.header and end - pos >= BLOCK:
                self._header(bytes(view[pos : pos + BLOCK]))
                pos += BLOCK
            else:
                n = min(BLOCK - len(self.header), end - pos)
                self.header += view[pos : pos + n]
                pos += n
                if len(self.header) == BLOCK:
                    block = bytes(self.header)
                    self.header.clear()
                    self._header(block)

    def _header(self, block: bytes) -> None:
        if block == _ZERO_BLOCK:
            self.ended = True
            return
        stored = _octal(block[148:156])
        if stored != sum(block[:148]) + 256 + sum(block[156:]):
            raise StoreError("tar header checksum mismatch")
        size = _octal(block[124:136])
        kind = block[156:157]
        self.left, self.pad = size, -size % BLOCK
        if kind == b"L":  # GNU long name for the next member
            self.long_name = bytearray()
            if not size:
                self._member_done()
            return
        name = block[:100].split(b"\0", 1)[0]
        if block[257:263] == b"ustar\0" and block[345] != 0:
            name = block[345:500].split(b"\0", 1)[0] + b"/" + name
        if self.next_name is not None:
            name, self.next_name = self.next_name, None
        if kind not in (b"0", b"\0", b"7"):
            return  # not a regular file: its data is skipped
        rel = name.decode("utf-8", "surrogateescape")
        entry = self.wanted.get(rel)
        if entry is None:
            return  # not this generation's version of the file
        if size != entry.size:
            raise StoreError(f"{self.bundle}: {rel} has {size} bytes, index says {entry.size}", self.bundle)
        self.fd = self.writer.open(os.path.join(self.dest, rel), entry.mtime_ns)
        self.offset = 0
        if not size:
            self._member_done()

    def _member_done(self) -> None:
        if self.long_name is not None:
            self.next_name = bytes(self.long_name).rstrip(b"\0")
            self.long_name = None
        elif self.fd >= 0:
            fd, self.fd = self.fd, -1
            self.writer.close(fd)

    def finish(self) -> None:
        """The stream ended: it must end between members (or after the end-of-archive block)."""
        if not self.ended and (self.left or self.pad or self.header or self.long_name is not None):
            raise StoreError("truncated: the tar stream ends inside a member")


def _octal(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256, for members over 8 GiB
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise StoreError("tar header holds no number where one belongs") from None


def extract_bundle(chunks: Iterator[bytes], ref: BundleRef, gen: Generation, dest: Path) -> int:
    """Stream one bundle (tar, or tar in zstd frames) into `dest`, writing only the members this
    generation takes from it.

    Raises StoreError naming the bundle when it is missing, truncated, fails its checksum
    or lacks a file the index lists: such a bundle is never to be referenced again.
    """
    wanted = {p: f for p, f in gen.files.items() if f.bundle == ref.name}
    for parent in {os.path.dirname(p) for p in wanted}:
        (dest / parent).mkdir(parents=True, exist_ok=True)
    hashed = Hashed(chunks)
    read = Ahead(hashed, depth=16, name="bundle-read")
    stages: list[Ahead[bytes]] = [read]
    writer = _Writer()
    members = _Members(wanted, dest, ref.name, writer)
    try:
        first: list[bytes] = []  # enough chunks to tell the format by its first 4 bytes
        while sum(map(len, first)) < 4 and (chunk := next(read, None)) is not None:
            first.append(chunk)
        tar: Iterator[bytes] = _chain(first, read)
        if is_zstd(b"".join(bytes(c[:4]) for c in first)):
            tar = Ahead(inflate(tar, ref.name), depth=4, name="bundle-inflate")
            stages.append(tar)
        for piece in tar:
            if not members.ended:
                members.feed(piece)
        members.finish()  # the rest was drained above: the hash covers the whole bundle
        writer.finish()
        if not hashed.complete:
            raise StoreError("read was cut short")
    except StoreUnavailable:
        raise  # the store, not the bundle: nothing is known to be wrong with it
    except StoreError as exc:
        if exc.bundle == ref.name and ("is missing" in str(exc) or "fails its checksum" in str(exc)):
            raise
        raise StoreError(f"bundle {ref.name} is truncated or corrupt: {exc}", ref.name) from exc
    finally:
        for stage in reversed(stages):
            stage.close()
        writer.finish_quietly()
    if hashed.size != ref.size or hashed.hash.hexdigest() != ref.sha256:
        raise StoreError(
            f"bundle {ref.name} fails its checksum ({hashed.size} bytes, sha256 {hashed.hash.hexdigest()[:12]}; "
            f"index: {ref.size} bytes, {ref.sha256[:12]})",
            ref.name,
        )
    if writer.written != len(wanted):
        raise StoreError(
            f"bundle {ref.name} holds {writer.written} of the {len(wanted)} files its generation lists", ref.name
        )
    return writer.written


def _chain(first: list[bytes], rest: Iterator[bytes]) -> Iterator[bytes]:
    yield from first
    yield from rest
