"""The report's `staged` block and the staged figures beside it: where the generation restored came from,
each tier's latest publish, per layer the files restored and published, and the seconds both took.

Built at the boot's report (report/build.py) and again after each publish while serving
(report/serving.py), from the tiers' own results (store/tiers.py); nothing here reads a store.
"""

from __future__ import annotations

from typing import Any

from ..plan import BootPlan
from ..store.publish import PublishResult
from ..store.seed import SeedResult
from ..store.tiers import TierPublish, TierRestore


def restore_seconds(restored: TierRestore | None, seeded: SeedResult | None = None) -> float | None:
    """The `restore` phase: the tiers' restore, and a sibling's seeding after it (None: nothing restored)."""
    r = restored.result if restored else None
    seed = seeded.result.seconds if seeded is not None and seeded.result is not None else 0.0
    return round(r.seconds + seed, 3) if r else None


def publish_seconds(published: TierPublish | None) -> float | None:
    """The `publish` phase: the nearest tier's latest publish."""
    p = published.first if published else None
    return round(p.seconds, 3) if p else None


def staged_layer_counts(restored: TierRestore | None, published: TierPublish | None) -> dict[str, dict[str, int]]:
    """Per layer: files and bytes restored from and published to the volume (staged)."""
    counts: dict[str, dict[str, int]] = {}
    pairs = ((restored.result if restored else None, "restored"), (published.first if published else None, "published"))
    for result, prefix in pairs:
        for layer, (files, size) in (result.per_layer if result else {}).items():
            counts.setdefault(layer, {}).update({f"{prefix}_files": files, f"{prefix}_bytes": size})
    return counts


def staged_summary(
    plan: BootPlan, restored: TierRestore | None, published: TierPublish | None
) -> dict[str, Any] | None:
    """The report's `staged` block: where generations came from and went to."""
    if not plan.restore_order:
        return None
    r = restored.result if restored else None
    summary: dict[str, Any] = {
        "store": plan.tiers[0].location if plan.tiers else None,  # the nearest published to
        "local": str(plan.cache_dirs.base),
        "generation_restored": r.generation if r else None,
        "restored_from": r.source if r is not None and r.restored else None,
        "restore_problems": list(restored.problems if restored else ()),
        "publish": publish_summary(published.first if published else None),
    }
    if plan.image is not None:  # read-only: restored from, never published to
        summary["image"] = {"store": plan.image.location}
    if plan.s3 is not None:
        summary["s3"] = {
            "store": plan.s3.location,
            "publish": publish_summary(published.of(plan.s3.kind) if published else None),
        }
    return summary


def publish_summary(p: PublishResult | None) -> dict[str, Any] | None:
    """One tier's publish in the `staged` block."""
    if p is None:
        return None
    return {
        "status": p.status,
        "generation": p.generation,
        "files": p.files,
        "bytes": p.bytes,
        "seconds": round(p.seconds, 3),
        "detail": p.detail,
    }
