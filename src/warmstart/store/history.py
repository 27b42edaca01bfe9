"""The key's records on the volume: manifest.json and the boots.jsonl history.

The manifest says what a key directory is (its factors), when it was made and last
used, and how often it booted; boots.jsonl holds one boot report per completed boot.
Both are read before vLLM starts (what to expect, what the last good boot looked like)
and written after it serves. Writes go to a temporary file and are renamed into place,
so a reader never sees half a manifest; a damaged history line is skipped, not fatal.
A worker killed mid-append can still leave a last line without its newline (a network
volume's client may not make a short append atomic): the next append starts a new line
first, and the reader skips the fragment and says so. An unreadable manifest is rebuilt
from the history, with a warning, instead of being silently reset.
Nothing secret is ever passed here: callers hand over factors and reports that are
already redacted.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..key import CacheKey
from ..log import StageWarning
from .layout import VolumeLayout

MANIFEST_VERSION = 1


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a sibling temporary file, fsync it, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class BootHistory:
    """What earlier boots of a key left: their reports, and lines that could not be read."""

    boots: tuple[Mapping[str, Any], ...]
    unreadable_lines: int = 0

    def last_good(self) -> Mapping[str, Any] | None:
        """The newest boot that became ready."""
        for boot in reversed(self.boots):
            if boot.get("ready_s") is not None and not boot.get("error"):
                return boot
        return None

    @property
    def expected(self) -> str:
        return "hit" if self.last_good() is not None else "miss"

    def ready_times(self) -> list[float]:
        return [float(b["ready_s"]) for b in self.boots if b.get("ready_s") is not None]


@dataclass
class KeyStore:
    """Records of one key under a layout."""

    layout: VolumeLayout
    key: CacheKey
    warnings: list[StageWarning] = field(default_factory=list)

    @property
    def manifest_path(self) -> Path:
        return self.layout.manifest_path(self.key)

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            warning = StageWarning("store", message)
            self.warnings.append(warning)
            warning.log()

    @property
    def boots_path(self) -> Path:
        return self.layout.boots_path(self.key)

    def history(self) -> BootHistory:
        try:
            text = self.boots_path.read_text()
        except OSError:
            text = ""
        boots, bad = parse_boot_lines(text)
        if bad:
            self._warn(f"{self.boots_path}: skipped {bad} unreadable line(s) (truncated or corrupt)")
        return BootHistory(tuple(boots), bad)

    def manifest(self) -> dict[str, Any] | None:
        data = read_json(self.manifest_path)
        return data if isinstance(data, dict) else None

    def _fresh_manifest(self) -> dict[str, Any]:
        """A manifest for a key that has none, or whose manifest cannot be read: the boot count
        is rebuilt from boots.jsonl (the history outlives a manifest torn by a killed worker)."""
        if self.manifest_path.exists():
            boots = self.history().boots
            self._warn(
                f"{self.manifest_path}: unreadable (truncated or corrupt), "
                f"rebuilt from boots.jsonl ({len(boots)} boots)"
            )
        else:
            boots = ()
        return {
            "version": MANIFEST_VERSION,
            "key": self.key.dirname,
            "digest": self.key.digest,
            "factors": self.key.factors,
            "created": min((str(b["started_at"]) for b in boots if b.get("started_at")), default=now_iso()),
            "boot_count": len(boots),
        }

    def touch(self) -> dict[str, Any]:
        """Create the manifest if it is missing (or rebuild it if unreadable); mark the key as used now."""
        manifest = self.manifest() or self._fresh_manifest()
        manifest["last_used"] = now_iso()
        write_json_atomic(self.manifest_path, manifest)
        return manifest

    def record_boot(self, report: Mapping[str, Any]) -> None:
        """Append the report to boots.jsonl and count the boot in the manifest.

        One write() of one line in append mode: concurrent appenders on a local or
        POSIX filesystem do not interleave within a line this short.
        """
        line = json.dumps(report, sort_keys=True, separators=(",", ":")) + "\n"
        # The key directory is made by touch(); if it is gone (the volume was unmounted or
        # wiped meanwhile), do not recreate it on whatever is now at that path.
        with open(self.boots_path, "a+b") as handle:
            if handle.seek(0, os.SEEK_END) > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":  # a line cut short by a killed writer: end it first
                    line = "\n" + line
            handle.write(line.encode())
        manifest = self.manifest()
        if manifest is None:
            manifest = self._fresh_manifest()  # counts the boot just appended
        else:
            manifest["boot_count"] = int(manifest.get("boot_count", 0)) + 1
        manifest["last_used"] = now_iso()
        if report.get("ready_s") is not None:
            manifest["last_ready_s"] = report["ready_s"]
            manifest["last_verdict"] = report.get("verdict")
            if not report.get("error"):
                manifest["last_success"] = manifest["last_used"]
        write_json_atomic(self.manifest_path, manifest)


def parse_boot_lines(text: str) -> tuple[list[dict[str, Any]], int]:
    """boots.jsonl's reports, and how many lines were unreadable (a worker killed mid-write)."""
    boots: list[dict[str, Any]] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(record, dict):
            boots.append(record)
        else:
            bad += 1
    return boots, bad
