"""A real headless browser (Debian's chromium) for the timeline pages: DOM dumps, screenshots, pixels."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from helpers.markguard import require


def chromium() -> str:
    require("browser", "opens a browser (chromium)")
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("no chromium: run `make test` (it runs .ci/ensure-chromium) or `apt-get install chromium`")
    return found


def browse(page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    profile.mkdir()
    args = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1000,500",
        *extra,
        page.resolve().as_uri(),
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def dump_dom(page: Path, tmp: Path) -> str:
    out = browse(page, tmp, "--dump-dom")
    assert out.returncode == 0 and "<body" in out.stdout, out.stderr[-2000:]
    return out.stdout


def screenshot(page: Path, tmp: Path) -> Path:
    png = tmp / (page.stem + ".png")
    out = browse(page, tmp, f"--screenshot={png}")
    assert out.returncode == 0 and png.is_file(), out.stderr[-2000:]
    return png


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA PNG (what chromium writes) into rows of pixels, in pure Python."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 4 if colour == 6 else 3
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, channels, rows


def colour_count(path: Path, rgb: str) -> tuple[int, int]:
    """(pixels of exactly this #rrggbb colour, pixels that are not white)."""
    _, channels, rows = png_pixels(path)
    target = bytes.fromhex(rgb.lstrip("#"))
    hits = non_white = 0
    for row in rows:
        for x in range(0, len(row), channels):
            px = row[x : x + 3]
            if px == target:
                hits += 1
            if px != b"\xff\xff\xff":
                non_white += 1
    return hits, non_white


def bars(dom: str) -> list[tuple[str, str]]:
    """(phase, label text) of every bar in a boot row."""
    return re.findall(r'<div class="bar[^"]*" data-phase="([^"]+)"[^>]*><span class="label">([^<]*)</span>', dom)
