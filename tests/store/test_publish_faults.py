"""Publish under what compilers do to a cache while it is read: a writer appending to a file while
a publish runs, a file rewritten in place, a key at its bundle limit (compaction), hard links."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from helpers.files import tree, write
from warmstart.store.publish import MAX_BUNDLES, publish
from warmstart.store.restore import restore
from warmstart.store.volume import StagedStore


@pytest.fixture
def store(tmp_path: Path) -> StagedStore:
    return StagedStore(tmp_path / "volume" / "key" / "staged")


def local_cache(tmp_path: Path, name: str, files: int = 5) -> Path:
    base = tmp_path / name / "cache"
    for i in range(files):
        write(base, f"inductor/{name}/k{i}.so", os.urandom(300 + i))
    return base


def test_a_file_written_while_a_publish_runs_is_published_whole_afterwards(store, tmp_path):
    """A real writer thread appends to a cache file while the publish reads the cache: its partial
    bytes are never indexed, and once it is finished the next publish takes it whole."""
    local = local_cache(tmp_path, "a")
    target = local / "triton" / "abc" / "kernel.cubin"
    target.parent.mkdir(parents=True)
    chunks = [os.urandom(64 * 1024) for _ in range(20)]
    started, published = threading.Event(), threading.Event()

    def writer() -> None:
        with open(target, "wb") as handle:
            for n, chunk in enumerate(chunks):
                handle.write(chunk)
                handle.flush()
                if n == 3:
                    started.set()
                    published.wait(10)  # the publish runs now, the file half-written and open
                time.sleep(0.005)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert started.wait(10)
        first = publish(store, local, publisher="a", lease_wait_s=0)
    finally:
        published.set()
        thread.join()
    assert first.status == "published"
    assert "triton/abc/kernel.cubin" not in store.load(1).files, "its bytes were not stable"
    second = publish(store, local, publisher="a", lease_wait_s=0)
    assert (second.status, second.files) == ("published", 1)
    dest = tmp_path / "b" / "cache"
    assert restore(store, dest, reader="b").generation == 2
    assert (dest / "triton/abc/kernel.cubin").read_bytes() == b"".join(chunks)


def test_a_file_rewritten_in_place_is_new(store, tmp_path):
    """An autotune result or a start-up plan saved again at the same path, same size, other bytes."""
    local = local_cache(tmp_path, "a")
    assert publish(store, local, publisher="a", lease_wait_s=0).status == "published"
    dest = tmp_path / "b" / "cache"
    assert restore(store, dest, reader="b").generation == 1
    rewritten = dest / "inductor/a/k2.so"
    new_bytes = os.urandom(rewritten.stat().st_size)
    rewritten.write_bytes(new_bytes)
    again = publish(store, dest, publisher="b", lease_wait_s=0)
    assert (again.status, again.files) == ("published", 1)
    assert "holds other bytes of" in again.detail
    fresh = tmp_path / "c" / "cache"
    assert restore(store, fresh, reader="c").generation == 2
    assert (fresh / "inductor/a/k2.so").read_bytes() == new_bytes
    # The same bytes compiled cold by another worker (another mtime) are not new.
    twin = tmp_path / "d" / "cache"
    write(twin, "inductor/a/k2.so", new_bytes)
    assert publish(store, twin, publisher="d", lease_wait_s=0).status == "nothing_new"


def test_compaction_writes_the_union_not_only_the_local_files(store, tmp_path):
    other = local_cache(tmp_path, "other")
    assert publish(store, other, publisher="other", lease_wait_s=0).status == "published"
    mine = tmp_path / "mine" / "cache"
    for n in range(MAX_BUNDLES):  # one bundle per publish, up to the limit
        write(mine, f"inductor/mine/n{n}.so", os.urandom(400))
        assert publish(store, mine, publisher="mine", lease_wait_s=0).status == "published"
    newest = store.load(store.generation_numbers()[-1])
    assert len(newest.bundles) == 1, "the last publish compacted"
    dest = tmp_path / "fresh" / "cache"
    assert restore(store, dest, reader="fresh").restored
    assert tree(dest) == tree(other) | tree(mine)


def test_hard_links_are_packed_so_that_restore_takes_them(store, tmp_path):
    local = local_cache(tmp_path, "a")
    os.link(local / "inductor/a/k1.so", local / "inductor/a/k1-alias.so")
    os.symlink("k2.so", local / "inductor/a/k2-link.so")
    assert publish(store, local, publisher="a", lease_wait_s=0).status == "published"
    dest = tmp_path / "b" / "cache"
    result = restore(store, dest, reader="b")
    assert (result.generation, result.problems) == (1, ())
    assert (dest / "inductor/a/k1-alias.so").read_bytes() == (local / "inductor/a/k1.so").read_bytes()
    assert publish(store, dest, publisher="b", lease_wait_s=0).status == "nothing_new"
