"""`bench chaos`, wired: a few rounds end to end (seconds), and checks that do catch a violation."""

from __future__ import annotations

import json
import os

import pytest

from helpers.files import write
from warmstart.store.publish import publish
from warmstart.store.volume import StagedStore
from warmstart_dev.chaos import bench_chaos, check_round


@pytest.mark.fuse
def test_a_few_rounds_of_chaos_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "chaos")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "chaos-secret")
    result = bench_chaos(tmp_path / "chaos", rounds=2, workers=2, fault_rate=0.1, kill_rate=1.0, seed=3)
    assert result["benchmark"] == "chaos" and result["rounds"] == 2
    assert result["violations"] == 0, result["violation_examples"]
    assert result["kills"] <= 2 and result["boots"] >= 2
    assert sum(result["publishes"].values()) >= 1
    assert json.dumps(result)


def test_the_checks_see_bytes_no_writer_finished_and_a_file_left_out_of_the_union(tmp_path):
    store = StagedStore(tmp_path / "staged")
    local = tmp_path / "local"
    write(local, "inductor/w/k.so", os.urandom(100))
    journal = tmp_path / "journal.jsonl"
    journal.write_text(
        json.dumps({"event": "finished", "rel": "inductor/w/other.so", "sha": "0" * 64, "t": 0.0, "who": "w"})
        + "\n"
        + json.dumps({"event": "publish", "who": "w", "tier": "volume", "status": "published", "started": 1.0})
        + "\n"
    )
    assert publish(store, local, publisher="w", lease_wait_s=0).status == "published"
    violations = check_round([store], journal, tmp_path / "scratch")
    assert any("holds bytes no writer finished" in v for v in violations), violations
    assert any("inductor/w/other.so finished before a publish yet not in the union" in v for v in violations)


def test_a_bundle_rewritten_after_it_was_verified_is_read_again(tmp_path):
    """The checks read each bundle once (a round costs what it added); a bundle that a later
    generation still references is read again if its object changed, even at the same size."""
    import hashlib

    from warmstart_dev.chaos import Verified

    store = StagedStore(tmp_path / "staged")
    local = tmp_path / "local"
    journal = tmp_path / "journal.jsonl"

    def compile_one(rel: str) -> None:
        data = os.urandom(3000)
        write(local, rel, data)
        sha = hashlib.sha256(data).hexdigest()
        with open(journal, "a") as handle:
            handle.write(json.dumps({"event": "finished", "rel": rel, "sha": sha, "t": 0.0, "who": "w"}) + "\n")

    compile_one("inductor/w/a.so")
    assert publish(store, local, publisher="w", lease_wait_s=0).status == "published"
    verified = Verified()
    assert check_round([store], journal, tmp_path / "scratch", verified) == []
    (first,) = store.bundles.iterdir()
    compile_one("inductor/w/b.so")
    assert publish(store, local, publisher="w", lease_wait_s=0).status == "published"
    assert check_round([store], journal, tmp_path / "scratch", verified) == [], "the old bundle is not read again"
    compile_one("inductor/w/c.so")
    assert publish(store, local, publisher="w", lease_wait_s=0).status == "published"
    data = bytearray(first.read_bytes())
    data[-2000] ^= 0xFF  # a flipped byte, same size, the same file rewritten in place
    first.write_bytes(bytes(data))
    violations = check_round([store], journal, tmp_path / "scratch", verified)
    assert any("generation 3 does not verify" in v and first.name in v for v in violations), violations
