"""The staged cache format, shared by every place that holds it (a volume folder, an S3 prefix).

A key's published caches are immutable *bundles* (a tar stream, plain or in zstd frames:
`store.zst`) and *generations* (JSON indexes naming the bundles and every file in them; see
`Generation.to_json`). This module is the index's format: its dataclasses and names. Packing a
bundle is `store.pack`; reading one back while checking its SHA-256, its size, every tar header's
checksum and every member's size against the index is `store.extract`. Where the bytes live, and
how a generation is created without clobbering another, is a `store.backend.BundleStore`.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import StoreError
from ..errors import StoreUnavailable as StoreUnavailable  # the store's modules import it from here
from .layout import CACHE_LAYERS

FORMAT_VERSION = 1
CHUNK = 8 * 1024 * 1024  # large sequential reads and writes
READ_STREAMS = 4  # a bundle on the volume is read this many chunks at a time (`file_ranges`)


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
    canary: Mapping[str, Any] | None = None  # what vLLM answered the canary when it was published (canary.py)

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
            **({"canary": dict(self.canary)} if self.canary else {}),
        }

    @classmethod
    def from_json(cls, data: Any) -> Generation:
        """A generation from its index, every field checked for its type: an index of another shape
        (another tool's object under a shared prefix, a future format, a hand edit) is a StoreError,
        a generation to skip with its reason, never an AttributeError that ends the boot."""
        try:
            if not isinstance(data, Mapping):
                raise StoreError(f"malformed generation index: a JSON {type(data).__name__}, not an object")
            raw_bundles, raw_files = data.get("bundles"), data.get("files")
            if not isinstance(raw_bundles, list) or not all(isinstance(b, Mapping) for b in raw_bundles):
                raise StoreError('malformed generation index: "bundles" is not a list of objects')
            if not isinstance(raw_files, Mapping):
                raise StoreError(
                    f'malformed generation index: "files" is a JSON {type(raw_files).__name__}, not an object'
                )
            bundles = tuple(_bundle_ref(b) for b in raw_bundles)
            files = {str(p): _file_entry(v) for p, v in raw_files.items()}
            if not all(safe_relpath(p) for p in files):
                raise StoreError("a file path in the index leaves the cache directory or is no file name")
            names = {b.name for b in bundles}
            if any(f.bundle not in names for f in files.values()):
                raise StoreError("a file names a bundle the generation does not list")
            canary = data.get("canary")
            return cls(
                int(data["generation"]),
                bundles,
                files,
                float(data["created"]),
                str(data["publisher"]),
                canary if isinstance(canary, Mapping) else None,
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise StoreError(f"malformed generation index: {type(exc).__name__}: {exc}") from exc


def _bundle_ref(raw: Mapping[str, Any]) -> BundleRef:
    ref = BundleRef(str(raw["name"]), str(raw["sha256"]), int(raw["size"]), int(raw["files"]))
    if "/" in ref.name or ref.name in ("", ".", "..") or "\0" in ref.name:
        raise StoreError(f"malformed generation index: a bundle name that is no file name: {ref.name!r}")
    return ref


def _file_entry(raw: Any) -> FileEntry:
    """`[size, mtime_ns, bundle]` or `[size, mtime_ns, bundle, sha256]` (`Generation.to_json`)."""
    if not isinstance(raw, list) or not 3 <= len(raw) <= 4 or any(isinstance(x, (list, dict, bool)) for x in raw):
        raise StoreError(f"malformed generation index: a file entry is {str(raw)[:40]}, not [size, mtime, bundle]")
    return FileEntry(int(raw[0]), int(raw[1]), str(raw[2]), str(raw[3]) if len(raw) > 3 else "")


def gen_name(number: int) -> str:
    return f"g{number:08d}.json"


def parse_gen_name(name: str) -> int | None:
    """The number of a generation file name (`g00000007.json`), or None for anything else."""
    if name.startswith("g") and name.endswith(".json") and name[1:-5].isdigit():
        return int(name[1:-5])
    return None


# --------------------------------------------------------------------------- reading a bundle


def file_chunks(path: Path) -> Iterator[bytes]:
    """A file in CHUNK-sized reads (a bundle on a mounted volume)."""
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def file_ranges(path: Path, size: int, streams: int = READ_STREAMS) -> Iterator[bytes]:
    """The first `size` bytes of a file in CHUNK-sized positional reads, `streams` at a time,
    yielded in order: a network volume serves several streams faster than one (its client
    pipelines them), as an S3 store serves parallel ranged GETs."""
    fd = os.open(path, os.O_RDONLY)
    spans = [(start, min(CHUNK, size - start)) for start in range(0, size, CHUNK)]
    pool = ThreadPoolExecutor(max_workers=max(1, min(streams, len(spans))), thread_name_prefix="bundle-pread")
    window: deque[Future[bytes]] = deque()
    try:
        pending = iter(spans)
        for span in itertools.islice(pending, 2 * streams):
            window.append(pool.submit(os.pread, fd, span[1], span[0]))
        while window:
            chunk = window.popleft().result()
            for span in itertools.islice(pending, 1):
                window.append(pool.submit(os.pread, fd, span[1], span[0]))
            yield chunk
    finally:
        for future in window:
            future.cancel()
        pool.shutdown(wait=True)
        os.close(fd)


def layer_of(path: str) -> str | None:
    top = path.split("/", 1)[0]
    for layer, sub, _ in CACHE_LAYERS:
        if sub == top:
            return layer
    return None


# The names the writers of these caches give a file before renaming it into place. One that is
# still there was left by a writer killed mid-write (or is about to be renamed): never a cache
# entry, so never published; once in a generation the union would carry it for ever.
_TEMPORARY_FILE = re.compile(
    r"^\..+\.tmp$"  # torch/_inductor/codecache.py write_atomic: f".{os.getpid()}.{threading.get_ident()}.tmp";
    # vllm/model_executor/warmup/flashinfer_autotune_cache.py: mkstemp(prefix=f".{name}.", suffix=".tmp")
    r"|\.\d+\.tmp$"  # vllm/compilation/decorators.py: f"{self._aot_compilation_path}.{os.getpid()}.tmp"
    r"|\.tmp\.\d+$"  # vllm/v1/worker/startup_plan.py: f"{path}.tmp.{os.getpid()}"
)
# triton/runtime/cache.py FileCacheManager.put: writes into f"tmp.pid_{pid}_{uuid4()}/", then os.replace
_TEMPORARY_DIR = re.compile(r"^tmp\.pid_\d+_[0-9a-f-]+$")


def is_temporary(path: str) -> bool:
    """A file a cache's writer had not renamed into place yet (vLLM 0.32/0.33, torch 2.13, Triton 3.9)."""
    *dirs, name = path.split("/")
    return bool(_TEMPORARY_FILE.search(name)) or any(_TEMPORARY_DIR.match(d) for d in dirs)


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


def bundle_name(sha256: str, unique: str, *, compressed: bool = False) -> str:
    """`<sha256 prefix>-<unique>.tar` (or `.tar.zst`): content-addressed for people, unique for stores."""
    return f"{sha256[:16]}-{unique[:8]}.tar" + (".zst" if compressed else "")
