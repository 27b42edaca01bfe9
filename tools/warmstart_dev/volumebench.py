"""`warmstart-dev bench volume`: reading a GPU-sized compile cache off a slow network volume.

On the slow mock volume (slowfs: 3 ms per metadata operation, 300 MB/s, no kernel
caching) with a synthetic cache shaped like a GPU worker's (thousands of files from
1 KiB to tens of MiB, about 500 MB), in one run:

    sequential_s   the volume's own time to read the same bytes as one file
    direct_s       an engine reading every cache file once, straight off the volume
    staged_s       warmstart's restore (bundles -> local disk), then the same reads locally
    volumecache_s  runpod's VolumeCache.hydrate() (small.tar + parallel copies), then local reads

Goal: staged at least 10x faster than direct, and within 1.5x of sequential.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from warmstart.store.folder import StagedStore
from warmstart.store.staged import execute_publish, plan_publish, restore

from .slowfs import DEFAULT_BANDWIDTH_MBPS, DEFAULT_LATENCY_MS, mounted

TARGET_BYTES = 500 * 1000 * 1000


def synthetic_cache(root: Path, seed: int = 0, target_bytes: int = TARGET_BYTES) -> dict[str, Any]:
    """Write a cache tree shaped like a GPU worker's: many small Triton/Inductor files, some
    medium kernels, a few large compiled graphs. Deterministic for a seed."""
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
    total = 0
    for rel, size in sizes:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
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


def bench_volume(
    workdir: Path,
    *,
    latency_ms: float = DEFAULT_LATENCY_MS,
    bandwidth_mbps: float = DEFAULT_BANDWIDTH_MBPS,
    with_volumecache: bool = True,
) -> dict[str, Any]:
    shutil.rmtree(workdir, ignore_errors=True)
    backing, mnt, local = workdir / "backing", workdir / "mnt", workdir / "local"
    source = workdir / "source-cache"
    shape = synthetic_cache(source)

    # The same cache three ways on the volume's backing folder (setup, not timed).
    shutil.copytree(source, backing / "direct" / "cache")
    store = StagedStore(backing / "staged")
    store.create()
    execute_publish(store, source, plan_publish(store, source), publisher="bench")
    with open(backing / "sequential.bin", "wb") as handle:
        remaining = shape["bytes"]
        while remaining:
            n = min(remaining, 64 << 20)
            handle.write(os.urandom(n))
            remaining -= n

    os.sync()  # setup wrote about 2 GB: let writeback finish before anything is timed

    result: dict[str, Any] = {
        "benchmark": "volume",
        "volume": {
            "kind": "slowfs (FUSE passthrough, direct_io, names and attributes cached 1 s)",
            "latency_ms": latency_ms,
            "bandwidth_mbps": bandwidth_mbps,
        },
        "cache": shape,
    }
    with mounted(backing, mnt, latency_ms=latency_ms, bandwidth_mbps=bandwidth_mbps):
        t = time.perf_counter()
        assert read_file(mnt / "sequential.bin") == shape["bytes"]
        result["sequential_s"] = round(time.perf_counter() - t, 3)

        t = time.perf_counter()
        restored = restore(StagedStore(mnt / "staged"), local / "staged", reader="bench")
        result["staged_restore_s"] = round(time.perf_counter() - t, 3)
        files, total = read_tree(local / "staged")
        result["staged_s"] = round(time.perf_counter() - t, 3)
        assert restored.restored and (files, total) == (shape["files"], shape["bytes"]), (files, total)

        t = time.perf_counter()
        files, total = read_tree(mnt / "direct" / "cache")
        result["direct_s"] = round(time.perf_counter() - t, 3)
        assert (files, total) == (shape["files"], shape["bytes"])

        if with_volumecache:
            result["volumecache_s"] = _bench_volumecache(source, mnt, local / "volumecache", shape)

    result["staged_speedup_vs_direct"] = round(result["direct_s"] / result["staged_s"], 1)
    result["staged_vs_sequential"] = round(result["staged_s"] / result["sequential_s"], 2)
    result["goals"] = read_goals(result["staged_speedup_vs_direct"], result["staged_vs_sequential"], "direct")
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def read_goals(speedup: float, vs_sequential: float, other: str) -> dict[str, bool]:
    """Staged restore at least 10x faster than reading file by file (`other`: direct or per_file),
    and within 1.5x of one sequential read of the same bytes."""
    return {f"staged_10x_faster_than_{other}": speedup >= 10, "staged_within_1.5x_sequential": vs_sequential <= 1.5}


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
