"""The report's view of seeding (store/seed.py): where each seeded layer's files came from, the verdict
of a boot that reused a sibling's caches, and the `staged.seeded` block.

Seeding restores and counts (store/seed.py); this only says what that means for the report, and is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..store.seed import HIT_ENTRIES, SeedResult, SeedUse
from .model import CacheLayer, Verdict


def reused(layer: str, use: SeedUse) -> bool | None:
    """Did the boot use what was seeded into this layer? None: cannot be told."""
    count = use.hits if layer in HIT_ENTRIES else use.read
    return None if count is None else count > 0


def seeded_caches(
    caches: Mapping[str, CacheLayer], seed: SeedResult, use: Mapping[str, SeedUse]
) -> dict[str, CacheLayer]:
    """The layers' statuses, with the detail of each seeded layer saying where its files came from."""
    out = dict(caches)
    source = seed.source
    for layer, u in use.items():
        if layer not in out or source is None:
            continue
        read = "reads unknown (no access times here)" if u.read is None else f"{u.read} read"
        if u.hits is not None:
            read += f" ({u.hits} {layer} cache entries hit)"
        detail = f"seeded {u.files} files ({u.bytes / 1e6:.1f} MB) from {source.key}: {read}"
        detail += f", {out[layer].files_added} added"
        out[layer] = replace(out[layer], detail=detail)
    return out


def seeded_verdict(verdict: Verdict | None, seed: SeedResult | None, use: Mapping[str, SeedUse]) -> Verdict | None:
    """`partial` for a boot that reused what a sibling seeded: never `warm` (this key's own caches
    held nothing), and `cold` only when nothing seeded was used (or that cannot be told)."""
    if verdict is None or seed is None or seed.source is None:
        return verdict
    if verdict == "warm":
        return "partial"
    if verdict == "cold" and any(reused(layer, u) for layer, u in use.items()):
        return "partial"
    return verdict


def seeded_block(
    seed: SeedResult, use: Mapping[str, SeedUse], caches: Mapping[str, CacheLayer], compile_s: float | None
) -> dict[str, Any]:
    """The report's `staged.seeded`: the source, per layer files seeded / read / added, seconds saved."""
    source = seed.source
    block: dict[str, Any] = {
        "from": source.key if source else None,
        "tier": source.tier if source else None,
        "generation": seed.result.generation if seed.result else None,
        "differs": dict(source.differs) if source else {},
        "seconds": round(seed.result.seconds, 3) if seed.result else None,
        "reads_told": seed.atimes,
        "layers": {
            layer: {
                "files": u.files,
                "bytes": u.bytes,
                "read": u.read,
                "hits": u.hits,
                "added": getattr(caches.get(layer), "files_added", None),
                "rewritten": u.rewritten,
            }
            for layer, u in sorted(use.items())
        },
        "problems": list(seed.problems),
        "note": seed.note,
    }
    cold = source.cold_compile_s if source else None
    block["compile_s"] = compile_s
    block["source_cold_compile_s"] = cold
    # The sibling's own cold compile stands in for this key's: the same model compiles about the
    # same graphs (an estimate, said as one; `bench siblings` measures it against real cold boots).
    block["compile_saved_s_est"] = round(cold - compile_s, 2) if cold is not None and compile_s is not None else None
    return block
