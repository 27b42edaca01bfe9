"""Boots in progress and serving workers: one small marker file per worker, so that `gc` never
removes a key being booted or served.

A boot writes `<volume>/warmstart/booting/<worker>.json` (`{"key", "host", "pid", "expires",
"state"}`) before it touches the key's directory. `serve` rewrites it with state "serving" once
its report is recorded and renews it while it serves (worker/upkeep.py), so a worker that has
served for days still holds its key; it is removed at exit. It lives
outside the key directory on purpose: `gc` moves a whole key directory aside in one rename,
and the marker must survive that to be seen by the re-check after it (trash.py). A marker expires
after the longest a boot may take (`ttl_s`), its age read on the volume's clock: its file's
mtime (a rewrite, as the serving worker's renewal, moves it) against that of a file created on
the volume when it is read, never the writer's `expires`, so hosts whose clocks disagree by more
than the TTL neither keep a dead worker's key nor take a live one's. One left by a killed
process on this machine (its pid namespace) is dead at once.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .backend import machine_id, process_gone, volume_now
from .history import read_json, write_json_atomic
from .layout import VolumeLayout

BOOTING_DIR = "booting"
MarkerState = Literal["booting", "serving"]


@dataclass(frozen=True)
class BootMarker:
    """A boot in progress: written before the boot touches its key, removed once it is recorded."""

    path: Path
    key: str
    host: str
    pid: int
    expires: float
    state: MarkerState = "booting"
    machine: str = ""  # backend.machine_id() of the writer: boot id and pid namespace
    ttl_s: float | None = None  # None: a marker written before its TTL was recorded
    age_s: float | None = None  # since it was written or renewed, on the volume's clock, when read

    def live(self, at: float | None = None) -> bool:
        """Not expired (its age on the volume's clock within its TTL; an old marker's `expires`,
        against `at`), and (on this machine) its process still runs."""
        if self.ttl_s is not None and self.age_s is not None:
            if self.age_s > self.ttl_s:
                return False
        elif self.expires < (time.time() if at is None else at):
            return False
        # Its process is known gone only in its own pid namespace of its machine (not by hostname).
        return not process_gone({"machine": self.machine, "pid": self.pid})


def booting_dir(layout: VolumeLayout) -> Path:
    return layout.warmstart_dir / BOOTING_DIR


def write_boot_marker(
    layout: VolumeLayout,
    key: str,
    worker: str,
    ttl_s: float,
    *,
    model: str | None = None,
    revision: str | None = None,
    state: MarkerState = "booting",
) -> Path:
    """Say on the volume that `worker` is booting (or serving) `key` (from that model snapshot)
    until `ttl_s` from now. Atomic: a half-written marker would protect nothing."""
    path = booting_dir(layout) / f"{worker}.json"
    data = {"key": key, "host": socket.gethostname(), "machine": machine_id(), "pid": os.getpid(), "ttl_s": ttl_s}
    data["expires"] = time.time() + ttl_s  # for people and older readers: the file's age decides
    write_json_atomic(path, {**data, "model": model, "revision": revision, "state": state})
    return path


def read_boot_markers(layout: VolumeLayout, warnings: list[str] | None = None) -> list[BootMarker]:
    markers = []
    directory = booting_dir(layout)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    names = [n for n in names if n.endswith(".json") and not n.startswith(".")]
    # Now on the volume's clock, once; where nothing can be created (read-only), this machine's.
    t = (volume_now(directory) or time.time()) if names else 0.0
    for name in names:
        data = read_json(directory / name)
        try:
            assert isinstance(data, dict)
            ttl = data.get("ttl_s")
            markers.append(
                BootMarker(
                    directory / name,
                    str(data["key"]),
                    str(data["host"]),
                    int(data["pid"]),
                    float(data["expires"]),
                    "serving" if data.get("state") == "serving" else "booting",
                    str(data.get("machine", "")),
                    float(ttl) if isinstance(ttl, (int, float)) else None,
                    _age(directory / name, t),
                )
            )
        except (AssertionError, KeyError, TypeError, ValueError):
            if warnings is not None:
                warnings.append(f"{directory / name}: unreadable boot marker (ignored)")
    return markers


def _age(path: Path, t: float) -> float | None:
    try:
        return t - path.stat().st_mtime
    except OSError:
        return None


def live_boot_keys(layout: VolumeLayout) -> set[str]:
    return {m.key for m in read_boot_markers(layout) if m.live()}
