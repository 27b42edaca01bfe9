"""Where this boot's caches go: decided from the settings, what was found at the volume path, and the key.

Two steps, because the model is resolved between them: `place_volume` says where records and the
HF cache live (the volume, or local disk when there is none or it may not be written) before the
key exists; `place_caches` then says, for the key, where vLLM's cache directories are, whether a
staged store is read from the volume, whether the S3 store is opened, and why publishing to the
volume is blocked. Both are pure: the probes (`volume_found`, `probe_writable`, whether a read-only
volume holds generations) are passed in, so every case is a test of plain values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..key import CacheKey
from ..log import StageWarning
from ..settings import Settings
from .layout import CacheDirs, VolumeLayout, choose_layout, probe_writable

STAGED_DIR = "staged"  # under the key's directory: its bundles and generations (staged mode)


@dataclass(frozen=True)
class VolumePlace:
    """Where records and the HF cache go, and what the volume path held."""

    layout: VolumeLayout  # records, manifests and the HF cache (the volume, or local disk)
    read_only: VolumeLayout | None  # the mounted volume, when it may not be written to
    warnings: tuple[StageWarning, ...]

    @property
    def read_only_hubs(self) -> tuple[Path, ...]:
        """HF caches the model may be read from but not written to (Runpod's cached models)."""
        return (self.read_only.hub_cache,) if self.read_only is not None else ()


def place_volume(settings: Settings, *, mounted: bool, not_writable: str | None) -> VolumePlace:
    """`mounted`: the volume path is a directory; `not_writable`: why its warmstart directory
    cannot be written (None: it can; only asked when mounted)."""
    volume = VolumeLayout(settings.volume, on_volume=True)
    local = VolumeLayout(settings.local_cache_dir, on_volume=False)
    if mounted and not_writable is not None:
        # Runpod's cached models: the model is on a mount that warmstart may not write to. Use
        # the model from it; keep caches and records on local disk; publish nothing.
        message = (
            f"volume {volume.root} is not writable ({not_writable}): the model is read from it, caches stay on "
            f"local disk at {settings.local_cache_dir}, and nothing will be published"
            + (" to it (the S3 store still is)" if settings.s3_url and settings.cache_mode == "staged" else "")
        )
        return VolumePlace(local, volume, (StageWarning("volume", message),))
    if mounted:
        return VolumePlace(volume, None, ())
    message = f"no volume at {settings.volume}: caches go to {local.root} and will not outlive this worker"
    return VolumePlace(local, None, (StageWarning("volume", message),))


def probe_volume(settings: Settings, *, write: bool = True) -> VolumePlace:
    """`place_volume` with the probes run: is the volume mounted, and may it be written to. With
    `write=False` (`warmstart key`, which writes nothing) writability is judged without a probe file."""
    layout = choose_layout(settings.volume, settings.local_cache_dir)
    probe = probe_writable if write else judge_writable
    why = probe(layout.warmstart_dir) if layout.on_volume else None
    return place_volume(settings, mounted=layout.on_volume, not_writable=why)


def judge_writable(directory: Path) -> str | None:
    """None if `directory` (or the nearest folder above it that exists) looks writable, else why
    not: a read-only mount (statvfs), or no write permission. Writes nothing, so it can be wrong
    where only trying tells (a full volume); the boot itself tries (`probe_writable`)."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            return f"{existing}: read-only file system"
    except OSError as exc:
        return f"{existing}: {exc.strerror or exc}"
    if not os.access(existing, os.W_OK):
        return f"{existing}: permission denied"
    return None


@dataclass(frozen=True)
class Placement:
    """Where this key's caches live and which tiers this boot uses."""

    layout: VolumeLayout
    cache_dirs: CacheDirs  # what vLLM's cache variables point at
    staged_root: Path | None  # staged mode: the volume's store for the key (None: no volume tier)
    open_s3: bool  # staged mode with WARMSTART_S3_URL: open the S3 store as a tier
    publish_blocked: str | None  # why nothing may be published to the volume (read-only)
    warnings: tuple[StageWarning, ...]


def place_caches(
    settings: Settings,
    volume: VolumePlace,
    key: CacheKey | str,
    *,
    has_generations: Callable[[Path], bool] = lambda root: (root / "generations").is_dir(),
    image: bool = False,
) -> Placement:
    """Direct mode: the caches are the key's directories under the layout. Staged mode: they are on
    local disk, restored from and published to the volume's store (and the S3 store); a read-only
    volume's store is only read, and only if `has_generations` (a boot of it there published some).
    `image`: the image holds a generation of the key (store/image.py), a tier that needs no volume."""
    layout = volume.layout
    dirs = layout.cache_dirs(key)
    staged_root = None
    open_s3 = False
    warnings: list[StageWarning] = []
    if settings.cache_mode == "staged":
        local_dirs = VolumeLayout(settings.local_cache_dir, on_volume=False).cache_dirs(key)
        if layout.on_volume:
            # Caches live on local disk; the volume holds the key's published generations.
            staged_root = layout.key_dir(key) / STAGED_DIR
            dirs = local_dirs
        elif volume.read_only is not None:
            # Generations published to it earlier can still be restored (into local disk).
            if has_generations(volume.read_only.key_dir(key) / STAGED_DIR):
                staged_root = volume.read_only.key_dir(key) / STAGED_DIR
            dirs = local_dirs
        if settings.s3_url:
            open_s3 = True
            dirs = local_dirs
        elif not layout.on_volume and volume.read_only is None and not image:
            warnings.append(
                StageWarning(
                    "cache", "WARMSTART_CACHE_MODE=staged needs a volume or WARMSTART_S3_URL: caches stay local"
                )
            )
    elif settings.s3_url:
        warnings.append(
            StageWarning(
                "cache", "WARMSTART_S3_URL is used in staged mode only (WARMSTART_CACHE_MODE=direct): no S3 tier"
            )
        )
    blocked = f"the volume {volume.read_only.root} is not writable" if volume.read_only is not None else None
    return Placement(layout, dirs, staged_root, open_s3, blocked, tuple(warnings))
