"""A slow mock network volume: a FUSE passthrough that adds round trips and caps bandwidth.

Runpod's network volume is a network filesystem: every metadata operation (open, stat,
readdir, create, rename, ...) is a round trip, and data moves at a few hundred MB/s.
This filesystem mirrors a local folder and adds `latency_ms` to each metadata operation
and a shared bandwidth cap to reads and writes (a token bucket, so parallel readers share
it as they would share a network link). The kernel caches no pages (`direct_io`: a new
worker's page cache is cold) and keeps names and attributes for one second, as an NFS
client's attribute cache does. `quota_bytes` makes writes fail with ENOSPC once that
many bytes are written through the mount (removing a file's last link gives its bytes
back), for fault tests; `faults_file` adds the fault layer (`faultfs`: EIO, ENOSPC and the
like on chosen operations, at a rate, switched while mounted).

The NFS-like mode (`page_cache=True`, `stream_mbps`) models a network volume's client for
weight reads: the kernel page cache is on (`kernel_cache`: pages read once stay cached
across opens, as on an NFS client, so a prefetch helps whoever reads next), every open
file handle is a stream with its own bandwidth cap on top of the shared one (network
volumes scale with concurrent streams), and metadata operations still pay `latency_ms`.
A fresh mount starts cold: a FUSE mount's pages belong to its own inodes and are dropped
with it. Reads pay bandwidth, not a round trip each: an NFS client pipelines its reads.

Every operation a compiler needs is implemented (a passthrough that refused rmdir or
utimens broke Inductor with ENOSYS). Run it with `python -m warmstart_dev.slowfs SRC MNT`;
`mounted()` starts it in a subprocess and always unmounts.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from . import faultfs

DEFAULT_LATENCY_MS = 3.0
DEFAULT_BANDWIDTH_MBPS = 300.0
# Like an NFS client's attribute cache (acregmin is 3 s there): a file's first lookup and every
# open pay a round trip, re-walking the same directory within a second does not.
DEFAULT_CACHE_TIMEOUT_S = 1.0

# The NFS-like preset: the reference volume (3 ms per operation, 30 MB/s per
# stream, 120 MB/s in all). Runpod documents 200-400 MB/s typical; the ratio of one
# stream to the aggregate is what makes concurrency matter.
NFS_LATENCY_MS = 3.0
NFS_STREAM_MBPS = 30.0
NFS_BANDWIDTH_MBPS = 120.0

# The test suite's marker guard (tests/helpers/markguard.py) writes the running test's markers here, one file
# per pytest process; `mounted()` looks for its ancestors' files, so a bench run by a test with a clean
# environment is held to the test's markers too.
GUARD_DIR = Path("/tmp/warmstart-markguard")


def guard_file(pid: int) -> Path:
    return GUARD_DIR / f"{pid}.json"


def process_start(pid: int) -> str | None:
    """When `pid` started (clock ticks since boot): tells a process from a later one given the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _ancestors(pid: int) -> Iterator[int]:
    while pid > 1:
        yield pid
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return


def refuse_unmarked_mount() -> None:
    """Under the test suite, mount only for a test marked `fuse` (markguard.py): else raise, naming the test."""
    for pid in _ancestors(os.getpid()):
        try:
            guard = json.loads(guard_file(pid).read_text())
        except (OSError, ValueError):
            continue
        if guard.get("start") != process_start(pid):
            continue  # left by a test process that died; this pid is another process now
        if "fuse" not in guard.get("marks", ()):
            test = guard.get("test")
            raise RuntimeError(f"{test} mounts FUSE without @pytest.mark.fuse (tests/helpers/markguard.py)")
        return


class Bandwidth:
    """A shared link: each transfer waits for its slot at `bytes_per_s`."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self._next = 0.0
        self._lock = threading.Lock()

    def transfer(self, n: int) -> None:
        if self.rate <= 0 or n <= 0:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + n / self.rate
            done = self._next
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def make_operations(
    root: str,
    latency_s: float,
    link: Bandwidth,
    quota_bytes: int | None,
    stream_bytes_per_s: float = 0.0,
    faults: Any = None,
) -> Any:
    import mfusepy as fuse

    streams: dict[int, Bandwidth] = {}
    streams_lock = threading.Lock()

    def stream(fh: int) -> Bandwidth | None:
        if stream_bytes_per_s <= 0:
            return None
        with streams_lock:
            return streams.setdefault(fh, Bandwidth(stream_bytes_per_s))

    class SlowPassthrough(fuse.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self) -> None:
            self.root = os.path.realpath(root)
            self.written = 0
            self.quota = quota_bytes
            self._quota_lock = threading.Lock()

        def _path(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def _rtt(self) -> None:
            if latency_s > 0:
                time.sleep(latency_s)

        # -- metadata: one round trip each
        def access(self, path: str, amode: int) -> int:
            self._rtt()
            if not os.access(self._path(path), amode):
                raise fuse.FuseOSError(errno.EACCES)
            return 0

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            self._rtt()
            st = os.lstat(self._path(path))
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
            out = {k.replace("_ns", ""): getattr(st, k) for k in keys}
            return out

        def readdir(self, path: str, fh: int) -> list[str]:
            self._rtt()
            return [".", "..", *os.listdir(self._path(path))]

        def readlink(self, path: str) -> str:
            self._rtt()
            return os.readlink(self._path(path))

        def mkdir(self, path: str, mode: int) -> int:
            self._rtt()
            os.mkdir(self._path(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            self._rtt()
            os.rmdir(self._path(path))
            return 0

        def unlink(self, path: str) -> int:
            self._rtt()
            st = os.lstat(self._path(path))
            os.unlink(self._path(path))
            if self.quota is not None and st.st_nlink == 1:
                # The last link: the space comes back, as on a real disk (a failed restore that
                # cleans up after itself leaves room for what the engine writes next).
                with self._quota_lock:
                    self.written = max(0, self.written - st.st_size)
            return 0

        def rename(self, old: str, new: str) -> int:
            self._rtt()
            os.rename(self._path(old), self._path(new))
            return 0

        def link(self, target: str, source: str) -> int:
            self._rtt()
            os.link(self._path(source), self._path(target))
            return 0

        def symlink(self, target: str, source: str) -> int:
            self._rtt()
            os.symlink(source, self._path(target))
            return 0

        def chmod(self, path: str, mode: int) -> int:
            self._rtt()
            os.chmod(self._path(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            self._rtt()
            os.chown(self._path(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            self._rtt()
            os.utime(self._path(path), ns=times)
            return 0

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            self._rtt()
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._path(path), length)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            self._rtt()
            sv = os.statvfs(self._path(path))
            keys = (
                "f_bavail",
                "f_bfree",
                "f_blocks",
                "f_bsize",
                "f_favail",
                "f_ffree",
                "f_files",
                "f_flag",
                "f_frsize",
                "f_namemax",
            )
            return {k: getattr(sv, k) for k in keys}

        def open(self, path: str, flags: int) -> int:
            self._rtt()
            return os.open(self._path(path), flags)

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            self._rtt()
            return os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            self._rtt()
            os.fsync(fh)
            return 0

        # -- data: bandwidth
        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            data = os.pread(fh, size, offset)
            own = stream(fh)
            if own is not None:
                own.transfer(len(data))
            link.transfer(len(data))
            return data

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            if self.quota is not None:
                with self._quota_lock:
                    if self.written + len(data) > self.quota:
                        raise fuse.FuseOSError(errno.ENOSPC)
                    self.written += len(data)
            link.transfer(len(data))
            return os.pwrite(fh, data, offset)

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            with streams_lock:
                streams.pop(fh, None)
            os.close(fh)
            return 0

    if faults is not None:
        return faultfs.with_faults(SlowPassthrough(), faults)
    return SlowPassthrough()


def serve(
    source: Path,
    mountpoint: Path,
    latency_ms: float,
    bandwidth_mbps: float,
    quota_bytes: int | None,
    cache_timeout_s: float = DEFAULT_CACHE_TIMEOUT_S,
    *,
    stream_mbps: float = 0.0,
    page_cache: bool = False,
    faults_file: str = "",
    fault_stats: str = "",
    fault_seed: int = 0,
) -> None:
    import mfusepy as fuse

    switch = None
    if faults_file:
        switch = faultfs.FaultSwitch(faults_file, fault_stats, fault_seed)
    ops = make_operations(
        str(source), latency_ms / 1000.0, Bandwidth(bandwidth_mbps * 1e6), quota_bytes, stream_mbps * 1e6, switch
    )
    # page_cache: kernel_cache keeps a file's pages across opens (FUSE drops them on each open otherwise).
    cache_opts: dict[str, bool] = {"kernel_cache": True} if page_cache else {"direct_io": True}
    fuse.FUSE(
        ops,
        str(mountpoint),
        foreground=True,
        nothreads=False,
        **cache_opts,
        attr_timeout=cache_timeout_s,
        entry_timeout=cache_timeout_s,
        negative_timeout=0,
        fsname="warmstart-slowfs",
    )


def is_mounted(mountpoint: Path) -> bool:
    target = os.path.realpath(mountpoint)
    try:
        with open("/proc/self/mounts") as mounts:
            return any(line.split()[1] == target for line in mounts)
    except OSError:
        return False


def unmount(mountpoint: Path) -> None:
    """Unmount, lazily if busy; never raises."""
    for cmd in (
        ["fusermount3", "-u", str(mountpoint)],
        ["fusermount3", "-uz", str(mountpoint)],
        ["umount", "-l", str(mountpoint)],
    ):
        if not is_mounted(mountpoint):
            return
        if shutil.which(cmd[0]):
            subprocess.run(cmd, capture_output=True, check=False)


def nfs_mounted(source: Path, mountpoint: Path, **overrides: Any) -> contextlib.AbstractContextManager[Path]:
    """The NFS-like mock volume: page cache on, per-stream and aggregate caps, 3 ms per operation."""
    options: dict[str, Any] = {
        "latency_ms": NFS_LATENCY_MS,
        "bandwidth_mbps": NFS_BANDWIDTH_MBPS,
        "stream_mbps": NFS_STREAM_MBPS,
        "page_cache": True,
    }
    options.update(overrides)
    return mounted(source, mountpoint, **options)


@contextlib.contextmanager
def mounted(
    source: Path,
    mountpoint: Path,
    *,
    latency_ms: float = DEFAULT_LATENCY_MS,
    bandwidth_mbps: float = DEFAULT_BANDWIDTH_MBPS,
    quota_bytes: int | None = None,
    timeout_s: float = 20.0,
    stream_mbps: float = 0.0,
    page_cache: bool = False,
    faults_file: Path | None = None,
    fault_stats: Path | None = None,
    fault_seed: int = 0,
) -> Iterator[Path]:
    """Mount the slow filesystem in a child process for the duration of the block."""
    refuse_unmarked_mount()
    source.mkdir(parents=True, exist_ok=True)
    unmount(mountpoint)  # a mount left by a process that was killed
    mountpoint.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "warmstart_dev.slowfs",
        str(source),
        str(mountpoint),
        "--latency-ms",
        str(latency_ms),
        "--bandwidth-mbps",
        str(bandwidth_mbps),
    ]
    if quota_bytes is not None:
        cmd += ["--quota-bytes", str(quota_bytes)]
    if stream_mbps > 0:
        cmd += ["--stream-mbps", str(stream_mbps)]
    if page_cache:
        cmd.append("--page-cache")
    if faults_file is not None:
        cmd += ["--faults-file", str(faults_file), "--fault-seed", str(fault_seed)]
        cmd += ["--fault-stats", str(fault_stats)] if fault_stats is not None else []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout_s
        while not is_mounted(mountpoint):
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"slowfs exited with {proc.returncode} before mounting: {err.strip()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"slowfs did not mount {mountpoint} within {timeout_s:.0f} s")
            time.sleep(0.05)
        yield mountpoint
    finally:
        unmount(mountpoint)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warmstart_dev.slowfs", description=__doc__.split("\n")[0])
    parser.add_argument("source")
    parser.add_argument("mountpoint")
    parser.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_MS)
    parser.add_argument("--bandwidth-mbps", type=float, default=DEFAULT_BANDWIDTH_MBPS)
    parser.add_argument("--quota-bytes", type=int, default=None)
    parser.add_argument("--cache-timeout-s", type=float, default=DEFAULT_CACHE_TIMEOUT_S)
    parser.add_argument("--stream-mbps", type=float, default=0.0, help="per open file (stream) cap; 0: none")
    parser.add_argument("--page-cache", action="store_true", help="keep the kernel page cache on (NFS-like)")
    parser.add_argument("--faults-file", default="", help="fault rules (JSON, re-read when changed): faultfs")
    parser.add_argument("--fault-stats", default="", help="keep the counts of injected faults in this JSON file")
    parser.add_argument("--fault-seed", type=int, default=0)
    args = parser.parse_args(argv)
    serve(
        Path(args.source),
        Path(args.mountpoint),
        args.latency_ms,
        args.bandwidth_mbps,
        args.quota_bytes,
        args.cache_timeout_s,
        stream_mbps=args.stream_mbps,
        page_cache=args.page_cache,
        faults_file=args.faults_file,
        fault_stats=args.fault_stats,
        fault_seed=args.fault_seed,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


@contextlib.contextmanager
def faulty_mounted(
    source: Path,
    mountpoint: Path,
    *,
    rules: Sequence[faultfs.FaultRule] = (),
    control: Path | None = None,
    seed: int = 0,
    latency_ms: float = 0.0,
    bandwidth_mbps: float = 0.0,
    **options: Any,
) -> Iterator[tuple[Path, faultfs.Faults]]:
    """`mounted` with the fault layer (`faultfs`): no latency or cap unless asked; rules changeable."""
    control = control or mountpoint.with_name(mountpoint.name + ".faults")
    control.mkdir(parents=True, exist_ok=True)
    faults = faultfs.Faults(control / "rules.json", control / "injected.json")
    faults.set(rules)
    with mounted(
        source,
        mountpoint,
        latency_ms=latency_ms,
        bandwidth_mbps=bandwidth_mbps,
        faults_file=faults.rules_file,
        fault_stats=faults.stats_file,
        fault_seed=seed,
        **options,
    ) as mnt:
        yield mnt, faults
