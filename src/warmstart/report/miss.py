"""Why a boot that should have hit the compile cache missed: the factors recorded at the last good
boot against this one's, and vLLM's own compile hashes with the factors vLLM wrote beside them.

`compile_hashes` reads vLLM's hash directories under a key (the one disk read of the report, done by
the boot only when a hit was expected); the rest is pure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..key import factor_diff
from ..tree import TreeScan
from .model import CacheLayer, Expectation
from .observation import BootObservation
from .statuses import COMPILE_SUBDIR, primary_compile_layer


def compile_hashes(vllm_dir: Path) -> dict[str, dict[str, Any]]:
    """vLLM's own compile hash directories under a key, with the factors vLLM recorded."""
    found: dict[str, dict[str, Any]] = {}
    root = vllm_dir / COMPILE_SUBDIR
    try:
        entries = list(os.scandir(root))
    except OSError:
        return found
    for entry in entries:
        if not entry.is_dir() or entry.name == "torch_aot_compile":
            continue
        factors: dict[str, Any] = {}
        meta = Path(entry.path)
        for rank in sorted(meta.glob("rank_*/*/cache_key_factors.json")) + sorted(meta.glob("cache_key_factors.json")):
            try:
                factors = json.loads(rank.read_text())
                break
            except (OSError, ValueError):
                continue
        found[entry.name] = factors
    for entry in sorted((root / "torch_aot_compile").glob("*")):
        if entry.is_dir():
            found[f"aot:{entry.name[:16]}"] = {}
    return found


def differing(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 12) -> list[str]:
    """Human lines naming the factors that differ between two records."""
    lines = [f"{name}: {was!r} -> {now!r}" for name, (was, now) in factor_diff(old, new).items()]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more"]
    return lines


def explain_miss(
    last_good: Mapping[str, Any],
    observed: Mapping[str, Any],
    new_hashes: Mapping[str, Mapping[str, Any]],
    old_hashes: Mapping[str, Mapping[str, Any]],
) -> list[str]:
    """Why a boot that expected a hit missed: recorded factors that differ, else vLLM's own."""
    reasons = [
        f"recorded factor differs from the last good boot ({last_good.get('started_at', '?')}): {line}"
        for line in differing(last_good.get("observed") or {}, observed)
    ]
    added = [h for h in new_hashes if h not in old_hashes]
    if added:
        reasons.append(
            f"vLLM computed a new compile hash {', '.join(added)}; earlier: {', '.join(old_hashes) or 'none'}"
        )
        new_factors = new_hashes[added[0]]
        for old_name, old_factors in old_hashes.items():
            if old_factors and new_factors:
                reasons += [
                    f"vLLM hash factor differs ({old_name} -> {added[0]}): {line}"
                    for line in differing(old_factors, new_factors)
                ]
                break
    if not reasons:
        reasons.append(
            "no recorded factor differs from the last good boot, and vLLM kept its compile hash: "
            "the artifacts were present but not reused (see caches.vllm_compile.detail)"
        )
    return reasons


def _hash_existed_before(before: Mapping[str, TreeScan], name: str) -> bool:
    prefix = f"{COMPILE_SUBDIR}/{name.removeprefix('aot:')}"
    if name.startswith("aot:"):
        prefix = f"{COMPILE_SUBDIR}/torch_aot_compile/{name.removeprefix('aot:')}"
    return any(path.startswith(prefix) for path in before.get("vllm_compile", TreeScan("", {})).files)


def miss_reason(
    obs: BootObservation, caches: Mapping[str, CacheLayer], expect: Expectation | None, seen: Mapping[str, Any]
) -> list[str]:
    """Why a boot that should have hit the compile cache missed it (empty unless it did)."""
    primary = caches.get(primary_compile_layer(caches))
    if expect != "hit" or primary is None or primary.status not in ("miss", "load_failed") or not obs.history:
        return []
    old_hashes = {k: v for k, v in obs.compile_hashes.items() if _hash_existed_before(obs.before, k)}
    return explain_miss(obs.history.last_good() or {}, seen, obs.compile_hashes, old_hashes)
