"""Bundles in zstd frames: fewer bytes over the volume or the S3 link, for some CPU.

A compressed bundle (`<sha prefix>-<id>.tar.zst`) is the same tar stream a `.tar` bundle holds,
cut into independent zstd frames of FRAME_RAW bytes each (content size and checksum in every
frame), after one skippable frame that holds a note. `zstd -d < bundle | tar -t` lists it. Each
frame decodes alone: a reader may seek to one or decode several at once. A reader tells the
formats apart by the first bytes (a tar bundle starts with a member's name), so the generation
index is the same for both, and old `.tar` bundles keep restoring.

The note is also what keeps a mixed fleet safe during a rollout. A warmstart release from before
compressed bundles reads every bundle as tar. The note frame's bytes, read as tar, are a valid
archive of one member (the note) followed by the end-of-archive blocks: such a release finds none
of the files its generation lists in the bundle ("holds 0 of the N files its generation lists"),
reports the bundle as corrupt, restores the next older generation it can read (or starts cold) and
publishes a fresh tar generation without it. Never a crash (no unexpected exception type reaches
it) and never a partial load (its checks run before its staging directory becomes the cache).
"""

from __future__ import annotations

import io
import struct
from typing import Any, BinaryIO

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SKIPPABLE_MAGIC = 0x184D2A50  # the first of 16 skippable-frame magics (zstd's format, RFC 8878)
LEVEL = 3  # zstd's default: docs/BENCHMARKS.md (bench compress) has what levels 1 and 3 cost and gain
FRAME_RAW = 4 * 1024 * 1024  # tar bytes per frame: the unit a reader may decode alone
INFLATE_PIECE = 4 * 1024 * 1024  # at most this much decoded output at a time

NOTE = (
    b"warmstart bundle: a tar stream in zstd frames (zstd -d < this | tar -t). This member is the\n"
    b"skippable zstd frame before them; a warmstart release that reads bundles as tar only finds\n"
    b"this note, and none of the files its generation lists, and restores an older generation.\n"
)


def _note_frame() -> bytes:
    """The skippable frame: its bytes, read as tar, are one member (NOTE) and the end of the archive."""
    data_blocks = -(-len(NOTE) // 512) * 512
    tar_len = 512 + data_blocks + 1024
    header = bytearray(512)
    header[0:8] = struct.pack("<II", SKIPPABLE_MAGIC, tar_len - 8)  # inside the tar member's name
    header[100:108] = b"0000644\0"
    header[108:116] = b"0000000\0"
    header[116:124] = b"0000000\0"
    header[124:136] = b"%011o\0" % len(NOTE)
    header[136:148] = b"%011o\0" % 0
    header[148:156] = b" " * 8
    header[156:157] = b"0"
    header[257:265] = b"ustar\x0000"
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + NOTE.ljust(data_blocks, b"\0") + bytes(1024)


NOTE_FRAME = _note_frame()


def is_zstd(first: bytes | memoryview) -> bool:
    """Does a bundle that starts with these bytes hold zstd frames (rather than a tar stream)?"""
    head = bytes(first[:4])
    return head == ZSTD_MAGIC or (len(head) == 4 and 0x50 <= head[0] <= 0x5F and head[1:] == b"\x2a\x4d\x18")


def zstd_error(bundle: str, exc: Exception) -> str:
    """What a decoding error says about the bundle: a frame whose content checksum fails is as
    corrupt as a bundle whose SHA-256 does (and is found before the end of the bundle)."""
    if "checksum" in str(exc):
        return f"bundle {bundle} fails its checksum (a zstd frame's content checksum: {exc})"
    return f"bundle {bundle}: zstd frames do not decode ({exc})"


class FrameWriter(io.RawIOBase):
    """Bytes written here leave into `sink` as the note frame, then one zstd frame per FRAME_RAW
    bytes; `finish()` writes the last, shorter one. `raw` counts the bytes taken in."""

    def __init__(self, sink: BinaryIO, level: int = LEVEL) -> None:
        import zstandard

        self.sink = sink
        self.compressor = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
        self.pending = bytearray()
        self.raw = 0
        sink.write(NOTE_FRAME)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        self.pending += data
        self.raw += n
        while len(self.pending) >= FRAME_RAW:
            self._frame(FRAME_RAW)
        return n

    def _frame(self, n: int) -> None:
        with memoryview(self.pending) as view:
            frame = self.compressor.compress(view[:n])
        del self.pending[:n]
        self.sink.write(frame)

    def finish(self) -> None:
        if self.pending:
            self._frame(len(self.pending))
