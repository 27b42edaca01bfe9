"""The report a vLLM log alone gives (`warmstart report LOGFILE`): phases, and the statuses its lines decide.

No directory was scanned, so only the layers whose log lines speak are listed, and on a platform whose
compile cache says nothing (stock Inductor on CPU) no verdict is claimed.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..vllm.cudagraphs import capture_summary
from ..vllm.logread import compiled_while_serving, log_warnings
from ..vllm.phases import LogEvidence, compute_phases, earliest, phase_details
from ..vllm.releases import release_note
from .model import BootReport, CacheLayer
from .ranks import ranks_block
from .statuses import decide_verdict, flashinfer_autotune_status, startup_plan_status, vllm_compile_status


def report_from_log(lines: Iterable[str], year: int | None = None) -> BootReport:
    """What a vLLM log alone proves: phases and the statuses its lines decide (no directories)."""
    ev, span = LogEvidence.from_log(lines, year)
    app = ev.first("app_ready")
    ready_t = app.t if app is not None else None
    floor = earliest(ev)  # a fragment whose first line comes after work that a later line reports
    phases = compute_phases(ev, ready_t=ready_t, floor=floor)
    status, detail = vllm_compile_status(ev, None)
    caches = {"vllm_compile": CacheLayer(status, detail=detail)}
    for name, status_of in (("startup_plan", startup_plan_status), ("flashinfer_autotune", flashinfer_autotune_status)):
        status, detail = status_of(ev, None)
        if status != "unused":
            caches[name] = CacheLayer(status, detail=detail)
    # stock Inductor on CPU says nothing about its cache: only the directories could tell
    verdict = None if caches["vllm_compile"].status in ("unused", "unknown") else decide_verdict(caches)
    jit_count, jit_kernels = compiled_while_serving(ev)
    engine = ev.first("engine_init")
    warnings = log_warnings(ev) + ([] if span is not None else ["the log holds no vLLM timestamps"])
    if note := release_note(engine.groups[0] if engine else None):
        warnings.append(note)
    return BootReport(
        key=None,
        key_dir=None,
        expected=None,
        verdict=verdict,
        ready_s=round(ready_t - floor, 3) if ready_t is not None else None,
        phases=phases,
        caches=caches,
        vllm_version=engine.groups[0] if engine else None,
        warnings=tuple(warnings),
        source="log",
        phase_detail=phase_details(ev),
        compiled_while_serving=jit_count,
        compiled_kernels=tuple(jit_kernels),
        cudagraphs=capture_summary(ev),
        ranks=ranks_block(ev),
    )
