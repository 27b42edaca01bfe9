"""What one boot saw, from its start to its report: the builder's input (report/build.py).

`Boot` (boot.py) fills a `BootObservation` from vLLM's log, the cache scans before and after, what the
tiers restored and published, what a sibling seeded and vLLM read of it, and the weights prefetch.
Plain values only, so that a report can be rebuilt and tested without an engine or a disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store.history import BootHistory
from ..store.seed import SeedResult, SeedUse
from ..store.tiers import TierPublish, TierRestore
from ..tree import TreeScan
from ..vllm.phases import LogEvidence


@dataclass(frozen=True)
class BootObservation:
    """What one boot saw, from its start to its report."""

    boot_id: str
    started_at: str
    environ: Mapping[str, str]  # the wrapper's own environment (vLLM's is built on top of it)
    model_arg: Path | str  # the model path vLLM was given (an s3:// URL when its streamer reads it)
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
    log_reader: Mapping[str, Any] | None = None  # engine/logpipe.py: lines read, dropped, the reader's lag
