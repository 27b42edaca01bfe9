"""Every corpus log read the way a boot reads vLLM's output gives what `warmstart report` gives on the file.

The boot's path: each line, as it arrives, through the bounded handoff (engine/logpipe.py) to `Boot._on_line`
on the reader's thread. Here each line arrives with the time the saved log gives it (its stamp, or the stamp
before it), so the two paths see the same clock: the markers must be the same, each with its captures and
time, and so must the phases. Two logs read differently by nature, and are asserted to (so the list stays true).
"""

from __future__ import annotations

import pytest

from helpers.run import FIXTURES
from warmstart.boot import Boot
from warmstart.engine.logpipe import LineHandoff, LogLine
from warmstart.redact import Redactor
from warmstart.report.fromlog import report_from_log
from warmstart.vllm.phases import LogEvidence, compute_phases, earliest, host_timestamp, is_own_line, log_timestamp

LOGS = sorted(FIXTURES.glob("*.log")) + sorted((FIXTURES / "real").glob("*.log"))
DIFFER = {
    # tqdm bars between stamped lines: in a file a bar has the time of the line before it; live, each has its
    # arrival time and bounds a silence (here it shortens the `unlogged` stretch the file shows).
    "file-0.3x-deepgemm-autotune-dspark-draft.log",
    # no timestamp at all: the file gives the figures vLLM states; a log without a clock cannot arrive at its pace.
    "pr11005-0.6-general-shape-cold.log",
}


def arrivals(lines: list[str]) -> list[LogLine]:
    """Each of vLLM's lines with the time the saved log gives it (0 before the first stamp)."""
    host = any(host_timestamp(line) for line in lines if not is_own_line(line))
    start = None
    t = 0.0
    out = []
    for line in lines:
        if is_own_line(line):  # a worker's log: warmstart's lines never came from vLLM's pipe
            continue
        stamp = host_timestamp(line) if host else log_timestamp(line, 2026)
        if stamp is not None:
            start = start or stamp
            t = (stamp - start).total_seconds()
        out.append(LogLine(t, line))
    return out


def live_evidence(lines: list[str]) -> LogEvidence:
    boot = Boot(plan=None, redactor=Redactor())  # type: ignore[arg-type]  # _on_line reads no plan
    boot.evidence = LogEvidence(precise=False)  # the saved log's one-second clock, as the file path reads it
    handoff = LineHandoff(boot._on_line, lambda: 0.0)
    for line in arrivals(lines):
        assert handoff.offer(line)
    assert handoff.settle(10)
    assert handoff.stats()["dropped"] == 0 and handoff.stats()["failed"] == 0
    return boot.evidence


@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_the_live_path_reads_what_the_report_reads(path):
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    file_ev, _ = LogEvidence.from_log(lines, year=2026)
    live = live_evidence(lines)
    assert [(m.name, m.groups) for m in live.markers] == [(m.name, m.groups) for m in file_ev.markers]
    app = live.first("app_ready")
    phases = compute_phases(live, ready_t=app.t if app else None, floor=earliest(live))
    expected = report_from_log(lines, year=2026).phases
    if path.name in DIFFER:
        assert phases != expected
    else:
        assert phases == expected
