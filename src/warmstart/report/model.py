"""The boot report's model: `BootReport`, its `CacheLayer`s, the words each field may hold, and its text.

One boot's report is one frozen value. It is built once (report/build.py, or report/fromlog.py for a
log alone) and, while the worker serves, replaced by a new value (report/serving.py), never patched:
`to_dict()` is the JSON line recorded on the volume and served, `lines()` the readable summary.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from .. import log
from ..vllm.silences import describe
from .ranks import ranks_lines
from .weights import describe as weights_line

LayerStatus = Literal["hit", "miss", "load_failed", "unused", "unknown"]  # unknown: lines present no table reads
Verdict = Literal["warm", "partial", "cold"]
Expectation = Literal["hit", "miss"]  # what the caches should give: this key's artifacts, or none
ReportSource = Literal["boot", "log"]  # a boot's own report, or what a vLLM log alone proves
BootMode = Literal["direct", "staged"]

STATUSES: tuple[LayerStatus, ...] = get_args(LayerStatus)
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)


@dataclass(frozen=True)
class CacheLayer:
    """One cache layer in one boot: its status, why, and the files it had, gained, restored, published."""

    status: LayerStatus
    files_added: int = 0
    bytes_added: int = 0
    files_before: int = 0
    bytes_before: int = 0
    detail: str = ""
    restored_files: int = 0
    restored_bytes: int = 0
    published_files: int = 0
    published_bytes: int = 0


@dataclass(frozen=True)
class BootReport:
    """Everything one boot proved. `to_dict()` is the JSON line; `lines()` the readable summary."""

    key: str | None
    key_dir: str | None
    expected: Expectation | None
    verdict: Verdict | None
    ready_s: float | None
    phases: Mapping[str, float | None]
    caches: Mapping[str, CacheLayer]
    vllm_version: str | None
    model: Mapping[str, Any] = field(default_factory=dict)
    hardware: Mapping[str, Any] = field(default_factory=dict)
    mode: BootMode | None = None
    on_volume: bool | None = None
    started_at: str | None = None
    boot_id: str | None = None
    miss_reason: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    observed: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    source: ReportSource = "boot"
    staged: Mapping[str, Any] | None = None  # report/staged.py: generation restored, problems, publish, seeded
    phase_detail: Mapping[str, Any] = field(default_factory=dict)  # what a phase figure includes
    weights: Mapping[str, Any] | None = None  # report/weights.py weights_block: size, source, prefetch, vLLM's phase
    compiled_while_serving: int | None = None  # kernels vLLM JIT-compiled after warm-up (logread.py)
    compiled_kernels: tuple[str, ...] = ()
    cudagraphs: Mapping[str, Any] | None = None  # cudagraphs.capture_summary: sizes and graphs vLLM captured
    # engine/logpipe.py: vLLM's lines read, handled and dropped by the boot's log reader, and its lag (ms)
    log_reader: Mapping[str, Any] | None = None
    canary: Mapping[str, Any] | None = None  # canary.CanaryOutcome.to_dict: recorded, compared, what was done
    ranks: Mapping[str, Any] | None = None  # report/ranks.py: each worker's compile, each rank directory's files

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["caches"] = {name: asdict(layer) for name, layer in self.caches.items()}
        data["miss_reason"] = list(self.miss_reason)
        data["warnings"] = list(self.warnings)
        data["compiled_kernels"] = list(self.compiled_kernels)
        accounted = sum(v for k, v in self.phases.items() if v is not None and k != "publish")  # publish: after ready
        data["unaccounted_s"] = round(self.ready_s - accounted, 3) if self.ready_s is not None else None
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False, separators=(",", ":"))

    def lines(self) -> list[str]:
        out = []
        head = log.line("report", f"verdict {self.verdict or '?'} (expected {self.expected or '?'})")
        if self.ready_s is not None:
            head += f", ready in {self.ready_s:.1f} s"
        out.append(head + (f", key {self.key}" if self.key else ""))
        phase_text = ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items() if v is not None)
        out.append(log.line("phases", phase_text or "no phase markers found"))
        if self.phase_detail.get("compile_includes_profiling_run"):
            out.append(log.line("phases", "compile includes vLLM's first profiling run (AOT compile off)"))
        out += [log.line("phases", describe(s)) for s in self.phase_detail.get("unlogged", ())]
        if split := self.phase_detail.get("compile_split"):
            out.append(
                log.line("phases", f"compile: language model {split['language_model']} s, encoder {split['encoder']} s")
            )
        for name, layer in self.caches.items():
            out.append(log.line("cache", f"{name:<19} {layer.status:<11} {layer.detail}"))
        if self.staged is not None:
            out.append(log.line("staged", staged_line(self.staged)))
        if self.weights is not None:
            out.append(log.line("weights", f"{weights_line(self.weights)}"))
        if self.cudagraphs is not None:
            out.append(log.line("graphs", f"{self.cudagraphs['detail']}"))
        out += [log.line("ranks", text) for text in ranks_lines(self.ranks)]
        if self.log_reader is not None and (self.log_reader.get("dropped") or self.log_reader.get("failed")):
            reader = self.log_reader
            out.append(
                log.line(
                    "log",
                    f"the log reader dropped {reader['dropped']} and failed on {reader.get('failed', 0)} of "
                    f"{reader['lines']} vLLM lines (its queue was full): phases may miss their markers",
                )
            )
        if self.canary is not None:
            out.append(log.line("canary", str(self.canary.get("line", ""))))
        if self.compiled_while_serving:
            names = ", ".join(sorted(set(self.compiled_kernels))[:6])
            jit = f"vLLM JIT-compiled {self.compiled_while_serving} kernel(s) after warm-up, "
            out.append(log.line("serving", jit + f"which every boot without them compiles again: {names}"))
        for reason in self.miss_reason:
            out.append(log.line("why miss", reason))
        for warning in self.warnings:
            out.append(log.line("warning", f"{warning}"))
        if self.error:
            out.append(log.line("error", f"{self.error}"))
        return out + seeded_lines(self.staged)


def staged_line(staged: Mapping[str, Any]) -> str:
    """The `staged` block in words: the generation restored and from where, each tier's publish."""
    restored = staged.get("generation_restored")
    line = f"restored generation {restored}" if restored is not None else "nothing restored"
    if restored is not None and staged.get("restored_from"):
        line += f" from the {staged['restored_from']} store"
    publishes = [("publish", staged.get("publish"))]
    if (s3 := staged.get("s3")) is not None and s3.get("publish") != staged.get("publish"):
        publishes.append(("s3 publish", s3.get("publish")))
    for label, pub in publishes:
        if pub is None:
            continue
        line += f"; {label} {pub['status']}"
        if pub.get("generation") is not None:
            line += f" (generation {pub['generation']}, {pub['files']} files)"
    return line


def seeded_lines(staged: Mapping[str, Any] | None) -> list[str]:
    """The readable line of a seeded boot's report (report/seeded.py's `staged.seeded` block)."""
    block = (staged or {}).get("seeded")
    if not block or not block.get("from"):
        return []
    layers = ", ".join(
        f"{name} {v['files']} seeded/{'?' if v['read'] is None else v['read']} read/{v['added']} added"
        for name, v in block["layers"].items()
    )
    line = log.line("seeded", f"from {block['from']} ({block['tier']} store): {layers}")
    if block.get("compile_saved_s_est") is not None:
        line += (
            f"; compile {block['compile_s']:.1f} s against {block['source_cold_compile_s']:.1f} s in its cold boot "
            f"(about {block['compile_saved_s_est']:.1f} s saved)"
        )
    return [line]
