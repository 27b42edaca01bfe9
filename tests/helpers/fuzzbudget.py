"""How many cases a fuzz test runs: all of them in `make test`, a share in `make test-fast`.

`make test-fast` runs for every change and has 3 minutes on 2 cores; the fuzzers (hypothesis and
schemathesis) were a sixth of its CPU at their full counts. It sets WARMSTART_TEST_FUZZ_SCALE=0.25; `make
test` (and CI) leaves it unset, so every count stated beside a test is what the whole suite runs."""

from __future__ import annotations

import os
from collections.abc import Mapping

VARIABLE = "WARMSTART_TEST_FUZZ_SCALE"


def scale(environ: Mapping[str, str] = os.environ) -> float:
    raw = environ.get(VARIABLE, "1")
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:  # nan fails too
        raise ValueError(f"{VARIABLE}={raw!r}: expected a share of the full counts, above 0 and at most 1")
    return value


def cases(full: int, environ: Mapping[str, str] = os.environ) -> int:
    """`full` scaled by this run's share, at least 1."""
    return max(1, round(full * scale(environ)))
