"""Staged caches: restore a key's published generation onto local disk; publish new ones back.

Writing compilers' thousands of small files straight onto a network volume is slow to
read (a round trip per open and stat) and unsafe when several workers boot cold at once.
In staged mode the volume holds, per key, immutable *bundles* (tar files) and
*generations* (JSON indexes naming the bundles and every file in them):

    <key_dir>/staged/
        bundles/<sha256 prefix>-<id>.tar    written as .tmp-*, verified, then renamed
        generations/g00000007.json          a generation; exists only once complete
        readers/<reader>.json               a restore in progress (protects its bundles)
        publish.lease                       who may publish now, until when

A boot restores the newest complete generation in a few large sequential reads, checking
each bundle's SHA-256 while it streams, into a fresh local directory that then replaces
the key's local cache. A corrupt or truncated bundle is reported and the next older
generation tried. After vLLM serves, the worker that holds the lease publishes a bundle of
the files the current generation lacks and a generation that lists the old bundles plus
the new one (the union); others wait for the lease and then publish only what is still
missing, usually nothing. Generations are linked into place without overwriting
(`os.link`), so even two publishers that both believe they hold the lease cannot clobber
each other. Old generations and unreferenced bundles are removed only when no registered
reader can still be restoring them, generation first, bundles after, so the store is
consistent after every step.

Like huggingface_hub's cache manager, each operation is a scan, then a plan, then an
`execute()`: a dry run is free.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import queue
import shutil
import socket
import tarfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from ..vllm.evidence import scan_tree
from .history import write_json_atomic
from .layout import CACHE_LAYERS

log = logging.getLogger("warmstart")

FORMAT_VERSION = 1
CHUNK = 8 * 1024 * 1024  # large sequential reads and writes on the volume
KEEP_GENERATIONS = 2
MAX_BUNDLES = 8  # more deltas than this and the next publish writes one full bundle


class StoreError(RuntimeError):
    """A generation or bundle on the volume cannot be used. `bundle` names the bad bundle."""

    def __init__(self, message: str, bundle: str | None = None) -> None:
        super().__init__(message)
        self.bundle = bundle


def now() -> float:
    return time.time()


def step(name: str) -> None:
    """A named point of a publish or restore, for tests that must prove where a kill landed.

    Inert unless WARMSTART_TEST_STEPS=1: then each step is logged (`warmstart | step | NAME`),
    and the step named by WARMSTART_TEST_PAUSE_AT waits there until the file named by
    WARMSTART_TEST_RESUME exists, so a test can kill, unmount or race at exactly that point.
    """
    if os.environ.get("WARMSTART_TEST_STEPS") != "1":
        return
    log.info("warmstart | step     | %s", name)
    if os.environ.get("WARMSTART_TEST_PAUSE_AT") == name:
        resume = Path(os.environ.get("WARMSTART_TEST_RESUME", "/nonexistent/resume"))
        while not resume.exists():
            time.sleep(0.05)


def worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())


# --------------------------------------------------------------------------- what is on disk


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
            "files": {path: [f.size, f.mtime_ns, f.bundle] for path, f in sorted(self.files.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Generation:
        try:
            bundles = tuple(BundleRef(**b) for b in data["bundles"])
            files = {p: FileEntry(int(v[0]), int(v[1]), str(v[2])) for p, v in data["files"].items()}
            if not all(safe_relpath(p) for p in files):
                raise StoreError("a file path in the index leaves the cache directory")
            names = {b.name for b in bundles}
            if any(f.bundle not in names for f in files.values()):
                raise StoreError("a file names a bundle the generation does not list")
            return cls(int(data["generation"]), bundles, files, float(data["created"]), str(data["publisher"]))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise StoreError(f"malformed generation index: {exc}") from exc


def _gen_name(number: int) -> str:
    return f"g{number:08d}.json"


@dataclass(frozen=True)
class StagedStore:
    """The staged part of one key's directory on the volume."""

    root: Path

    @property
    def bundles(self) -> Path:
        return self.root / "bundles"

    @property
    def generations_dir(self) -> Path:
        return self.root / "generations"

    @property
    def readers(self) -> Path:
        return self.root / "readers"

    @property
    def lease_path(self) -> Path:
        return self.root / "publish.lease"

    def create(self) -> None:
        for path in (self.bundles, self.generations_dir, self.readers):
            path.mkdir(parents=True, exist_ok=True)

    def generation_numbers(self) -> list[int]:
        try:
            names = os.listdir(self.generations_dir)
        except OSError:
            return []
        numbers = []
        for name in names:
            if name.startswith("g") and name.endswith(".json") and name[1:-5].isdigit():
                numbers.append(int(name[1:-5]))
        return sorted(numbers)

    def load(self, number: int) -> Generation:
        path = self.generations_dir / _gen_name(number)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as exc:
            raise StoreError(f"{path.name}: unreadable ({exc})") from exc
        return Generation.from_json(data)

    def latest(self) -> tuple[Generation | None, list[str]]:
        """The newest generation whose index reads, and warnings about newer ones that did not."""
        warnings = []
        for number in reversed(self.generation_numbers()):
            try:
                return self.load(number), warnings
            except FileNotFoundError:
                continue
            except StoreError as exc:
                warnings.append(str(exc))
        return None, warnings


# --------------------------------------------------------------------------- restore


class _Prefetch(io.RawIOBase):
    """Read a file in CHUNK-sized blocks on a thread (hashing as it goes) ahead of the consumer.

    The volume's round trips and bandwidth waits overlap with tar extraction and local writes.
    """

    def __init__(self, path: Path, depth: int = 16) -> None:
        self.hash = hashlib.sha256()
        self.size = 0
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(depth)
        self._buffer = b""
        self._done = False
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(path,), daemon=True)
        self._thread.start()

    def _put(self, item: bytes | BaseException | None) -> None:
        while not self._cancel.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _run(self, path: Path) -> None:
        try:
            with open(path, "rb", buffering=0) as handle:
                while not self._cancel.is_set() and (chunk := handle.read(CHUNK)):
                    self.hash.update(chunk)
                    self.size += len(chunk)
                    self._put(chunk)
            self._put(None)
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(exc)

    @property
    def finished(self) -> bool:
        """The whole file was read (so `hash` and `size` cover all of it)."""
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
        """Read to the end (so that the hash covers the whole file)."""
        while self.readinto(bytearray(CHUNK)):
            pass


@dataclass(frozen=True)
class RestoreResult:
    generation: int | None
    files: int
    bytes: int
    seconds: float
    per_layer: Mapping[str, tuple[int, int]]  # layer -> (files, bytes)
    problems: tuple[str, ...] = ()  # corrupt generations or bundles that were skipped
    bad_bundles: tuple[str, ...] = ()  # never to be referenced again by a publish

    @property
    def restored(self) -> bool:
        return self.generation is not None


def _layer_of(path: str) -> str | None:
    top = path.split("/", 1)[0]
    for layer, sub, _ in CACHE_LAYERS:
        if sub == top:
            return layer
    return None


def per_layer(paths: Iterable[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = {}
    for path, size in paths:
        layer = _layer_of(path)
        if layer is not None:
            c = counts.setdefault(layer, [0, 0])
            c[0] += 1
            c[1] += size
    return {k: (v[0], v[1]) for k, v in counts.items()}


def safe_relpath(rel: str) -> bool:
    """A relative path that stays inside the directory it is joined to."""
    parts = rel.split("/")
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


def _extract_bundle(store: StagedStore, ref: BundleRef, gen: Generation, dest: Path) -> int:
    """Stream one bundle into `dest`, writing only the members this generation takes from it."""
    wanted = {p: f for p, f in gen.files.items() if f.bundle == ref.name}
    if not (store.bundles / ref.name).is_file():
        raise StoreError(f"bundle {ref.name} is missing", ref.name)
    for parent in {os.path.dirname(p) for p in wanted}:
        (dest / parent).mkdir(parents=True, exist_ok=True)
    reader = _Prefetch(store.bundles / ref.name)
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
    except StoreError as exc:
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


def _register_reader(store: StagedStore, reader: str, gen: Generation, ttl_s: float) -> Path:
    """Atomically (a half-written registration would protect nothing from the collector)."""
    path = store.readers / f"{reader}.json"
    write_json_atomic(
        path, {"generation": gen.number, "bundles": [b.name for b in gen.bundles], "expires": now() + ttl_s}
    )
    return path


def restore(store: StagedStore, dest: Path, *, reader: str, ttl_s: float = 1800.0) -> RestoreResult:
    """Replace `dest` with the newest generation that restores intact (or leave it empty)."""
    start = time.monotonic()
    problems: list[str] = []
    bad: list[str] = []
    staging = dest.with_name(dest.name + f".restoring-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    numbers = store.generation_numbers()
    unregistered = False
    for number in reversed(numbers):
        try:
            gen = store.load(number)
        except FileNotFoundError:
            continue
        except StoreError as exc:
            problems.append(str(exc))
            continue
        registration = None
        try:
            store.readers.mkdir(parents=True, exist_ok=True)
            registration = _register_reader(store, reader, gen, ttl_s)
        except OSError as exc:
            # A read-only or full volume can still be read. Unregistered, a bundle that a
            # collector removes meanwhile fails its check and the next generation is tried.
            if not unregistered:
                log.warning("warmstart | restore  | cannot register as a reader (%s): restoring unprotected", exc)
                unregistered = True
        try:
            step("restore:registered")
            if not (store.generations_dir / _gen_name(number)).exists():
                continue  # removed between listing and registering: take the next
            staging.mkdir(parents=True)
            for ref in gen.bundles:
                _extract_bundle(store, ref, gen, staging)
            step("restore:extracted")
        except (StoreError, OSError) as exc:
            problems.append(f"generation {number}: {exc}")
            if isinstance(exc, StoreError) and exc.bundle:
                bad.append(exc.bundle)
            shutil.rmtree(staging, ignore_errors=True)
            continue
        finally:
            if registration is not None:
                try:
                    registration.unlink()
                except OSError:
                    pass
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, dest)
        files = [(p, f.size) for p, f in gen.files.items()]
        seconds = time.monotonic() - start
        return RestoreResult(number, len(files), gen.bytes, seconds, per_layer(files), tuple(problems), tuple(bad))
    # Nothing restorable: start cold, from an empty directory.
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    return RestoreResult(None, 0, 0, time.monotonic() - start, {}, tuple(problems), tuple(bad))


# --------------------------------------------------------------------------- the lease


@dataclass
class PublishLease:
    """Who may publish. A file created exclusively; a holder that died loses it at expiry."""

    store: StagedStore
    holder: str
    ttl_s: float = 600.0
    held: bool = False

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.store.lease_path.read_text())
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def _stale(self, data: dict[str, Any] | None) -> bool:
        if data is None:  # unreadable: stale once old enough to not be mid-write
            try:
                return now() - self.store.lease_path.stat().st_mtime > 5.0
            except OSError:
                return True
        if float(data.get("expires", 0)) < now():
            return True
        # A holder on this machine whose process is gone (killed) lost the lease at once.
        if data.get("host") == socket.gethostname():
            pid = int(data.get("pid", 0))
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def is_live(self) -> bool:
        """Someone holds the lease now: it exists and has neither expired nor lost its process."""
        if not self.store.lease_path.exists():
            return False
        return not self._stale(self._read())

    def try_acquire(self) -> bool:
        self.store.root.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(
            {"holder": self.holder, "host": socket.gethostname(), "pid": os.getpid(), "expires": now() + self.ttl_s}
        )
        for _ in range(2):
            try:
                fd = os.open(self.store.lease_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not self._stale(self._read()):
                    return False
                # Take a stale lease over: only one renamer wins the old file.
                grave = self.store.root / f".lease-stale-{self.holder}"
                try:
                    os.rename(self.store.lease_path, grave)
                    os.unlink(grave)
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            self.held = True
            return True
        return False

    def acquire(self, wait_s: float, poll_s: float = 1.0) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            if self.try_acquire():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)

    def release(self) -> None:
        if not self.held:
            return
        data = self._read()
        if data is not None and data.get("holder") == self.holder:
            try:
                self.store.lease_path.unlink()
            except OSError:
                pass
        self.held = False


# --------------------------------------------------------------------------- publish


@dataclass(frozen=True)
class PublishPlan:
    """What a publish would write: files the current generation lacks, on top of it (or all, fresh)."""

    base: Generation | None
    files: Mapping[str, tuple[int, int]]  # path -> (size, mtime_ns), relative to the local cache base
    full: bool  # a fresh generation that does not reference the base's bundles
    reason: str

    @property
    def empty(self) -> bool:
        return not self.files

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.files.values())


def plan_publish(store: StagedStore, local: Path, *, distrust: Iterable[str] = ()) -> PublishPlan:
    """Compare the local cache with the newest generation on the volume."""
    base, _ = store.latest()
    scan = scan_tree(local)
    local_files = {p: v for p, v in scan.files.items() if _layer_of(p) is not None}
    distrusted = set(distrust)
    if base is None:
        return PublishPlan(None, local_files, True, "no generation on the volume yet")
    if distrusted & {b.name for b in base.bundles}:
        return PublishPlan(base, local_files, True, "the newest generation holds a corrupt bundle: writing it anew")
    if len(base.bundles) >= MAX_BUNDLES:
        return PublishPlan(base, local_files, True, f"compacting {len(base.bundles)} bundles into one")
    missing = {p: v for p, v in local_files.items() if p not in base.files}
    return PublishPlan(base, missing, False, f"{len(missing)} files the generation {base.number} lacks")


@dataclass(frozen=True)
class PublishResult:
    status: str  # published | nothing_new | skipped | failed
    generation: int | None = None
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    detail: str = ""
    per_layer: Mapping[str, tuple[int, int]] = field(default_factory=dict)


def _write_bundle(store: StagedStore, local: Path, files: Mapping[str, tuple[int, int]]) -> BundleRef:
    """Pack the files into bundles/.tmp-*, fsync, re-read to verify, rename to its final name."""
    tmp = store.bundles / f".tmp-{uuid.uuid4().hex}.tar"
    digest = hashlib.sha256()

    class Hashing(io.RawIOBase):
        def __init__(self, raw: BinaryIO) -> None:
            self.raw = raw
            self.size = 0

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            digest.update(data)
            self.size += len(data)
            return self.raw.write(data)

    try:
        with open(tmp, "wb", buffering=0) as raw:
            hashing = Hashing(raw)
            sink = io.BufferedWriter(hashing, CHUNK)
            with tarfile.open(fileobj=sink, mode="w|", format=tarfile.GNU_FORMAT, bufsize=1 << 20) as tar:
                for rel in sorted(files):
                    path = local / rel
                    info = tar.gettarinfo(str(path), arcname=rel)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with open(path, "rb") as handle:
                        tar.addfile(info, handle)
            sink.flush()
            os.fsync(raw.fileno())
        step("publish:bundle_tmp_written")
        size = hashing.size
        sha = digest.hexdigest()
        check = hashlib.sha256()
        with open(tmp, "rb", buffering=0) as handle:
            read = 0
            while chunk := handle.read(CHUNK):
                check.update(chunk)
                read += len(chunk)
        if read != size or check.hexdigest() != sha:
            raise StoreError(f"bundle verification failed after writing ({read} of {size} bytes read back)")
        name = f"{sha[:16]}-{uuid.uuid4().hex[:8]}.tar"
        os.rename(tmp, store.bundles / name)
        step("publish:bundle_renamed")
        return BundleRef(name, sha, size, len(files))
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def execute_publish(store: StagedStore, local: Path, plan: PublishPlan, *, publisher: str) -> PublishResult:
    """Write the plan: one bundle, then a generation linked into place (never overwriting one)."""
    start = time.monotonic()
    if plan.empty:
        return PublishResult(
            "nothing_new",
            plan.base.number if plan.base else None,
            detail="the volume's generation already holds every local file",
        )
    store.create()
    # Files may have changed since the plan's scan; pack what is there now.
    files = {}
    for rel in plan.files:
        try:
            st = os.stat(local / rel)
        except FileNotFoundError:
            continue
        files[rel] = (st.st_size, st.st_mtime_ns)
    ref = _write_bundle(store, local, files)
    base = plan.base
    entries = {} if plan.full or base is None else dict(base.files)
    bundles = () if plan.full or base is None else base.bundles
    for rel, (size, mtime_ns) in files.items():
        entries[rel] = FileEntry(size, mtime_ns, ref.name)
    number = (base.number if base else 0) + 1
    for _ in range(5):
        gen = Generation(number, (*bundles, ref), entries, now(), publisher)
        tmp = store.generations_dir / f".tmp-{uuid.uuid4().hex}.json"
        _write_json(tmp, gen.to_json())
        step("publish:generation_tmp_written")
        try:
            os.link(tmp, store.generations_dir / _gen_name(number))
        except FileExistsError:
            # Someone published this number meanwhile: build on theirs, keep our bundle.
            os.unlink(tmp)
            newest, _ = store.latest()
            if newest is None:
                raise StoreError("a generation appeared and vanished during publish") from None
            entries = dict(newest.files)
            for rel, (size, mtime_ns) in files.items():
                entries.setdefault(rel, FileEntry(size, mtime_ns, ref.name))
            bundles = newest.bundles
            number = newest.number + 1
            continue
        step("publish:generation_linked")
        os.unlink(tmp)
        _fsync_dir(store.generations_dir)
        return PublishResult(
            "published",
            number,
            len(files),
            ref.size,
            time.monotonic() - start,
            plan.reason,
            per_layer((p, s) for p, (s, _) in files.items()),
        )
    raise StoreError("could not claim a generation number after 5 tries")


def publish(
    store: StagedStore,
    local: Path,
    *,
    publisher: str,
    lease_wait_s: float,
    lease_ttl_s: float = 600.0,
    distrust: Iterable[str] = (),
) -> PublishResult:
    """Take the lease (waiting up to `lease_wait_s`), publish what is missing, collect garbage."""
    start = time.monotonic()
    lease = PublishLease(store, publisher, ttl_s=lease_ttl_s)
    step("publish:start")
    try:
        got = lease.try_acquire()
        if not got:
            holder = (lease._read() or {}).get("holder", "?")
            log.info(
                "warmstart | publish  | the publish lease is held by %s: waiting up to %.0f s, then publishing "
                "only what its generation lacks",
                holder,
                lease_wait_s,
            )
            step("publish:lease_busy")
            got = lease.acquire(lease_wait_s)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return PublishResult("failed", seconds=time.monotonic() - start, detail=f"publish failed, no lease: {reason}")
    if not got:
        return PublishResult("skipped", detail="another worker holds the publish lease")
    try:
        step("publish:lease_held")
        plan = plan_publish(store, local, distrust=distrust)
        result = execute_publish(store, local, plan, publisher=publisher)
        try:
            collect_garbage(store, ttl_s=lease_ttl_s).execute(store)
        except OSError as exc:
            log.warning("warmstart | publish  | garbage collection failed: %s", exc)
        step("publish:collected")
        return replace(result, seconds=time.monotonic() - start)  # lease and garbage included
    except (OSError, StoreError) as exc:
        reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
        return PublishResult(
            "failed",
            seconds=time.monotonic() - start,
            detail=f"publish failed, the previous generation is intact: {reason}",
        )
    finally:
        lease.release()


# --------------------------------------------------------------------------- garbage


@dataclass(frozen=True)
class GarbagePlan:
    generations: tuple[str, ...]  # generation files to remove (first)
    bundles: tuple[str, ...]  # bundle files to remove (after)
    temporaries: tuple[str, ...]  # abandoned .tmp-* files and expired reader registrations

    def execute(self, store: StagedStore) -> None:
        for name in self.generations:
            _unlink(store.generations_dir / name)
        for name in self.bundles:
            _unlink(store.bundles / name)
        for rel in self.temporaries:
            _unlink(store.root / rel)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def collect_garbage(store: StagedStore, *, ttl_s: float, keep: int = KEEP_GENERATIONS) -> GarbagePlan:
    """Plan removals: generations beyond the newest `keep` that no live reader uses, bundles no
    remaining generation or reader references, temporaries older than `ttl_s`."""
    live_generations: set[int] = set()
    live_bundles: set[str] = set()
    temporaries: list[str] = []
    t = now()
    for reg in store.readers.glob("*.json") if store.readers.is_dir() else []:
        try:
            data = json.loads(reg.read_text())
            if float(data["expires"]) >= t:
                live_generations.add(int(data["generation"]))
                live_bundles.update(data.get("bundles", []))
                continue
        except (OSError, ValueError, KeyError, TypeError):
            pass
        temporaries.append(f"readers/{reg.name}")
    numbers = store.generation_numbers()
    kept = set(numbers[-keep:]) | live_generations
    remove_gens = [n for n in numbers if n not in kept]
    referenced = set(live_bundles)
    for number in kept:
        try:
            referenced.update(b.name for b in store.load(number).bundles)
        except (FileNotFoundError, StoreError):
            continue
    bundles = []
    for entry in os.scandir(store.bundles) if store.bundles.is_dir() else []:
        if entry.name.startswith(".tmp-"):
            if t - entry.stat().st_mtime > ttl_s:
                temporaries.append(f"bundles/{entry.name}")
        elif entry.name not in referenced and t - entry.stat().st_mtime > ttl_s:
            # Unreferenced and old: young ones may belong to a publish that is about to link them.
            bundles.append(entry.name)
    for entry in os.scandir(store.generations_dir) if store.generations_dir.is_dir() else []:
        if entry.name.startswith(".tmp-") and t - entry.stat().st_mtime > ttl_s:
            temporaries.append(f"generations/{entry.name}")
    return GarbagePlan(tuple(_gen_name(n) for n in remove_gens), tuple(sorted(bundles)), tuple(temporaries))
