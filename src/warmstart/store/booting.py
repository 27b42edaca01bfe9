"""Boots in progress and serving workers: one small marker file per worker, so that `gc` never
removes a key being booted or served.

A boot writes `<volume>/warmstart/booting/<worker>.json` (`{"key", "host", "pid", "expires",
"state"}`) before it touches the key's directory. `serve` rewrites it with state "serving" once
its report is recorded and renews it while it serves (worker/upkeep.py), so a worker that has
served for days still holds its key; it is removed at exit. It lives
outside the key directory on purpose: `gc` moves a whole key directory aside in one rename,
and the marker must survive that to be seen by the re-check after it (gc.py). A marker expires
after the longest a boot may take; one left by a killed process on this machine is dead at once.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from .backend import machine_id, process_gone
from .history import read_json, write_json_atomic
from .layout import VolumeLayout

BOOTING_DIR = "booting"


@dataclass(frozen=True)
class BootMarker:
    """A boot in progress: written before the boot touches its key, removed once it is recorded."""

    path: Path
    key: str
    host: str
    pid: int
    expires: float
    state: str = "booting"  # or "serving"
    machine: str = ""  # backend.machine_id() of the writer: boot id and pid namespace

    def live(self, at: float | None = None) -> bool:
        """Not expired, and (on this machine) its process still runs."""
        if self.expires < (time.time() if at is None else at):
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
    state: str = "booting",
) -> Path:
    """Say on the volume that `worker` is booting (or serving) `key` (from that model snapshot)
    until `ttl_s` from now. Atomic: a half-written marker would protect nothing."""
    path = booting_dir(layout) / f"{worker}.json"
    data = {"key": key, "host": socket.gethostname(), "machine": machine_id(), "pid": os.getpid()}
    data["expires"] = time.time() + ttl_s
    write_json_atomic(path, {**data, "model": model, "revision": revision, "state": state})
    return path


def read_boot_markers(layout: VolumeLayout, warnings: list[str] | None = None) -> list[BootMarker]:
    markers = []
    directory = booting_dir(layout)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        data = read_json(directory / name)
        try:
            assert isinstance(data, dict)
            markers.append(
                BootMarker(
                    directory / name,
                    str(data["key"]),
                    str(data["host"]),
                    int(data["pid"]),
                    float(data["expires"]),
                    str(data.get("state") or "booting"),
                    str(data.get("machine", "")),
                )
            )
        except (AssertionError, KeyError, TypeError, ValueError):
            if warnings is not None:
                warnings.append(f"{directory / name}: unreadable boot marker (ignored)")
    return markers


def live_boot_keys(layout: VolumeLayout) -> set[str]:
    return {m.key for m in read_boot_markers(layout) if m.live()}
