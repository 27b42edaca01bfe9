"""The boot report's builder: a pure function of the plan and of what the boot observed.

`Boot` collects a `BootObservation` (report/observation.py: the log evidence, the caches before and
after, what the tiers gave, when vLLM served, its command line and environment, the weights prefetch,
the error) and `build_report` turns it with the plan into the BootReport: per-layer statuses and the
verdict (statuses.py, seeded.py), the staged block (staged.py), the warnings, why a boot that should
have hit missed (miss.py). Nothing here reads the disk or the clock, so a
report can be rebuilt and tested from plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..engine.process import engine_environment
from ..envnames import is_vllm_variable
from ..key import key_vllm_env
from ..model import ResolvedModel
from ..plan import BootPlan, model_summary
from ..redact import Redactor
from ..store.history import BootHistory
from ..store.tiers import TierRestore
from ..vllm.argv import VOLATILE_FLAGS, without_flags
from ..vllm.cudagraphs import capture_summary
from ..vllm.logread import log_warnings
from ..vllm.phases import compute_phases, phase_details
from .miss import miss_reason
from .model import BootReport, CacheLayer, Expectation
from .observation import BootObservation
from .ranks import ranks_block
from .seeded import seeded_block, seeded_caches, seeded_verdict
from .staged import publish_seconds, restore_seconds, staged_layer_counts, staged_summary
from .statuses import decide_verdict, layer_statuses
from .weights import with_streamer_seconds


def expectation(plan: BootPlan, restored: TierRestore | None, history: BootHistory | None) -> Expectation | None:
    """hit if the caches should hold this key's artifacts: an earlier boot completed (direct)
    or a generation was restored (staged)."""
    if plan.restore_order:
        return "hit" if restored is not None and restored.restored else "miss"
    return history.expected if history else None


def with_seed(
    staged: dict[str, Any] | None, obs: BootObservation, caches: Mapping[str, CacheLayer], compile_s: float | None
) -> dict[str, Any] | None:
    """The `staged` block, with `seeded` (report/seeded.py) when a sibling seeded the caches."""
    if staged is not None and obs.seeded is not None:
        staged["seeded"] = seeded_block(obs.seeded, obs.seed_use, caches, compile_s)
    return staged


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


def hf_cache_words(path: Path, hubs: Mapping[str, Path | None]) -> str:
    """Which HF cache a snapshot was found in, in words ("the volume's HF cache": the volume's hub), else
    "a read-only HF cache" (another volume's)."""
    for words, root in hubs.items():
        if root is not None and path.is_relative_to(root):
            return words
    return "a read-only HF cache"


def hf_weights_layer(
    m: ResolvedModel, hubs: Mapping[str, Path | None] | None = None, *, streamed: bool = False
) -> CacheLayer:
    if m.source == "downloaded":
        return CacheLayer(
            "miss", m.files, m.downloaded_bytes, 0, 0, f"downloaded {m.files} files ({m.bytes / 1e6:.1f} MB)"
        )
    if m.source == "s3":  # where the weights live, read as designed on every new worker: not a miss
        if streamed:
            where = f"streamed by vLLM from {m.name}"
        else:
            where = f"read from {m.name}" if m.downloaded_bytes else f"{m.name} already on local disk"
        return CacheLayer("hit", 0, 0, m.files, m.bytes, f"{where}: {m.files} files ({m.bytes / 1e6:.1f} MB)")
    cache = hf_cache_words(m.path, hubs or {})
    where = "local directory" if m.source == "local-dir" else f"snapshot complete in {cache}"
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
    warnings += log_warnings(obs.evidence)
    return warnings


def build_report(plan: BootPlan, obs: BootObservation, redactor: Redactor) -> BootReport:
    """Decide the layers' statuses, the verdict, the warnings and the miss reason; `redactor`
    masks secrets in every text that comes from outside warmstart."""
    caches = layer_statuses(obs.evidence, obs.before, obs.after)
    for name, extra in staged_layer_counts(obs.restored, obs.published).items():
        if name in caches:
            caches[name] = replace(caches[name], **extra)
    hubs = {
        "the volume's HF cache" if plan.layout.on_volume else "the local HF cache": plan.layout.hub_cache,
        "the image's baked HF cache": plan.settings.baked_hf_cache,
    }
    caches["hf_weights"] = hf_weights_layer(plan.model, hubs, streamed=plan.streamed is not None)
    verdict = decide_verdict(caches) if obs.error is None else None
    if obs.seeded is not None:  # report/seeded.py: where the seeded layers came from, and `partial` if used
        caches = seeded_caches(caches, obs.seeded, obs.seed_use)
        verdict = seeded_verdict(verdict, obs.seeded, obs.seed_use)
    expect = expectation(plan, obs.restored, obs.history)
    seen = observed(plan, obs, redactor)
    warnings = report_warnings(plan, obs)
    reasons = miss_reason(obs, caches, expect, seen)
    phases = compute_phases(
        obs.evidence,
        ready_t=obs.engine_ready_t,
        resolve_s=round(plan.resolve_s, 3),
        restore_s=restore_seconds(obs.restored, obs.seeded),
        publish_s=publish_seconds(obs.published),
    )
    weights = None
    if obs.weights is not None:
        weights = {**obs.weights, "vllm_bootstrap_s": phases.get("bootstrap"), "vllm_weights_s": phases.get("weights")}
        if "read" in weights:
            weights["read"] = with_streamer_seconds(weights["read"], phases.get("weights"))
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
        phase_detail=phase_details(obs.evidence),
        weights=weights,
        cudagraphs=capture_summary(obs.evidence),
        log_reader=obs.log_reader,
        ranks=ranks_block(obs.evidence, obs.before.get("vllm_compile"), obs.after.get("vllm_compile")),
    )
