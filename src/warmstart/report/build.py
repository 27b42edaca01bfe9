"""The boot report: a pure function of the plan and of what the boot observed.

`Boot` collects a `BootObservation` (the log evidence, the caches before and after, what the tiers
gave, when vLLM served, its command line and environment, the weights prefetch, the error) and
`build_report` turns it with the plan into the BootReport: per-layer statuses, the verdict, the
warnings, why a boot that should have hit missed. Nothing here reads the disk or the clock, so a
report can be rebuilt and tested from plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..engine.process import engine_environment
from ..envnames import is_vllm_variable
from ..key import key_vllm_env
from ..model import ResolvedModel
from ..plan import BootPlan, model_summary
from ..redact import Redactor
from ..store.history import BootHistory
from ..store.publish import PublishResult
from ..store.seed import SeedResult, SeedUse, seeded_block, seeded_caches, seeded_verdict
from ..store.tiers import TierPublish, TierRestore
from ..tree import TreeScan
from ..vllm.argv import VOLATILE_FLAGS, without_flags
from ..vllm.cudagraphs import capture_summary
from ..vllm.phases import LogEvidence
from . import layers as evidence
from .layers import BootReport, CacheLayer


@dataclass(frozen=True)
class BootObservation:
    """What one boot saw, from its start to its report."""

    boot_id: str
    started_at: str
    environ: Mapping[str, str]  # the wrapper's own environment (vLLM's is built on top of it)
    model_arg: Path  # the model path vLLM was given
    evidence: LogEvidence = field(default_factory=LogEvidence)
    before: Mapping[str, TreeScan] = field(default_factory=dict)  # each cache layer before vLLM started
    after: Mapping[str, TreeScan] = field(default_factory=dict)  # and at the report
    history: BootHistory | None = None  # the key's earlier boots
    store_warnings: tuple[str, ...] = ()  # the key's records on the volume
    warnings: tuple[str, ...] = ()  # the boot's own, beside the plan's (the model link)
    restored: TierRestore | None = None  # staged: what restoring from the tiers gave
    published: TierPublish | None = None  # staged: the latest publish to each tier
    ready_s: float | None = None  # since the boot began (resolve and restore included)
    engine_ready_t: float | None = None  # since vLLM was started: the clock of the log markers
    argv: tuple[str, ...] = ()  # vLLM's command line (empty: not started)
    engine_env: Mapping[str, str] = field(default_factory=dict)  # vLLM's environment (empty: not started)
    weights: Mapping[str, Any] | None = None  # weights_block without vLLM's phases (build_report adds them)
    compile_hashes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # read when a hit was expected
    error: str | None = None
    seeded: SeedResult | None = None  # staged: what a sibling key seeded (no generation of its own restored)
    seed_use: Mapping[str, SeedUse] = field(default_factory=dict)  # what vLLM had read of it when it served


def expectation(plan: BootPlan, restored: TierRestore | None, history: BootHistory | None) -> str | None:
    """hit if the caches should hold this key's artifacts: an earlier boot completed (direct)
    or a generation was restored (staged)."""
    if plan.restore_order:
        return "hit" if restored is not None and restored.restored else "miss"
    return history.expected if history else None


def restore_seconds(restored: TierRestore | None, seeded: SeedResult | None = None) -> float | None:
    r = restored.result if restored else None
    seed = seeded.result.seconds if seeded is not None and seeded.result is not None else 0.0
    return round(r.seconds + seed, 3) if r else None


def publish_seconds(published: TierPublish | None) -> float | None:
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


def with_seed(
    staged: dict[str, Any] | None, obs: BootObservation, caches: Mapping[str, CacheLayer], compile_s: float | None
) -> dict[str, Any] | None:
    """The `staged` block, with `seeded` (store/seed.py seeded_block) when a sibling seeded the caches."""
    if staged is not None and obs.seeded is not None:
        staged["seeded"] = seeded_block(obs.seeded, obs.seed_use, caches, compile_s)
    return staged


def publish_summary(p: PublishResult | None) -> dict[str, Any] | None:
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


def observed(plan: BootPlan, obs: BootObservation, redactor: Redactor) -> dict[str, Any]:
    """Factors beyond the key, recorded per boot, to explain a miss that the key did not predict."""
    argv = without_flags(redactor.argv(obs.argv[1:]), VOLATILE_FLAGS)
    given = obs.engine_env or engine_environment(obs.environ, plan.engine_env, plan.settings.vllm_env_pass)
    env = {k: v for k, v in given.items() if is_vllm_variable(k)}
    # Inductor reads its config from TORCHINDUCTOR_* variables, and that config is part of its
    # FX graph cache key (torch/_inductor/config.py, codecache.py): outside warmstart's key,
    # recorded so that a miss they cause is named.
    torch_env = {k: v for k, v in {**obs.environ, **plan.engine_env}.items() if k.startswith("TORCHINDUCTOR_")}
    torch_env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return {
        "key_factors": plan.key.factors,
        "engine_argv": argv,
        "vllm_env": redactor.mapping(key_vllm_env(env)),
        "torch_env": redactor.mapping(dict(sorted(torch_env.items()))),
        "engine_python": plan.engine.python,
        "home": obs.environ.get("HOME", ""),
    }


def hf_weights_layer(m: ResolvedModel) -> CacheLayer:
    if m.source == "downloaded":
        return CacheLayer(
            "miss", m.files, m.downloaded_bytes, 0, 0, f"downloaded {m.files} files ({m.bytes / 1e6:.1f} MB)"
        )
    where = "local directory" if m.source == "local-dir" else "snapshot complete in the volume's HF cache"
    return CacheLayer("hit", 0, 0, m.files, m.bytes, f"{where}: {m.files} files ({m.bytes / 1e6:.1f} MB)")


def report_warnings(plan: BootPlan, obs: BootObservation) -> list[str]:
    """The plan's and the boot's warnings, then the tiers', the records', the scans' and the log's."""
    warnings = [*plan.warnings, *obs.warnings]
    if obs.restored is not None:
        warnings += [f"restore skipped {p}" for p in obs.restored.problems]
        if not obs.restored.restored and obs.history is not None and obs.history.expected == "hit":
            warnings.append("earlier boots of this key completed, but no generation could be restored")
    for tier_kind, result in obs.published.items() if obs.published else ():
        if result.status not in ("failed", "skipped"):
            continue
        if tier_kind == "volume" and plan.publish_blocked:
            continue  # said once, in the volume line
        warnings.append(f"{tier_kind}: {result.detail}")
    warnings += obs.store_warnings
    for scan in obs.after.values():
        warnings += list(scan.warnings[:3])
    warnings += evidence.log_warnings(obs.evidence)
    return warnings


def _hash_existed_before(before: Mapping[str, TreeScan], name: str) -> bool:
    prefix = f"{evidence.COMPILE_SUBDIR}/{name.removeprefix('aot:')}"
    if name.startswith("aot:"):
        prefix = f"{evidence.COMPILE_SUBDIR}/torch_aot_compile/{name.removeprefix('aot:')}"
    return any(path.startswith(prefix) for path in before.get("vllm_compile", TreeScan("", {})).files)


def miss_reason(
    obs: BootObservation, caches: Mapping[str, CacheLayer], expect: str | None, seen: Mapping[str, Any]
) -> list[str]:
    """Why a boot that should have hit the compile cache missed it (empty unless it did)."""
    primary = caches.get(evidence.primary_compile_layer(caches))
    if expect != "hit" or primary is None or primary.status not in ("miss", "load_failed") or not obs.history:
        return []
    old_hashes = {k: v for k, v in obs.compile_hashes.items() if _hash_existed_before(obs.before, k)}
    return evidence.explain_miss(obs.history.last_good() or {}, seen, obs.compile_hashes, old_hashes)


def build_report(plan: BootPlan, obs: BootObservation, redactor: Redactor) -> BootReport:
    """Decide the layers' statuses, the verdict, the warnings and the miss reason; `redactor`
    masks secrets in every text that comes from outside warmstart."""
    caches = evidence.layer_statuses(obs.evidence, obs.before, obs.after)
    for name, extra in staged_layer_counts(obs.restored, obs.published).items():
        if name in caches:
            caches[name] = replace(caches[name], **extra)
    caches["hf_weights"] = hf_weights_layer(plan.model)
    verdict = evidence.decide_verdict(caches) if obs.error is None else None
    if obs.seeded is not None:  # store/seed.py: where the seeded layers came from, and `partial` if used
        caches = seeded_caches(caches, obs.seeded, obs.seed_use)
        verdict = seeded_verdict(verdict, obs.seeded, obs.seed_use)
    expect = expectation(plan, obs.restored, obs.history)
    seen = observed(plan, obs, redactor)
    warnings = report_warnings(plan, obs)
    reasons = miss_reason(obs, caches, expect, seen)
    phases = evidence.compute_phases(
        obs.evidence,
        ready_t=obs.engine_ready_t,
        resolve_s=round(plan.resolve_s, 3),
        restore_s=restore_seconds(obs.restored, obs.seeded),
        publish_s=publish_seconds(obs.published),
    )
    weights = None
    if obs.weights is not None:
        weights = {**obs.weights, "vllm_bootstrap_s": phases.get("bootstrap"), "vllm_weights_s": phases.get("weights")}
    return BootReport(
        key=plan.key.dirname,
        key_dir=str(plan.layout.key_dir(plan.key)),
        expected=expect,
        verdict=verdict,
        ready_s=obs.ready_s,
        phases=phases,
        caches=caches,
        vllm_version=plan.engine.vllm,
        model=model_summary(plan.model, obs.model_arg),
        hardware=plan.hardware.as_dict(),
        mode=plan.mode,
        on_volume=plan.layout.on_volume,
        started_at=obs.started_at,
        boot_id=obs.boot_id,
        miss_reason=tuple(redactor.text(r) for r in reasons),
        warnings=tuple(redactor.text(w) for w in warnings),
        observed=seen,
        error=redactor.text(obs.error) if obs.error else None,
        staged=with_seed(staged_summary(plan, obs.restored, obs.published), obs, caches, phases.get("compile")),
        phase_detail=evidence.phase_details(obs.evidence),
        weights=weights,
        cudagraphs=capture_summary(obs.evidence),
    )
