"""The wrapper's progress lines: `warmstart | STAGE    | message`, on the `warmstart` logger.

One helper instead of a padded literal per call, so every line has the same shape: users, the docs,
the tests and `warmstart report` read these lines by that shape (the stage padded to 8 characters,
a longer one followed by one space). `info`/`warning`/`error` take a %-format message and its
arguments as `logging` does (formatted only when written, so a message without arguments is
written as is); `line` is the same text for lines written elsewhere (the report, a signal handler).
"""

from __future__ import annotations

import logging

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
