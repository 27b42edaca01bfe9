"""`warmstart-dev bench compress`: how compiled caches compress, on real files, against the benches' cache.

Whether compressing bundles pays depends on what the caches hold, and random bytes would say
nothing. For each PATH (a file or a directory: a real compile cache, a wheel's unpacked
extension modules) it reports, per kind of file, how many bytes zstd makes of them file by file
at each level, and how fast one core decodes them. A shared library with an `.nv_fatbin` section
(a CUDA extension) also yields the GPU code inside it: its SASS cubins (ELF files, what Triton,
DeepGEMM and FlashInfer write to their caches) and PTX, each decoded from the fatbin (CUDA 13
stores them zstd-compressed there). The benches' synthetic cache (`volumebench.synthetic_cache`)
is measured the same way, so the two can be compared.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .volumebench import synthetic_cache

FATBIN_MAGIC = 0xBA55ED50
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _section(path: Path, wanted: bytes) -> bytes | None:
    """The bytes of an ELF64 little-endian file's section named `wanted`, or None."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        shoff = struct.unpack_from("<Q", head, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        headers = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        if shstrndx >= len(headers):
            return None
        f.seek(headers[shstrndx][4])
        names = f.read(headers[shstrndx][5])
        for name_off, _, _, _, offset, size in headers:
            if names[name_off : names.index(b"\0", name_off)] == wanted:
                f.seek(offset)
                return f.read(size)
    return None


def fatbin_entries(path: Path) -> Iterator[tuple[str, bytes]]:
    """(kind, bytes) of each cubin ("cubin") and PTX ("ptx") in a shared library's fatbins, decoded
    when stored zstd-compressed; entries in other encodings are left out."""
    import zstandard

    data = _section(path, b".nv_fatbin")
    if not data:
        return
    off = 0
    while off + 16 <= len(data):
        magic, _, header_size, fat_size = struct.unpack_from("<IHHQ", data, off)
        if magic != FATBIN_MAGIC:
            off += 8
            continue
        pos, end = off + header_size, off + header_size + fat_size
        while pos + 16 <= end:
            kind, _, entry_header, payload_size = struct.unpack_from("<HHIQ", data, pos)
            if not entry_header:
                break
            payload = data[pos + entry_header : pos + entry_header + payload_size]
            pos += entry_header + payload_size
            if payload[:4] == ZSTD_MAGIC:
                payload = zstandard.ZstdDecompressor().decompressobj().decompress(payload)
            if kind == 2 and payload[:4] == b"\x7fELF":
                yield "cubin", payload
            elif kind == 1 and b".version" in payload[:4096]:
                yield "ptx", payload.rstrip(b"\0")
        off = end


def _kind(path: Path) -> str:
    name = path.name
    if "." not in name.lstrip("."):
        return "(no extension)"
    ext = name.rsplit(".", 1)[-1]
    return ext if len(ext) <= 8 and ext.isalnum() else "(other)"


def _samples(path: Path) -> Iterator[tuple[str, bytes]]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    for file in files:
        data = file.read_bytes()
        if not data:
            continue
        yield _kind(file), data
        if file.suffix == ".so":
            for kind, payload in fatbin_entries(file):
                yield f"{kind} (in .so)", payload


def measure(path: Path, levels: tuple[int, ...]) -> dict[str, Any]:
    """Per kind of file: files, bytes, zstd's ratio at each level (file by file), one core's decoding MB/s."""
    import zstandard

    compressors = {level: zstandard.ZstdCompressor(level=level) for level in levels}
    kinds: dict[str, dict[str, Any]] = {}
    for kind, data in _samples(path):
        k = kinds.setdefault(kind, {"files": 0, "bytes": 0, "compressed": dict.fromkeys(levels, 0), "decode_s": 0.0})
        k["files"] += 1
        k["bytes"] += len(data)
        for level, compressor in compressors.items():
            frame = compressor.compress(data)
            k["compressed"][level] += len(frame)
            if level == levels[-1]:
                t = time.perf_counter()
                zstandard.ZstdDecompressor().decompress(frame)
                k["decode_s"] += time.perf_counter() - t
    out: dict[str, Any] = {}
    total = {"files": 0, "bytes": 0, "compressed": dict.fromkeys(levels, 0), "decode_s": 0.0}
    for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1]["bytes"]):
        out[kind] = _summary(k, levels)
        total["files"] += k["files"]
        total["bytes"] += k["bytes"]
        total["decode_s"] += k["decode_s"]
        for level in levels:
            total["compressed"][level] += k["compressed"][level]
    return {"path": str(path), "all": _summary(total, levels), "kinds": out}


def _summary(k: dict[str, Any], levels: tuple[int, ...]) -> dict[str, Any]:
    return {
        "files": k["files"],
        "bytes": k["bytes"],
        **{f"ratio_level_{level}": round(k["bytes"] / max(1, k["compressed"][level]), 2) for level in levels},
        "decode_mb_s": round(k["bytes"] / 1e6 / k["decode_s"], 0) if k["decode_s"] else None,
    }


def bench_compress(paths: list[Path], levels: tuple[int, ...] = (1, 3)) -> dict[str, Any]:
    result: dict[str, Any] = {"benchmark": "compress", "codec": "zstd (file by file)", "sources": []}
    for path in paths:
        result["sources"].append(measure(path, levels))
    scratch = Path(tempfile.mkdtemp(prefix="warmstart-compress-"))
    try:
        synthetic_cache(scratch / "cache")
        synthetic = measure(scratch / "cache", levels)
        synthetic["path"] = "synthetic (volumebench.synthetic_cache, seed 0)"
        result["sources"].append(synthetic)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result["cpu_count"] = os.cpu_count()
    return result
