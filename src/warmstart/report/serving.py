"""The report while the worker serves: each update after ready returns a new `BootReport`.

The served report (`{"warmstart": "boot_report"}`, `GET /warmstart/boot_report`) is the boot's own,
brought up to date by the serving upkeep (worker/upkeep.py): the latest publish (the `staged` block,
the `publish` phase, each layer's published files) and the kernels vLLM JIT-compiled since. Each is a
`dataclasses.replace` of the frozen report, serialized afresh, never a patch of its JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..plan import BootPlan
from ..store.tiers import TierPublish, TierRestore
from .model import BootReport
from .staged import publish_seconds, staged_layer_counts, staged_summary


def with_publish(
    report: BootReport, plan: BootPlan, restored: TierRestore | None, published: TierPublish | None
) -> BootReport:
    """The report showing the latest publish: its `staged` block, `publish` phase and per-layer counts.
    The boot's `staged.seeded` stays: what vLLM read of a sibling's caches is no publish's to change."""
    caches = dict(report.caches)
    for layer, extra in staged_layer_counts(restored, published).items():
        if layer in caches:
            caches[layer] = replace(caches[layer], **extra)
    staged = staged_summary(plan, restored, published)
    if staged is not None and report.staged is not None and "seeded" in report.staged:
        staged["seeded"] = report.staged["seeded"]
    return replace(
        report,
        staged=staged,
        phases={**report.phases, "publish": publish_seconds(published)},
        caches=caches,
    )


def with_kernels(report: BootReport, kernels: Sequence[str]) -> BootReport:
    """The report counting the kernels vLLM JIT-compiled while serving (its `jit_monitor.py` warnings)."""
    return replace(report, compiled_while_serving=len(kernels), compiled_kernels=tuple(kernels))
