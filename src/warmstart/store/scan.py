"""What is on the volume: every key, every HF snapshot, what each costs, and who is using it.

`scan_volume` reads the volume once and returns frozen dataclasses (the shape of
huggingface_hub's `scan_cache_dir`): one `KeyInfo` per key directory, one `ModelInfo` per
HF snapshot, and the live users of each key (boots in progress, publish leases, restores).
It never changes anything, so `warmstart ls` is safe on a volume that workers are using. A
damaged entry (an unreadable manifest, a bad history line, a corrupt HF repo) becomes a
warning on the scan and the scan goes on: one bad key must not hide the others.

Boots in progress are read from their markers (`store.markers`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..tree import scan_tree
from .backend import volume_now
from .bundlegc import registration_live
from .history import parse_boot_lines, read_json
from .layout import VolumeLayout
from .markers import BootMarker, read_boot_markers
from .volume import PublishLease, StagedStore

CacheMode = Literal["staged", "direct"]  # WARMSTART_CACHE_MODE
TRASH_DIR = "trash"


# Runpod network volumes: $0.07 per GB per month for the first 1 TB, $0.05 above
# (https://docs.runpod.io/get-started/billing-information, "Network volume billing").
RUNPOD_PRICE_GB_MONTH = 0.07
RUNPOD_PRICE_GB_MONTH_OVER_1TB = 0.05
TB = 1000  # GB, decimal as in Runpod's price list


def monthly_cost(total_bytes: int, rate: float | None = None) -> float:
    """USD per month for `total_bytes`: Runpod's tiered price, or a flat `rate` per GB if given.

    Runpod bills a network volume by its provisioned size; this prices what the volume holds,
    which is what a cleanup can save."""
    gb = total_bytes / 1e9
    if rate is not None:
        return round(gb * rate, 4)
    low = min(gb, TB)
    return round(low * RUNPOD_PRICE_GB_MONTH + max(0.0, gb - TB) * RUNPOD_PRICE_GB_MONTH_OVER_1TB, 4)


def price_from_env(env: Mapping[str, str]) -> float | None:
    """WARMSTART_VOLUME_PRICE_GB_MONTH: a flat USD rate per GB and month (unset: Runpod's tiers)."""
    raw = env.get("WARMSTART_VOLUME_PRICE_GB_MONTH", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"WARMSTART_VOLUME_PRICE_GB_MONTH={raw!r}: expected a number (USD per GB and month)") from exc
    if value < 0:
        raise ValueError(f"WARMSTART_VOLUME_PRICE_GB_MONTH={raw!r}: must not be negative")
    return value


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class KeyInfo:
    """One key directory: what it is (from its manifest), what it holds, how its boots went."""

    name: str
    path: Path
    model: str | None
    revision: str | None
    hardware: str | None
    vllm: str | None
    mode: CacheMode | None  # None: never booted to a report, and no cache of either mode
    factors: Mapping[str, Any]
    bytes_by_kind: Mapping[str, int]  # bundles, generations, cache, records, other
    generations: int
    boots: int  # lines in boots.jsonl
    verdicts: Mapping[str, int]  # cold / partial / warm / failed
    created: str | None
    last_used: str | None
    last_success: str | None  # when the newest boot that reached ready started: what "recently used" means
    last_verdict: str | None
    last_ready_s: float | None
    last_miss_reason: tuple[str, ...]
    in_use: tuple[str, ...]  # why it must not be removed now (empty: free to remove)
    history: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)
    distrusted: tuple[int, ...] = ()  # generations whose canary differed after a restore (canaryboot.py)

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_kind.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.name,
            "path": str(self.path),
            "model": self.model,
            "revision": self.revision,
            "hardware": self.hardware,
            "vllm": self.vllm,
            "mode": self.mode,
            "bytes": self.bytes,
            "bytes_by_kind": dict(self.bytes_by_kind),
            "generations": self.generations,
            "boots": self.boots,
            "verdicts": dict(self.verdicts),
            "created": self.created,
            "last_used": self.last_used,
            "last_success": self.last_success,
            "last_verdict": self.last_verdict,
            "last_ready_s": self.last_ready_s,
            "in_use": list(self.in_use),
            "distrusted": list(self.distrusted),
        }


def _tree_bytes(root: Path, warnings: list[str]) -> int:
    scan = scan_tree(root)
    warnings.extend(scan.warnings)
    return scan.bytes


def _key_bytes(path: Path, warnings: list[str]) -> dict[str, int]:
    kinds = {"bundles": 0, "generations": 0, "cache": 0, "records": 0, "other": 0}
    try:
        entries = list(os.scandir(path))
    except OSError as exc:
        warnings.append(f"{path}: {exc.strerror or exc}")
        return kinds
    for entry in entries:
        try:
            if entry.name == "staged" and entry.is_dir(follow_symlinks=False):
                kinds["bundles"] += _tree_bytes(Path(entry.path) / "bundles", warnings)
                kinds["generations"] += _tree_bytes(Path(entry.path) / "generations", warnings)
                other = _tree_bytes(Path(entry.path), warnings)
                kinds["other"] += other - kinds["bundles"] - kinds["generations"]
            elif entry.name == "cache" and entry.is_dir(follow_symlinks=False):
                kinds["cache"] += _tree_bytes(Path(entry.path), warnings)
            elif entry.is_file(follow_symlinks=False):
                size = entry.stat(follow_symlinks=False).st_size
                kinds["records" if entry.name in ("manifest.json", "boots.jsonl") else "other"] += size
            elif entry.is_dir(follow_symlinks=False):
                kinds["other"] += _tree_bytes(Path(entry.path), warnings)
        except OSError as exc:
            warnings.append(f"{entry.path}: {exc.strerror or exc}")
    return kinds


def read_history(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """boots.jsonl's reports; damaged lines are counted in a warning and skipped."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        warnings.append(f"{path}: {exc.strerror or exc}")
        return []
    boots, bad = parse_boot_lines(text)
    if bad:
        warnings.append(f"{path}: skipped {bad} unreadable line(s)")
    return boots


def _hardware_slug(hw: Any) -> str | None:
    if not isinstance(hw, Mapping):
        return None
    if hw.get("kind") == "gpu":
        return f"{hw.get('count', 1)}x {hw.get('name')} (sm {hw.get('capability')})"
    return f"cpu {hw.get('name')} {hw.get('capability')}"


def _generation_count(path: Path) -> int:
    try:
        names = os.listdir(path / "staged" / "generations")
    except OSError:
        return 0
    return sum(1 for n in names if n.startswith("g") and n.endswith(".json"))


def _staged_in_use(path: Path) -> list[str]:
    """A live publish lease or restore registration under the key's staged store."""
    store = StagedStore(path / "staged")
    reasons = []
    if store.lease_path.exists() and PublishLease(store, "scan").is_live():
        reasons.append("a worker holds its publish lease")
    try:
        registrations = list(store.readers.glob("*.json"))
    except OSError:
        registrations = []
    # A registration's age on the volume's clock decides (garbage.registration_live), not its writer's.
    t = (volume_now(store.root) or time.time()) if registrations else 0.0
    for reg in registrations:
        data = read_json(reg)
        try:
            age = t - reg.stat().st_mtime
        except OSError:
            continue
        if isinstance(data, dict) and registration_live(data, age):
            reasons.append(f"a worker is restoring generation {data.get('generation')}")
            break
    return reasons


def scan_key(
    path: Path, booting: Iterable[str], warnings: list[str], at: float | None = None, *, name: str | None = None
) -> KeyInfo:
    """One key directory. `name` is the key's name when `path` is not (a key gc moved aside)."""
    at = time.time() if at is None else at
    name = name or path.name
    manifest = read_json(path / "manifest.json")
    if manifest is not None and not isinstance(manifest, dict):
        manifest = None
    if manifest is None and (path / "manifest.json").exists():
        warnings.append(f"{path / 'manifest.json'}: unreadable manifest")
    manifest = manifest or {}
    history = read_history(path / "boots.jsonl", warnings)
    factors = manifest.get("factors") if isinstance(manifest.get("factors"), dict) else {}
    last_report = history[-1] if history else {}
    if not factors and isinstance(last_report.get("observed"), dict):
        factors = last_report["observed"].get("key_factors") or {}
    engine = factors.get("engine") if isinstance(factors.get("engine"), dict) else {}
    verdicts = {"cold": 0, "partial": 0, "warm": 0, "failed": 0}
    for boot in history:
        verdict = boot.get("verdict")
        if boot.get("error") or verdict is None:
            verdicts["failed"] += 1
        elif verdict in verdicts:
            verdicts[verdict] += 1
    last_good = next((b for b in reversed(history) if b.get("ready_s") is not None and not b.get("error")), None)
    in_use = []
    if name in set(booting):
        in_use.append("a boot of this key is in progress, or a worker serves it")
    in_use += _staged_in_use(path)
    reported = last_report.get("mode")
    mode: CacheMode | None = reported if reported in ("staged", "direct") else None
    if mode is None and (path / "staged").is_dir():
        mode = "staged"
    if mode is None and (path / "cache").is_dir():
        mode = "direct"
    return KeyInfo(
        name=name,
        path=path,
        model=factors.get("model") or (last_report.get("model") or {}).get("name"),
        revision=factors.get("revision") or (last_report.get("model") or {}).get("revision"),
        hardware=_hardware_slug(factors.get("hardware") or last_report.get("hardware")),
        vllm=engine.get("vllm") or last_report.get("vllm_version"),
        mode=mode,
        factors=factors,
        bytes_by_kind=_key_bytes(path, warnings),
        generations=_generation_count(path),
        distrusted=tuple(sorted(StagedStore(path / "staged").distrusted_numbers())),
        boots=len(history),
        verdicts=verdicts,
        created=manifest.get("created"),
        last_used=manifest.get("last_used") or last_report.get("started_at"),
        # The manifest's (written with each boot that reached ready); older manifests: the report's start.
        last_success=manifest.get("last_success") or (last_good or {}).get("started_at"),
        last_verdict=(last_good or {}).get("verdict") or manifest.get("last_verdict"),
        last_ready_s=(last_good or {}).get("ready_s"),
        last_miss_reason=tuple(last_report.get("miss_reason") or ()),
        in_use=tuple(in_use),
        history=tuple(history),
    )


# --------------------------------------------------------------------------- HF snapshots


@dataclass(frozen=True)
class ModelInfo:
    """One HF snapshot in the volume's hub cache, and the keys that were built from it."""

    name: str
    revision: str
    path: Path
    bytes: int  # blobs this snapshot links to (shared blobs counted in every snapshot)
    refs: tuple[str, ...]
    last_modified: float
    keys: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "revision": self.revision,
            "path": str(self.path),
            "bytes": self.bytes,
            "refs": list(self.refs),
            "keys": list(self.keys),
        }


def scan_models(hub_cache: Path, keys: Iterable[KeyInfo], warnings: list[str]) -> tuple[tuple[ModelInfo, ...], Any]:
    """HF snapshots via huggingface_hub's own cache scanner (corrupt repos are its warnings).
    Returns the models and huggingface_hub's HFCacheInfo (for a deletion plan), or None."""
    if not hub_cache.is_dir():
        return (), None
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(hub_cache)
    except (CacheNotFound, OSError) as exc:
        warnings.append(f"{hub_cache}: {exc}")
        return (), None
    for problem in info.warnings:
        warnings.append(f"hf cache: {problem}")
    users: dict[tuple[str, str], list[str]] = {}
    for key in keys:
        if key.model and key.revision:
            users.setdefault((key.model, key.revision), []).append(key.name)
    models = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: r.commit_hash):
            models.append(
                ModelInfo(
                    name=repo.repo_id,
                    revision=rev.commit_hash,
                    path=rev.snapshot_path,
                    bytes=rev.size_on_disk,
                    refs=tuple(sorted(rev.refs)),
                    last_modified=rev.last_modified,
                    keys=tuple(sorted(users.get((repo.repo_id, rev.commit_hash), []))),
                )
            )
    return tuple(models), info


# --------------------------------------------------------------------------- the volume


@dataclass(frozen=True)
class VolumeScan:
    """Everything `ls` shows; `gc` plans from it."""

    layout: VolumeLayout
    keys: tuple[KeyInfo, ...]
    models: tuple[ModelInfo, ...]
    trash_bytes: int  # key directories a killed gc moved aside but did not finish deleting
    booting: tuple[BootMarker, ...]
    warnings: tuple[str, ...]
    hf_cache_info: Any = field(default=None, repr=False, compare=False)  # huggingface_hub's HFCacheInfo

    @property
    def hf_bytes(self) -> int:
        return self.hf_cache_info.size_on_disk if self.hf_cache_info is not None else 0

    @property
    def total_bytes(self) -> int:
        return sum(k.bytes for k in self.keys) + self.hf_bytes + self.trash_bytes

    def key(self, name: str) -> KeyInfo | None:
        return next((k for k in self.keys if k.name == name), None)

    def to_json(self, rate: float | None = None) -> dict[str, Any]:
        return {
            "volume": str(self.layout.root),
            "keys": [k.to_json() for k in self.keys],
            "models": [m.to_json() for m in self.models],
            "keys_bytes": sum(k.bytes for k in self.keys),
            "hf_cache_bytes": self.hf_bytes,
            "trash_bytes": self.trash_bytes,
            "total_bytes": self.total_bytes,
            "monthly_cost_usd": monthly_cost(self.total_bytes, rate),
            "price": "flat" if rate is not None else "runpod",
            "price_gb_month": rate if rate is not None else RUNPOD_PRICE_GB_MONTH,
            "booting": [m.key for m in self.booting if m.live()],
            "warnings": list(self.warnings),
        }


def scan_volume(layout: VolumeLayout) -> VolumeScan:
    """Read the whole volume; change nothing."""
    warnings: list[str] = []
    at = time.time()
    markers = read_boot_markers(layout, warnings)
    booting = {m.key for m in markers if m.live(at)}
    keys = []
    try:
        names = sorted(os.listdir(layout.keys_dir))
    except FileNotFoundError:
        names = []
    except OSError as exc:
        warnings.append(f"{layout.keys_dir}: {exc.strerror or exc}")
        names = []
    for name in names:
        path = layout.keys_dir / name
        if name.startswith(".") or not path.is_dir():
            continue
        try:
            keys.append(scan_key(path, booting, warnings, at))
        except OSError as exc:  # vanished or unreadable mid-scan: skip it, say so
            warnings.append(f"{path}: {exc.strerror or exc}")
    models, info = scan_models(layout.hub_cache, keys, warnings)
    trash = _tree_bytes(layout.warmstart_dir / TRASH_DIR, warnings)
    return VolumeScan(layout, tuple(keys), models, trash, tuple(markers), tuple(warnings), info)
