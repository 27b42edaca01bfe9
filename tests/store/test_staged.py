"""Staged caches on a plain folder: generations, deltas, corruption, the lease, garbage."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from helpers.files import tree, write
from warmstart.store import publish as staged
from warmstart.store.bundlegc import collect_garbage
from warmstart.store.publish import PublishPlan, execute_publish, plan_publish, publish
from warmstart.store.restore import restore
from warmstart.store.volume import PublishLease, StagedStore
from warmstart.tree import scan_tree


@pytest.fixture
def local(tmp_path: Path) -> Path:
    base = tmp_path / "worker-a" / "cache"
    for i in range(30):
        write(base, f"inductor/c{i % 4}/k{i}.so", os.urandom(100 + i * 37))
    write(base, "triton/abc/kernel.cubin", os.urandom(5000))
    write(base, "vllm/torch_compile_cache/h1/rank_0_0/backbone/artifact", os.urandom(20000))
    return base


@pytest.fixture
def store(tmp_path: Path) -> StagedStore:
    return StagedStore(tmp_path / "volume" / "key" / "staged")


def test_publish_then_restore_roundtrip(store, local, tmp_path):
    result = publish(store, local, publisher="a", lease_wait_s=0)
    assert (result.status, result.generation, result.files) == ("published", 1, 32)
    assert result.per_layer == {
        "inductor": (30, sum(100 + i * 37 for i in range(30))),
        "triton": (1, 5000),
        "vllm_compile": (1, 20000),
    }
    dest = tmp_path / "worker-b" / "cache"
    write(dest, "inductor/stale/left-over.so", b"old")  # a restore replaces, it does not merge
    restored = restore(store, dest, reader="b")
    assert restored.generation == 1
    assert tree(dest) == tree(local)
    for rel in tree(local):
        assert (dest / rel).stat().st_mtime_ns == (local / rel).stat().st_mtime_ns
    assert not list(store.readers.iterdir()), "a finished restore leaves no reader registration"


def test_second_worker_publishes_only_what_is_missing(store, local, tmp_path):
    publish(store, local, publisher="a", lease_wait_s=0)
    other = tmp_path / "worker-b" / "cache"
    restore(store, other, reader="b")
    assert publish(store, other, publisher="b", lease_wait_s=0).status == "nothing_new"
    write(other, "triton/def/new.cubin", b"x" * 777)
    result = publish(store, other, publisher="b", lease_wait_s=0)
    assert (result.status, result.generation, result.files) == ("published", 2, 1)
    gen = store.load(2)
    assert len(gen.bundles) == 2, "a delta references the earlier bundle"
    assert set(gen.files) == set(tree(local)) | {"triton/def/new.cubin"}
    third = tmp_path / "worker-c" / "cache"
    assert restore(store, third, reader="c").generation == 2
    assert tree(third) == tree(other)


def test_racing_publishers_never_clobber_and_merge(store, local, tmp_path):
    publish(store, local, publisher="a", lease_wait_s=0)
    a = tmp_path / "a" / "cache"
    b = tmp_path / "b" / "cache"
    restore(store, a, reader="a")
    restore(store, b, reader="b")
    write(a, "triton/a/only-a.cubin", b"a" * 10)
    write(b, "triton/b/only-b.cubin", b"b" * 20)
    plan_a = plan_publish(store, a)
    plan_b = plan_publish(store, b)  # both plan on generation 1, as two lease holders might
    assert execute_publish(store, a, plan_a, publisher="a").generation == 2
    assert execute_publish(store, b, plan_b, publisher="b").generation == 3
    merged = store.load(3)
    assert {"triton/a/only-a.cubin", "triton/b/only-b.cubin"} <= set(merged.files)
    assert store.load(2).files.keys() <= merged.files.keys()


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_corrupt_bundle_is_detected_reported_and_replaced(store, local, tmp_path, damage):
    publish(store, local, publisher="a", lease_wait_s=0)
    bundle = store.bundles / store.load(1).bundles[0].name
    if damage == "flip":
        flip_byte(bundle, bundle.stat().st_size // 2)  # inside a file's data: only the checksum sees it
    elif damage == "truncate":
        bundle.write_bytes(bundle.read_bytes()[:3000])
    else:
        bundle.unlink()
    dest = tmp_path / "b" / "cache"
    result = restore(store, dest, reader="b")
    assert result.generation is None, "a corrupt generation is never restored"
    assert tree(dest) == {}
    assert len(result.problems) == 1 and bundle.name in result.problems[0]
    assert result.bad_bundles == (bundle.name,)
    # The next publish writes a fresh generation that does not reference the bad bundle.
    republished = publish(store, local, publisher="c", lease_wait_s=0, distrust=result.bad_bundles)
    assert (republished.status, republished.generation, republished.files) == ("published", 2, 32)
    assert bundle.name not in {b.name for b in store.load(2).bundles}
    assert restore(store, tmp_path / "d" / "cache", reader="d").generation == 2


def test_corrupt_newest_falls_back_to_the_previous_generation(store, local, tmp_path):
    publish(store, local, publisher="a", lease_wait_s=0)
    write(local, "triton/new/k.cubin", b"n" * 100)
    publish(store, local, publisher="a", lease_wait_s=0)
    (store.generations_dir / "g00000002.json").write_text("{not json")
    result = restore(store, tmp_path / "b" / "cache", reader="b")
    assert result.generation == 1
    assert "g00000002.json: unreadable" in result.problems[0]


def test_lease_is_exclusive_and_expires(store):
    first = PublishLease(store, "a", ttl_s=60)
    second = PublishLease(store, "b", ttl_s=60)
    assert first.try_acquire()
    assert not second.try_acquire()
    first.release()
    assert second.try_acquire()
    # A holder elsewhere that died loses it once not renewed for its TTL, on the volume's clock.
    data = json.loads(store.lease_path.read_text())
    data.update(host="elsewhere", machine="elsewhere")
    store.lease_path.write_text(json.dumps(data))
    assert not PublishLease(store, "c").try_acquire()
    past = time.time() - 61
    os.utime(store.lease_path, (past, past))
    assert PublishLease(store, "c").try_acquire()


def test_lease_of_a_killed_process_on_this_host_is_stale(store):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    lease = PublishLease(store, "dead", ttl_s=600)
    assert lease.try_acquire()
    data = json.loads(store.lease_path.read_text())
    data["pid"] = proc.pid  # a pid that no longer runs
    store.lease_path.write_text(json.dumps(data))
    assert PublishLease(store, "alive").try_acquire()


def test_busy_lease_skips_publish(store, local):
    holder = PublishLease(store, "a", ttl_s=60)
    assert holder.try_acquire()
    result = publish(store, local, publisher="b", lease_wait_s=0.2)
    assert result.status == "skipped"
    assert store.generation_numbers() == []


def test_garbage_keeps_recent_and_read_generations(store, local, monkeypatch):
    for i in range(5):
        write(local, f"triton/g{i}/k.cubin", bytes([i]) * 100)
        execute_publish(store, local, plan_publish(store, local), publisher="a")
    assert store.generation_numbers() == [1, 2, 3, 4, 5]
    reader = store.readers / "r.json"
    reader.write_text(
        json.dumps({"generation": 2, "bundles": [b.name for b in store.load(2).bundles], "expires": time.time() + 60})
    )
    assert collect_garbage(store, ttl_s=600).generations == ("g00000001.json", "g00000003.json")
    plan = collect_garbage(store, ttl_s=0)
    plan.execute(store)
    assert store.generation_numbers() == [2, 4, 5]
    referenced = {b.name for n in (2, 4, 5) for b in store.load(n).bundles}
    assert {p.name for p in store.bundles.iterdir()} == referenced
    reader.unlink()
    collect_garbage(store, ttl_s=0).execute(store)
    assert store.generation_numbers() == [4, 5]


def test_too_many_deltas_are_compacted(store, local, monkeypatch):
    monkeypatch.setattr(staged, "MAX_BUNDLES", 3)
    for i in range(4):
        write(local, f"triton/x{i}/k.cubin", b"k" * 10)
        publish(store, local, publisher="a", lease_wait_s=0)
    assert len(store.load(3).bundles) == 3
    assert len(store.load(4).bundles) == 1


# What each writer names a file before renaming it into place, where it read (vLLM 0.33, torch 2.13, Triton 3.9).
LEFT_BY_KILLED_WRITERS = [
    "inductor/fxgraph/ab/.4242.139872.tmp",  # torch/_inductor/codecache.py write_atomic
    "vllm/torch_compile_cache/torch_aot_compile/0f/rank_0_0/model.4242.tmp",  # vllm/compilation/decorators.py
    "vllm/startup_plan/plan.json.tmp.4242",  # vllm/v1/worker/startup_plan.py
    "flashinfer_autotune/.cache.json.k3x9_a.tmp",  # vllm/.../warmup/flashinfer_autotune_cache.py mkstemp
    "triton/tmp.pid_4242_1b4e28ba-2fa1-11d2-883f-0016d3cca427/kernel.cubin",  # triton/runtime/cache.py put
]


def test_files_a_killed_writer_left_under_temporary_names_are_never_published(store, local, tmp_path):
    for rel in LEFT_BY_KILLED_WRITERS:
        write(local, rel, b"half of it")
    write(local, "triton/ok/kernel.tmpl", b"a real entry whose name merely looks alike")
    write(local, "inductor/ok/tmp.json", b"another")
    result = publish(store, local, publisher="a", lease_wait_s=0)
    assert result.status == "published"
    held = set(store.load(result.generation).files)
    assert not held & set(LEFT_BY_KILLED_WRITERS)
    assert {"triton/ok/kernel.tmpl", "inductor/ok/tmp.json"} <= held
    assert held == set(tree(local)) - set(LEFT_BY_KILLED_WRITERS)
    # Nothing else changed: the leftovers are not "new" either, so no empty generation follows.
    assert publish(store, local, publisher="a", lease_wait_s=0).status == "nothing_new"


def test_a_compaction_drops_temporary_files_an_older_worker_published(store, local, tmp_path, monkeypatch):
    """Generations written before this rule may hold such files: a full rewrite leaves them out of the union."""
    write(local, LEFT_BY_KILLED_WRITERS[0], b"half of it")
    older = PublishPlan(None, dict(scan_tree(local).files), True, "an older worker's publish")
    assert execute_publish(store, local, older, publisher="old").generation == 1
    assert LEFT_BY_KILLED_WRITERS[0] in store.load(1).files
    other = tmp_path / "worker-b" / "cache"
    write(other, "triton/b/new.cubin", b"b" * 9)
    monkeypatch.setattr(staged, "MAX_BUNDLES", 1)
    result = publish(store, other, publisher="b", lease_wait_s=0)
    assert result.generation == 2 and len(store.load(2).bundles) == 1, "compacted"
    held = set(store.load(2).files)
    assert LEFT_BY_KILLED_WRITERS[0] not in held
    assert held == set(tree(local)) - {LEFT_BY_KILLED_WRITERS[0]} | {"triton/b/new.cubin"}, "the rest is the union"


def test_dry_run_plans_without_writing(store, local):
    plan = plan_publish(store, local)
    assert plan.full and len(plan.files) == 32 and plan.bytes > 0
    assert not store.root.exists()
    assert collect_garbage(store, ttl_s=0).generations == ()


def test_planning_a_publish_compares_the_forms_of_paths_once_not_once_per_file(tmp_path, monkeypatch):
    """Found by the rehearsal (docs/rehearsal.md): a warm TP 8 boot's publish of a 3,762-file tree that
    held nothing new ran over 5 minutes of CPU, because plan_publish compared every local path's forms
    against the store once per local file (older_forms inside the comprehension's condition: quadratic)."""
    local = tmp_path / "cache"
    for i in range(40):
        write(local, f"inductor/d{i % 5}/f{i}.py", b"x")
    store = StagedStore(tmp_path / "store")
    assert publish(store, local, publisher="a", lease_wait_s=0).status == "published"
    calls = []
    real = staged.older_forms
    monkeypatch.setattr(staged, "older_forms", lambda *a: calls.append(1) or real(*a))
    plan = plan_publish(store, local)
    assert plan.empty and len(calls) == 1
