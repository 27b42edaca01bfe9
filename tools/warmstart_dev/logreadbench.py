"""`warmstart-dev bench logread`: `warmstart report` on every corpus log, and on the 0.33 config line grown.

Issue 37's budget: `warmstart report` of any corpus log within 0.5 s. Before the linear matcher it took 3.1 to
6.7 s per real GPU log, 5.9 s for one 4.3 KB config line and 61 s for that line grown to 6.3 KB. Per log this
prints the report's own seconds in-process (best of three: the parse, which the budget is about) and the wall
time of the command itself (`warmstart report LOG --json`, a new interpreter each: what a user waits for).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from warmstart.report.fromlog import report_from_log

BUDGET_S = 0.5
GROWN_SIZES = (6_300, 8_192, 65_536, 1 << 20)  # the config line grown to these many characters


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def corpus(root: Path) -> list[Path]:
    fixtures = root / "tests" / "fixtures"
    return sorted(fixtures.glob("*.log")) + sorted(p for p in (fixtures / "real").glob("*") if p.suffix == ".log")


def parse_seconds(lines: list[str], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        report_from_log(lines, year=2026)
        best = min(best, time.perf_counter() - start)
    return best


def command_seconds(path: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "warmstart.cli", "report", str(path), "--json"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def grown(lines: list[str], size: int) -> list[str]:
    """The log with its longest line (the engine config) grown to `size` characters by repeating its fields."""
    at = max(range(len(lines)), key=lambda i: len(lines[i]))
    head, _, fields = lines[at].partition("with config: ")
    line = head + "with config: " + (fields * (size // len(fields) + 1))
    return [*lines[:at], line[:size], *lines[at + 1 :]]


def bench_logread(root: Path | None = None, *, command: bool = True) -> dict[str, Any]:
    root = root or repo_root()
    logs = []
    for path in corpus(root):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        entry: dict[str, Any] = {
            "log": str(path.relative_to(root)),
            "lines": len(lines),
            "longest_line": max((len(line) for line in lines), default=0),
            "report_s": round(parse_seconds(lines), 4),
        }
        if command:
            entry["command_s"] = round(command_seconds(path), 3)
        logs.append(entry)
    fitted = (root / "tests" / "fixtures" / "gpu-0.33-fitted-capture.log").read_text().splitlines()
    grown_lines = [{"config_line_chars": n, "report_s": round(parse_seconds(grown(fitted, n)), 4)} for n in GROWN_SIZES]
    worst = max(e["report_s"] for e in logs)
    worst_command = max((e.get("command_s", 0.0) for e in logs), default=0.0)
    return {
        "bench": "logread",
        "budget_s": BUDGET_S,
        "logs": logs,
        "grown_config_line": grown_lines,
        "max_report_s": worst,
        "max_command_s": worst_command if command else None,
        "within_budget": worst <= BUDGET_S and all(g["report_s"] <= BUDGET_S for g in grown_lines),
        "within_budget_command": worst_command <= BUDGET_S if command else None,
    }
