"""The wrapper's progress lines: `warmstart | STAGE    | message`, on the `warmstart` logger.

One helper instead of a padded literal per call, so every line has the same shape: users, the docs,
the tests and `warmstart report` read these lines by that shape (the stage padded to 8 characters,
a longer one followed by one space). `info`/`warning`/`error` take a %-format message and its
arguments as `logging` does (formatted only when written, so a message without arguments is
written as is); `line` is the same text for lines written elsewhere (the report, a signal handler).
A warning that is both kept (for the report) and logged is a `StageWarning`: its text and its stage.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

logger = logging.getLogger("warmstart")

STAGE_WIDTH = 8  # "settings", "timeline", "why miss": the longest stages fill it exactly


def line(stage: str, text: str) -> str:
    """`warmstart | STAGE    | text`."""
    return f"warmstart | {stage:<{STAGE_WIDTH}} | {text}"


def info(stage: str, message: str, *args: object) -> None:
    logger.info(line(stage, message), *args, stacklevel=2)


def warning(stage: str, message: str, *args: object) -> None:
    logger.warning(line(stage, message), *args, stacklevel=2)


def error(stage: str, message: str, *args: object) -> None:
    logger.error(line(stage, message), *args, stacklevel=2)


class StageWarning(str):
    """A warning's text that also knows the stage it is logged under. It is a `str`, the text itself, so
    the plan, the report, its JSON and `warmstart key --json` carry it as the plain text they always did;
    `log()` writes it as `warmstart | STAGE | text` where it is raised."""

    stage: str

    def __new__(cls, stage: str, text: str) -> StageWarning:
        made = super().__new__(cls, text)
        made.stage = stage
        return made

    def __getnewargs__(self) -> tuple[str, str]:  # copy, deepcopy (dataclasses.asdict) and pickle
        return (self.stage, str(self))

    def __repr__(self) -> str:
        return f"StageWarning({self.stage!r}, {str(self)!r})"

    def log(self) -> None:
        logger.warning(line(self.stage, "%s"), str(self), stacklevel=2)


def process_age() -> float:
    """Seconds since this process was launched (interpreter start and imports included)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, in ticks since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
