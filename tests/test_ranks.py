"""The report per rank (report/ranks.py): each worker's compile cache from its own lines, and each rank
directory's files, so a rank that compiled while the others loaded is named (issue 37).

The TP logs here are built from the 0.33 fixtures' worker lines with the prefixes vLLM gives its workers
(vllm/processes.py cites the source); the real TP=2 boot is tests/test_boot_vllm_tp.py, the corpus's real TP
logs are read at the end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from warmstart.report.fromlog import report_from_log
from warmstart.report.ranks import dir_entries, rank_dir, ranks_block, ranks_lines
from warmstart.tree import TreeScan
from warmstart.vllm.phases import LogEvidence
from warmstart.vllm.processes import rank_order, worker_process

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("(Worker_TP3 pid=812) INFO 12-01 10:00:41 [default_loader.py:507] Loading weights", "Worker_TP3"),
        ("(Worker_DP0_TP1_DCP1_EP1 pid=1134) INFO 02-22 23:21:09 [backends.py:350] Cache", "Worker_DP0_TP1_DCP1_EP1"),
        ("2026-05-01 23:11:07.242 | (Worker_PP1_TP0 pid=9) INFO 05-01 23:11:07 [x.py:1] y", "Worker_PP1_TP0"),
        ("(VllmWorker rank=4 pid=842) INFO 07-10 12:50:15 [gpu_model_runner.py:1801] Model", "VllmWorker rank=4"),
        ("(VllmWorker-0 pid=77) INFO 03-01 10:00:00 [worker.py:1] x", "VllmWorker-0"),
        ("(Worker pid=300) INFO 12-01 10:00:30 [model_runner.py:399] Loading model", "Worker"),
        ("(EngineCore_DP0 pid=200) INFO 12-01 10:00:18 [core.py:140] Initializing", None),
        ("(APIServer pid=100) INFO 12-01 10:00:00 [api_utils.py:286] non-default args", None),
        # a worker's prefix quoted deep inside another line (a config dump) is not that line's writer
        ("(EngineCore pid=2) INFO 12-01 10:00:18 [core.py:1] config: " + "x" * 400 + " (Worker_TP1 pid=3)", None),
    ],
)
def test_the_worker_is_read_from_the_prefix_vllm_writes(line, name):
    assert worker_process(line) == name


def test_ranks_sort_by_their_numbers_not_as_text():
    names = ["Worker_TP10", "Worker_TP2", "Worker_TP1", "Worker_TP9"]
    assert sorted(names, key=rank_order) == ["Worker_TP1", "Worker_TP2", "Worker_TP9", "Worker_TP10"]


def _tp_log(compiled_ranks: set[int], size: int = 4) -> list[str]:
    """A TP boot's log: the engine's lines, then each rank's worker lines (the cold fixture's for the ranks
    that compile, the warm fixture's for the others), each under its own prefix."""
    warm = (FIXTURES / "gpu-0.33-noaot-warm.log").read_text().splitlines()
    cold = (FIXTURES / "gpu-0.33-noaot-cold.log").read_text().splitlines()
    lines = [line for line in warm if not line.startswith("(Worker pid=")]
    for rank in range(size):
        source = cold if rank in compiled_ranks else warm
        for line in source:
            if line.startswith("(Worker pid=300)"):
                line = line.replace("(Worker pid=300)", f"(Worker_TP{rank} pid={300 + rank})")
                lines.append(line.replace("/rank_0_0/", f"/rank_{rank}_0/"))
    return lines


def test_one_rank_that_compiled_while_the_others_loaded_is_named_with_its_seconds():
    report = report_from_log(_tp_log({2}), year=2026)
    workers = report.ranks["workers"]
    assert [w["process"] for w in workers] == ["Worker_TP0", "Worker_TP1", "Worker_TP2", "Worker_TP3"]
    assert [w["compile"] for w in workers] == ["hit", "hit", "miss", "hit"]
    assert workers[2]["graphs_compiled"] == 1 and workers[0]["graphs_loaded"] == 1
    assert workers[2]["compile_s"] == 94.05 and workers[0]["compile_s"] == 6.02
    assert workers[2]["load_s"] == 33.91 and workers[1]["capture_s"] == 14.0
    (line,) = [text for text in report.lines() if "| ranks" in text]
    assert "4 workers" in line and "loaded on 3" in line and "compiled on 1 (Worker_TP2 94.05 s)" in line
    assert "the boot waited for the slowest, Worker_TP2 (94.05 s)" in line
    assert report.to_dict()["ranks"]["workers"][2]["process"] == "Worker_TP2"  # in the JSON line too


def test_ranks_that_all_loaded_say_so_without_a_slowest():
    (line,) = ranks_lines(report_from_log(_tp_log(set()), year=2026).ranks)
    assert "loaded on 4" in line and "compiled" not in line and "slowest" not in line


def test_a_boot_of_one_worker_has_no_ranks_block():
    lines = (FIXTURES / "gpu-0.33-noaot-cold.log").read_text().splitlines()
    report = report_from_log(lines, year=2026)
    assert report.ranks is None and not [text for text in report.lines() if "| ranks" in text]


def test_rank_directories_count_what_each_held_and_gained():
    """From VLLM_CACHE_ROOT's scans before and after a boot: rank_3_0 lost its files (not restored) and
    compiled again; the others held theirs. The line names the one that gained."""
    hashed = "torch_compile_cache/1a2b3c4d5e"
    before = TreeScan("/c", {f"{hashed}/rank_{r}_0/backbone/f{i}": (1, 1) for r in (0, 1, 2) for i in range(3)})
    after = TreeScan("/c", {**before.files, **{f"{hashed}/rank_3_0/backbone/f{i}": (1, 1) for i in range(4)}})
    dirs = dir_entries(before, after)
    assert dirs == [
        {"rank_dir": "rank_0_0", "files_before": 3, "files_added": 0},
        {"rank_dir": "rank_1_0", "files_before": 3, "files_added": 0},
        {"rank_dir": "rank_2_0", "files_before": 3, "files_added": 0},
        {"rank_dir": "rank_3_0", "files_before": 0, "files_added": 4},
    ]
    (line,) = ranks_lines(ranks_block(LogEvidence(), before, after))
    assert line == "4 rank directories in vLLM's compile cache: 9 files before the boot, 4 added (rank_3_0 +4)"
    assert dir_entries(None, TreeScan("/c", {f"{hashed}/rank_0_0/x": (1, 1)})) == []  # one rank: no block
    assert rank_dir("torch_compile_cache/torch_aot_compile/ab/rank_7_1/model") == "rank_7_1"
    assert rank_dir("inductor_cache/rank_of_things/x") is None


def test_the_real_tp8_log_names_each_ranks_worker():
    """issue20783's log (vLLM 0.9, `VllmWorker rank=N`): seven workers wrote lines a table reads."""
    path = FIXTURES / "real" / "issue20783-0.9-vllmworker-tp8.log"
    report = report_from_log(path.read_text().splitlines(), year=2025)
    workers = report.ranks["workers"]
    assert [w["process"] for w in workers] == [f"VllmWorker rank={r}" for r in (0, 1, 2, 3, 4, 5, 7)]
    assert workers[5]["rank_dir"] == "rank_5_0" and workers[1]["load_s"] == 1.702619
