"""`warmstart gc`: plan which keys (and HF snapshots) to remove, then remove them safely.

Scan -> plan -> `execute()`, as in huggingface_hub's cache manager: `plan_gc` only reads,
so `gc --dry-run` costs nothing and shows exactly what `execute` would do.

What is never removed: a key with a boot in progress (a live marker under
`warmstart/booting/`, see scan.py), a live publish lease, or a live restore registration;
and an HF snapshot that a kept key, or a boot in progress, uses.

Order, so that the volume is consistent after every step (a gc killed anywhere leaves a
volume the next boot and the next `ls` read without error):

1. Leftovers of an earlier, killed gc under `warmstart/trash/` are deleted.
2. Each key is moved out of `warmstart/keys/` in one `rename()` into `warmstart/trash/`, checked
   again, and deleted only if still unused, else given back (`store.trash`): a key is either
   wholly present or gone, never half-deleted where a boot could find it.
3. HF snapshots go through huggingface_hub's `DeleteCacheStrategy`, which removes snapshot
   links and refs before the blobs they point to.
4. Kept staged keys get the staged store's own garbage collection (`store.bundlegc`: old generations first,
   then unreferenced bundles) under the key's publish lease, which publishers also take.
5. Expired boot markers are removed.

Each step fails alone: an error in one (a key, the snapshots, a staged store, the markers) is
recorded in the result and the next step runs. `warmstart gc` plans again after its
confirmation prompt and removes only what was confirmed and is still unused (`plan_gc(within=)`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import log
from ..errors import StoreUnavailable
from ..limits import LEASE_TTL_S
from .layout import VolumeLayout
from .markers import read_boot_markers
from .scan import TRASH_DIR, KeyInfo, ModelInfo, VolumeScan, scan_volume
from .trash import LATE, empty_trash, remove_key

DAY_S = 86400.0


def parse_size(text: str) -> int:
    """'500G', '1.5TB', '800MiB', '123' (bytes) -> bytes. Decimal units, as Runpod bills."""
    raw = text.strip().upper().replace(" ", "")
    units = {
        "": 1,
        "B": 1,
        "K": 10**3,
        "KB": 10**3,
        "M": 10**6,
        "MB": 10**6,
        "G": 10**9,
        "GB": 10**9,
        "T": 10**12,
        "TB": 10**12,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
    }
    number = raw.rstrip("KMGTIB")
    unit = raw[len(number) :]
    if unit not in units or not number:
        raise ValueError(f"{text!r}: expected a size such as 500G, 1.5TB or 800MiB")
    return int(float(number) * units[unit])


def _age_s(iso: str | None, at: float) -> float | None:
    if not iso:
        return None
    try:
        stamp = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return at - stamp.timestamp()


@dataclass(frozen=True)
class GcOptions:
    older_than_days: float | None = None
    keep_last: int | None = None
    max_bytes: int | None = None
    models: bool = False
    grace_s: float = 600.0  # an HF snapshot written this recently may be a download in progress


@dataclass(frozen=True)
class StagedGarbage:
    key: str
    generations: tuple[str, ...]
    bundles: tuple[str, ...]
    temporaries: tuple[str, ...]
    bytes: int


@dataclass(frozen=True)
class GcPlan:
    """What a gc will remove and why the rest stays. Immutable; `execute()` carries it out."""

    layout: VolumeLayout
    remove_keys: tuple[KeyInfo, ...]
    remove_models: tuple[ModelInfo, ...]
    kept_because: dict[str, str]
    staged_garbage: tuple[StagedGarbage, ...]
    trash_bytes: int
    models_freed_bytes: int
    hf_strategy: Any = field(default=None, repr=False, compare=False)  # huggingface_hub DeleteCacheStrategy

    @property
    def freed_bytes(self) -> int:
        return (
            sum(k.bytes for k in self.remove_keys)
            + self.models_freed_bytes
            + sum(g.bytes for g in self.staged_garbage)
            + self.trash_bytes
        )

    def to_json(self, *, dry_run: bool, removed: Iterable[str] | None = None) -> dict[str, Any]:
        keys = [k.name for k in self.remove_keys] if removed is None else list(removed)
        return {
            "dry_run": dry_run,
            "removed_keys": keys,
            "removed_models": [f"{m.name}@{m.revision}" for m in self.remove_models],
            "freed_bytes": self.freed_bytes,
            "kept_because": dict(self.kept_because),
            "staged_garbage": [
                {"key": g.key, "generations": list(g.generations), "bundles": list(g.bundles), "bytes": g.bytes}
                for g in self.staged_garbage
                if g.generations or g.bundles or g.temporaries
            ],
            "trash_bytes": self.trash_bytes,
        }

    def execute(self, *, on_step: Callable[[str], None] | None = None, ttl_s: float = LEASE_TTL_S) -> GcResult:
        """Remove what the plan names, in the order that keeps the volume consistent.

        `on_step` is called before each step with its description (tests use it to stop a gc
        at every step boundary, as a kill would)."""
        step = on_step or (lambda _: None)
        removed: list[str] = []
        kept_late: dict[str, str] = {}
        errors: list[str] = []
        trash = self.layout.warmstart_dir / TRASH_DIR

        def alone(what: str, action: Callable[[], Any]) -> Any:
            try:
                return action()
            except Exception as exc:  # one step's failure must not stop the others
                errors.append(f"{what}: {exc}")
                return None

        step("trash")
        alone("emptying the trash", lambda: empty_trash(trash))
        for key in self.remove_keys:
            step(f"key {key.name}")
            outcome = alone(f"key {key.name}", lambda key=key: remove_key(self.layout, key, trash, step))
            if outcome is True:
                removed.append(key.name)
            elif outcome is not None:
                kept_late[key.name] = outcome if isinstance(outcome, str) else LATE
        if self.hf_strategy is not None and self.remove_models:
            step("models")
            alone("HF snapshots", self.hf_strategy.execute)
        for garbage in self.staged_garbage:
            step(f"staged {garbage.key}")
            alone(f"staged store of {garbage.key}", lambda g=garbage: _collect_staged(self.layout, g.key, ttl_s))
        step("markers")
        alone("boot markers", lambda: _remove_dead_markers(self.layout))
        return GcResult(tuple(removed), kept_late, tuple(errors))


def _remove_dead_markers(layout: VolumeLayout) -> None:
    for marker in read_boot_markers(layout):
        if not marker.live():
            try:
                marker.path.unlink()
            except FileNotFoundError:
                pass


@dataclass(frozen=True)
class GcResult:
    removed_keys: tuple[str, ...]
    kept_late: dict[str, str]  # keys the plan named that turned out to be in use
    errors: tuple[str, ...] = ()  # steps that failed (each alone: the others ran)

    def to_json(self, plan: GcPlan) -> dict[str, Any]:
        """`plan.to_json` as carried out: what was removed, what turned out in use, what failed."""
        data = plan.to_json(dry_run=False, removed=self.removed_keys)
        data["kept_because"].update(self.kept_late)
        data["freed_bytes"] -= sum(k.bytes for k in plan.remove_keys if k.name in self.kept_late)
        if self.errors:
            data["errors"] = list(self.errors)
        return data


def _staged_plan(layout: VolumeLayout, key: str, ttl_s: float) -> StagedGarbage | None:
    from .bundlegc import collect_garbage
    from .volume import StagedStore

    store = StagedStore(layout.key_dir(key) / "staged")
    if not store.root.is_dir():
        return None
    plan = collect_garbage(store, ttl_s=ttl_s)
    size = 0
    for path in (
        [store.generations_dir / n for n in plan.generations]
        + [store.bundles / n for n in plan.bundles]
        + [store.root / n for n in plan.temporaries]
    ):
        try:
            size += path.stat().st_size
        except OSError:
            pass
    return StagedGarbage(key, plan.generations, plan.bundles, plan.temporaries, size)


def _collect_staged(layout: VolumeLayout, key: str, ttl_s: float) -> None:
    """The staged store's own collector, under the key's publish lease (skipped while a publisher holds it)."""
    from .backend import worker_id
    from .bundlegc import collect_garbage
    from .volume import PublishLease, StagedStore

    store = StagedStore(layout.key_dir(key) / "staged")
    if not store.root.is_dir():
        return
    lease = PublishLease(store, f"gc-{worker_id()}", ttl_s=ttl_s)
    if not lease.try_acquire():
        return
    try:
        collect_garbage(store, ttl_s=ttl_s).execute(store)
    finally:
        lease.release()


def _sort_newest_first(keys: Iterable[KeyInfo], at: float) -> list[KeyInfo]:
    """By last *successful* use: a key whose boots never reached ready is not "recently used" (a failed
    boot touches the manifest too), so it sorts after every key that once served."""

    def age(k: KeyInfo) -> float:
        a = _age_s(k.last_success, at)
        return a if a is not None else float("inf")

    return sorted(keys, key=lambda k: (age(k), k.name))


def plan_gc(
    scan: VolumeScan,
    options: GcOptions,
    *,
    at: float | None = None,
    ttl_s: float = LEASE_TTL_S,
    within: GcPlan | None = None,
) -> GcPlan:
    """Decide; change nothing. `within`: the plan a person confirmed; remove nothing it did not
    name (what the new scan finds in use since, it keeps)."""
    at = time.time() if at is None else at
    ordered = _sort_newest_first(scan.keys, at)
    kept: dict[str, str] = {}
    protected: set[str] = set()
    if options.keep_last is not None:
        for k in ordered[: options.keep_last]:
            protected.add(k.name)
            kept[k.name] = f"among the {options.keep_last} most recently used key(s) (last boot that reached ready)"
    selected: set[str] = set()
    selective = options.older_than_days is not None or options.max_bytes is not None
    if options.older_than_days is not None:
        limit = options.older_than_days * DAY_S
        for k in ordered:
            age = _age_s(k.last_used, at)
            if age is None or age > limit:
                selected.add(k.name)
            elif k.name not in kept:
                kept[k.name] = f"used {age / DAY_S:.1f} day(s) ago, within {options.older_than_days:g}"
    if options.max_bytes is not None:
        total = scan.total_bytes
        for k in reversed(ordered):  # oldest first
            if total <= options.max_bytes:
                break
            if k.name in protected or k.in_use:
                continue
            selected.add(k.name)
            total -= k.bytes
        for k in ordered:
            if k.name not in selected and k.name not in kept:
                kept[k.name] = f"the volume fits in {options.max_bytes} bytes without removing it"
    if not selective and options.keep_last is not None:
        selected = {k.name for k in ordered}
    for k in ordered:
        if k.name not in selected and k.name not in kept:
            kept[k.name] = "no option selects it (give --older-than, --keep-last or --max-bytes)"
    remove: list[KeyInfo] = []
    for k in ordered:
        if k.name not in selected or k.name in protected:
            continue
        if k.in_use:
            kept[k.name] = "in use: " + "; ".join(k.in_use)
            continue
        if within is not None and k.name not in {c.name for c in within.remove_keys}:
            kept[k.name] = "not in the plan that was confirmed"
            continue
        remove.append(k)
    removed_names = {k.name for k in remove}
    # A boot in progress may not have made its key directory yet: its marker names its model.
    live_models = {(m.get("model"), m.get("revision")) for m in _live_marker_models(scan)}
    remove_models: list[ModelInfo] = []
    strategy = None
    freed_models = 0
    if options.models:
        for model in scan.models:
            label = f"{model.name}@{model.revision}"
            users = [k for k in model.keys if k not in removed_names]
            if users:
                kept[label] = f"used by kept key(s): {', '.join(users)}"
            elif (model.name, model.revision) in live_models:
                kept[label] = "a boot in progress uses it"
            elif at - model.last_modified < options.grace_s:
                kept[label] = f"written in the last {options.grace_s:g} s (a download may be in progress)"
            elif within is not None and (model.name, model.revision) not in {
                (c.name, c.revision) for c in within.remove_models
            }:
                kept[label] = "not in the plan that was confirmed"
            else:
                remove_models.append(model)
        if remove_models and scan.hf_cache_info is not None:
            strategy = scan.hf_cache_info.delete_revisions(*(m.revision for m in remove_models))
            freed_models = int(strategy.expected_freed_size)
    garbage = []
    for k in ordered:
        if k.name in removed_names:
            continue
        g = _staged_plan(scan.layout, k.name, ttl_s)
        if g is not None and (g.generations or g.bundles or g.temporaries):
            garbage.append(g)
    return GcPlan(
        scan.layout,
        tuple(remove),
        tuple(remove_models),
        kept,
        tuple(garbage),
        scan.trash_bytes,
        freed_models,
        strategy,
    )


def _live_marker_models(scan: VolumeScan) -> list[dict[str, Any]]:
    from .history import read_json

    out = []
    for marker in scan.booting:
        if marker.live():
            data = read_json(marker.path)
            if isinstance(data, dict):
                out.append(data)
    return out


def plan_or_say(layout: VolumeLayout, options: GcOptions, ttl_s: float, within: GcPlan | None = None) -> GcPlan | None:
    """`plan_gc` on a fresh scan; None, said in one line, when a key's store cannot be read (its
    readers/ cannot be listed, say): who reads what is then unknown, so nothing may be deleted."""
    try:
        return plan_gc(scan_volume(layout), options, ttl_s=ttl_s, within=within)
    except StoreUnavailable as exc:
        log.error("gc", "%s; nothing was deleted (fix or remove that folder, then run gc again)", exc)
        return None
