"""The canary in a boot: asked after vLLM serves and before ready, and what a mismatch does.

canary.py is the request and the comparison; this is the boot's side of it (boot.py's `run_boot`
calls `check_canary` right after vLLM serves). A boot with no restored record keeps its answer for
the generation it publishes; one that restored a generation compares, and on a mismatch
WARMSTART_CANARY decides: `warn` reports and serves, `enforce` distrusts the generation where it
came from, stops vLLM, empties the caches and boots again cold, then asks once more: an answer
equal to the record blames the caches, a different one the model (the weights, the hardware or
the build changed under the same key), and the snapshot's files are checked against the Hub's
SHA-256. It reaches the boot through `Booting`, so that it need not import boot.py.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from typing import Protocol

from . import log
from .canary import (
    CanaryFailed,
    CanaryOutcome,
    CanaryRecord,
    Verdict,
    ask,
    compare,
    does_not_generate,
    prompts_of,
    time_again,
)
from .engine.process import EngineProcess
from .model import check_snapshot_hashes
from .plan import BootPlan
from .report.model import BootReport
from .store.restore import RestoreResult
from .store.tiers import TierRestore, distrust_generation
from .tree import TreeScan, scan_tree
from .vllm.phases import LogEvidence


class Booting(Protocol):
    """What of boot.py's `Boot` the canary reads and sets."""

    plan: BootPlan
    restored: TierRestore | None
    engine: EngineProcess | None
    worker: str
    canary: CanaryOutcome | None
    canary_record: CanaryRecord | None
    before: dict[str, TreeScan]
    evidence: LogEvidence
    load_start: tuple[float, int] | None

    ready_s: float | None
    t0: float

    def start(self) -> None: ...

    def wait_ready(self) -> float: ...


def ask_canary(boot: Booting) -> tuple[CanaryRecord, float | None]:
    """The timed answer, and its spread against the warm-up's (None: their tokens differ)."""
    assert boot.engine is not None
    settings = boot.plan.settings
    prompts = prompts_of(settings.canary_prompt)
    answer, repeat = ask(boot.engine.base_url, settings.served_model_name, prompts, api_key=settings.engine_api_key)
    if repeat.status != "equal":
        log.warning("canary", "two identical requests answered otherwise: %s", repeat.detail)
    return answer, repeat.max_logprob_diff if repeat.status == "equal" else None


def check_canary(boot: Booting) -> None:
    """Staged, after vLLM serves and before the worker is ready: ask the canary, record or compare.
    The worker is ready once it is done: the boot's ready time includes it."""
    _check_canary(boot)
    if boot.canary is not None and boot.ready_s is not None:
        boot.ready_s = round(time.monotonic() - boot.t0, 3)


def with_canary(report: BootReport, outcome: CanaryOutcome | None) -> BootReport:
    """The report with its `canary` block, and the canary's seconds as the phase `canary` (before
    ready: the timeline draws it as any phase, and it is no longer unaccounted time)."""
    if outcome is None:
        return report
    return replace(report, canary=outcome.to_dict(), phases={**report.phases, "canary": round(outcome.seconds, 3)})


def _check_canary(boot: Booting) -> None:
    plan = boot.plan
    mode = plan.settings.canary
    if mode == "off" or not plan.restore_order or boot.engine is None:
        return  # off, or direct mode: no generation to record into or compare with
    start = time.monotonic()
    restored = boot.restored.result if boot.restored is not None and boot.restored.restored else None
    record = CanaryRecord.from_json(restored.canary) if restored is not None else None
    number = restored.generation if restored is not None else None
    try:
        replay, spread = ask_canary(boot)
    except CanaryFailed as exc:
        if does_not_generate(exc):
            status, detail = "skipped", f"the model does not generate text ({exc}): no canary for it"
        else:
            status, detail = "failed", f"{exc}: the worker goes on without a canary"
        boot.canary = CanaryOutcome(mode, status, detail, time.monotonic() - start, generation=number)
        log.warning("canary", "%s", detail)
        return
    if restored is None or record is None:
        boot.canary_record = replay
        detail = "recorded with the generation this boot publishes"
        if restored is not None:
            detail = f"generation {number} holds no canary: this boot's is recorded with its next generation"
        boot.canary = CanaryOutcome(
            mode, "recorded", detail, time.monotonic() - start, replay.latency_s, repeat_spread=spread
        )
        log.info("canary", "%s (%.3f s after warm-up)", detail, replay.latency_s)
        return
    verdict = compare(record, replay)
    if verdict.slow:
        replay = retimed(boot, replay)
        verdict = compare(record, replay)
    detail = f"generation {number} from the {restored.source} store: {verdict.detail}" + slow_words(verdict)
    outcome = CanaryOutcome(
        mode,
        verdict.status,
        detail,
        time.monotonic() - start,
        replay.latency_s,
        record.latency_s,
        number,
        repeat_spread=spread,
    )
    if verdict.status != "differs":
        boot.canary_record = record if verdict.status == "equal" else replay
        boot.canary = outcome
        (log.warning if verdict.slow else log.info)("canary", "%s", detail)
    elif mode == "warn":
        boot.canary = replace(outcome, actions=("served anyway (WARMSTART_CANARY=warn)",))
        log.warning("canary", "%s: served anyway (WARMSTART_CANARY=warn)", detail)
    else:
        reboot_cold(boot, outcome, record, verdict, restored)


def retimed(boot: Booting, replay: CanaryRecord) -> CanaryRecord:
    assert boot.engine is not None
    settings = boot.plan.settings
    try:
        best = time_again(
            boot.engine.base_url, settings.served_model_name, replay.prompts, api_key=settings.engine_api_key
        )
    except CanaryFailed:
        return replay
    return replace(replay, latency_s=min(replay.latency_s, best))


def slow_words(verdict: Verdict) -> str:
    if not verdict.slow or verdict.latency_ratio is None:
        return ""
    return (
        f"; {verdict.latency_ratio:.1f}x slower than the recorded boot after warm-up: "
        "its compiled graphs are likely not in use (running eager)"
    )


def restart_cold(boot: Booting, problem: str) -> None:
    """Stop vLLM, empty every cache layer, forget the restore, and start vLLM again until it serves."""
    plan = boot.plan
    assert boot.engine is not None and boot.restored is not None
    boot.engine.stop()
    for path in plan.cache_dirs.layers().values():
        shutil.rmtree(path, ignore_errors=True)
    plan.cache_dirs.create()
    boot.restored = TierRestore(None, (*boot.restored.problems, problem), boot.restored.bad_bundles)
    boot.before = {name: scan_tree(path) for name, path in plan.cache_dirs.layers().items()}
    boot.evidence = LogEvidence(specs=boot.evidence.specs)
    boot.load_start = None
    boot.start()
    boot.wait_ready()


def reboot_cold(
    boot: Booting, outcome: CanaryOutcome, record: CanaryRecord, verdict: Verdict, restored: RestoreResult
) -> None:
    """enforce: distrust the generation where it came from, boot again cold, and ask again."""
    reason = f"canary differed: {verdict.detail}"
    log.warning("canary", "%s: distrusting it, stopping vLLM and booting again cold", outcome.detail)
    actions = list(distrust_generation(boot.plan.restore_order, restored, reason, by=boot.worker))
    restart_cold(boot, f"{restored.source}: generation {restored.generation} distrusted ({reason})")
    start = time.monotonic()
    try:
        cold, _ = ask_canary(boot)
    except CanaryFailed as exc:
        actions.append(f"booted again cold; its canary failed ({exc})")
        boot.canary = replace(outcome, actions=tuple(actions), seconds=outcome.seconds + time.monotonic() - start)
        return
    second = compare(record, cold)
    boot.canary_record = cold
    files: tuple[str, ...] = ()
    if second.status == "differs":
        fault = "model"
        actions.append(
            f"booted again cold on empty caches: its canary differs from the record too ({second.detail}): "
            "not a cache fault; the weights, the hardware or the build changed under the same key"
        )
        hashes = check_snapshot_hashes(boot.plan.model.path)
        files = hashes.differ
        if hashes.differ:
            actions.append(f"snapshot files that no longer match the Hub's SHA-256: {', '.join(hashes.differ)}")
        elif hashes.checked:
            actions.append(f"all {len(hashes.checked)} LFS files of the snapshot match the Hub's SHA-256")
        else:
            actions.append("no snapshot file has a SHA-256 recorded by the Hub to check against")
        actions.append("the cold canary is recorded with the new generation")
    else:
        fault = "cache"
        actions.append("booted again cold on empty caches: its canary equals the record (a cache fault)")
    for line in actions[len(actions) - (3 if fault == "model" else 1) :]:
        log.warning("canary", "%s", line)
    boot.canary = replace(
        outcome,
        seconds=outcome.seconds + time.monotonic() - start,
        actions=tuple(actions),
        fault=fault,
        files_differ=files,
    )
