"""While serving: keep the key marked in use, and publish what vLLM compiles after ready.

A worker serves for hours or days. Without upkeep its boot marker goes at ready and the key's
`last_used` stays at the boot, so `gc --older-than`/`--keep-last` sees an idle key and removes
it; and the kernels vLLM compiles on first sight of a shape while serving (Triton's JIT: vLLM
0.19+ warns `Triton kernel JIT compilation during inference: <kernel>`, utils/jit_monitor.py)
reach the store only at a clean exit: never after a SIGKILL, and every later worker compiles
them again.

One daemon thread. Every `interval_s` (WARMSTART_SERVE_PUBLISH_S), and soon after vLLM's JIT
warning, it
- renews the serving marker (warmstart/booting/<worker>.json, state "serving", store/markers.py)
  and, hourly, the key's `last_used` (on a timer of its own, every third of the marker's TTL: a
  publish may outlast the TTL);
- looks for new or changed cache files: a walk of the cache directories that compares (path,
  size, mtime) with what the last publish saw, stat calls only, no reads;
- publishes when something changed, never two at a time, and at least `interval_s` after the
  previous publish began. The first publish (right after ready) runs at once.
`final()` (every exit the worker controls: SIGTERM, exit 3 after vLLM died) publishes once more
if anything changed, gives back a lease a cut-off publish still holds, and removes the marker.
The served report follows: each publish and each JIT warning replaces it with a new `BootReport`
(report/serving.py), serialized once for the fronts to serve (`served_report`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import log
from ..boot import Boot
from ..report.model import BootReport
from ..report.serving import with_kernels, with_publish
from ..store.bundle import is_temporary, layer_of
from ..store.markers import write_boot_marker
from ..store.tiers import release_leases
from ..tree import scan_tree

JIT_WARNING = "JIT compilation during inference: "  # vLLM's utils/jit_monitor.py, 0.19 and later
JIT_SETTLE_S = 2.0  # after the warning, before looking: the compiler writes its files after it logs
MARKER_TTL_S = 900.0  # a serving marker a killed worker on another host left expires after this
TOUCH_S = 3600.0  # how often the key's last_used is renewed while serving
RENEW_OFF_S = 60.0  # with the periodic publish off: how often the marker is still renewed
FINAL_JOIN_S = 15.0  # at exit: how long a publish in flight may still take

Snapshot = Mapping[str, tuple[int, int]]


def cache_snapshot(boot: Boot) -> dict[str, tuple[int, int]]:
    """Every file of every cache layer with its (size, mtime_ns): what a publish would look at, so a
    writer's temporary file (store/bundle.py is_temporary), which no publish takes, is left out."""
    out: dict[str, tuple[int, int]] = {}
    for name, path in boot.plan.cache_dirs.layers().items():
        for rel, stat in scan_tree(path).files.items():
            if not is_temporary(rel):
                out[f"{name}/{rel}"] = stat
    return out


def changed(before: Snapshot | None, now: Snapshot) -> bool:
    """Files that appeared or whose size or mtime moved since `before` (removals do not count:
    a publish adds, it never takes away)."""
    if before is None:
        return True
    return any(before.get(rel) != stat for rel, stat in now.items())


class ServingUpkeep:
    """The serving worker's periodic publish and in-use marker (see the module's docstring)."""

    def __init__(
        self,
        boot: Boot,
        report: BootReport,
        *,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.boot = boot
        self.report = report  # replaced, never changed: a publish and a JIT warning each make a new one
        self._served = report.to_dict()
        self._report_lock = threading.Lock()  # the log reader's thread and the publishing one both update it
        self.interval_s = interval_s
        self.clock = clock
        self.kernels: list[str] = []  # vLLM's JIT warnings since ready
        self.publishes = 0
        self._published_snapshot: Snapshot | None = None
        self._last_publish: float | None = None
        self._last_touch = clock()
        self._publishing = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._due: float | None = None  # a JIT warning asked for a look at this time
        self._thread = threading.Thread(target=self._run, name="warmstart-upkeep", daemon=True)
        # The marker's own timer: a publish may take longer than the marker's TTL (a slow volume, the
        # S3 deadline, a lease wait), and gc must never take a served key for an idle one meanwhile.
        self._marker_thread = threading.Thread(target=self._renew_marker, name="warmstart-marker", daemon=True)

    def served_report(self) -> dict[str, Any]:
        """The boot report as served (the boot report job, `GET /warmstart/boot_report`): the latest one."""
        return self._served

    def _update_report(self, update: Callable[[BootReport], BootReport]) -> None:
        with self._report_lock:
            self.report = update(self.report)
            self._served = self.report.to_dict()

    @property
    def staged(self) -> bool:
        return bool(self.boot.plan.tiers)

    def start(self) -> None:
        self.mark_serving()
        self._marker_thread.start()
        self._thread.start()

    @property
    def marker_ttl_s(self) -> float:
        return max(MARKER_TTL_S, 3 * self.interval_s)

    def _renew_marker(self) -> None:
        """Renew the serving marker every third of its TTL (and at most every `renew_s`), whatever
        the publishing thread is doing."""
        while not self._stop.wait(min(self.renew_s, self.marker_ttl_s / 3)):
            self.mark_serving()

    # ------------------------------------------------------------------ vLLM's log

    def on_line(self, text: str) -> None:
        """Called for each line of vLLM's output after ready: count JIT warnings, ask for a look."""
        at = text.find(JIT_WARNING)
        if at < 0:
            return
        kernel = text[at + len(JIT_WARNING) :].split(". This causes", 1)[0].split(" (", 1)[0].strip()
        self.kernels.append(kernel)
        self._update_report(lambda report: with_kernels(report, self.kernels))
        self._due = self.clock() + JIT_SETTLE_S
        self._wake.set()

    # ------------------------------------------------------------------ the marker

    def mark_serving(self) -> None:
        plan = self.boot.plan
        try:
            self.boot.marker = write_boot_marker(
                plan.layout,
                plan.key.dirname,
                self.boot.worker,
                self.marker_ttl_s,
                model=plan.model.repo_id,
                revision=plan.model.revision,
                state="serving",
            )
        except OSError as exc:
            log.warning("store", "could not mark the key in use on the volume: %s", exc)
        if self.clock() - self._last_touch >= TOUCH_S and self.boot.store is not None:
            self._last_touch = self.clock()
            try:
                self.boot.store.touch()
            except OSError as exc:
                log.warning("store", "could not renew the key's last use on the volume: %s", exc)

    # ------------------------------------------------------------------ publishing

    def publish_if_changed(self, *, wait_s: float | None = None, force: bool = False) -> bool:
        """One publish if the caches changed since the last one; False if nothing was done (no
        change, or another publish runs)."""
        if not self.staged or not self._publishing.acquire(blocking=False):
            return False
        try:
            snapshot = cache_snapshot(self.boot)  # before the publish: what lands during it is new next time
            if not force and not changed(self._published_snapshot, snapshot):
                return False
            self._last_publish = self.clock()
            try:
                self.boot.publish(wait_s=wait_s)
            except Exception as exc:  # a store's failure must never fail serving
                log.warning("publish", "publish while serving failed: %s", self.boot.redactor.text(str(exc)))
                return False
            if not self._retry_later():
                # What a publish left out (still open for writing) is new at the next look, even
                # if it is closed without another byte: it was not published.
                left = self._left_out()
                self._published_snapshot = {k: v for k, v in snapshot.items() if k not in left}
            self.publishes += 1
            boot = self.boot
            self._update_report(lambda report: with_publish(report, boot.plan, boot.restored, boot.published))
            return True
        finally:
            self._publishing.release()

    def _left_out(self) -> set[str]:
        """The snapshot's names (`<layer>/<path>`) of the files the latest publish left out."""
        results = self.boot.published.results if self.boot.published else ()
        out = set()
        for rel in (p for r in results for p in r.left_out):
            layer = layer_of(rel)
            if layer is not None:
                out.add(f"{layer}/{rel.partition('/')[2]}")
        return out

    def _retry_later(self) -> bool:
        """A tier failed, or skipped because another worker held its lease: what this one saw
        counts as new again at the next look."""
        results = self.boot.published.results if self.boot.published else ()
        return any(r.status == "failed" or (r.status == "skipped" and "lease" in r.detail) for r in results)

    @property
    def renew_s(self) -> float:
        """How often the marker is renewed (and the caches looked at, when publishing is on)."""
        return self.interval_s if self.interval_s > 0 else RENEW_OFF_S

    def _next_look(self) -> float:
        """Seconds until the next look: the interval, or sooner when a JIT warning is pending,
        but never sooner than `interval_s` after the previous publish began."""
        now = self.clock()
        target = now + self.renew_s
        if self._due is not None and self.interval_s > 0:
            target = min(target, self._due)
            if self._last_publish is not None:
                target = max(target, self._last_publish + self.interval_s)
        return max(0.0, target - now)

    def _publish_allowed(self) -> bool:
        if self.interval_s <= 0:
            return False
        return self._last_publish is None or self.clock() - self._last_publish >= self.interval_s - 0.05

    def _run(self) -> None:
        if self.staged:
            self.publish_if_changed(force=True)  # right after ready, without holding jobs back
        while not self._stop.is_set():
            self._wake.wait(self._next_look())
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._due is not None and self.clock() < self._due - 0.05:
                continue  # a JIT warning arrived: look once its files had time to land
            self._due = None
            if self._publish_allowed():
                self.publish_if_changed()

    # ------------------------------------------------------------------ exit

    def final(self) -> None:
        """At an exit the worker controls, after vLLM's group was stopped: let a publish in flight
        finish (briefly), publish what is still new, give back the lease, remove the marker."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(FINAL_JOIN_S)
        if self._marker_thread.is_alive():
            self._marker_thread.join(5.0)
        if self._thread.is_alive():
            # It dies with the process, before its own `finally` gives the lease back: do it here.
            log.warning("publish", "the publish while serving is still running; no final publish")
            plan = self.boot.plan
            release_leases(plan.tiers, holder=self.boot.worker, ttl_s=plan.settings.lease_ttl_s)
        elif self.staged and not self.publish_if_changed(wait_s=10.0):
            log.info("publish", "no cache file is new since the last publish: nothing to publish at exit")
        if self.kernels:
            log.info("serving", "vLLM JIT-compiled %d kernel(s) while serving", len(self.kernels))
        self.boot.unmark_booting()
