"""A generation's canary record and its distrust, on the store: published, carried, skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.files import tree, write
from warmstart.store.publish import publish
from warmstart.store.restore import restore
from warmstart.store.volume import StagedStore

CANARY = {"format": 1, "prompts": ["p"], "max_tokens": 1, "answers": [], "latency_s": 0.1}


@pytest.fixture
def local(tmp_path: Path) -> Path:
    base = tmp_path / "a" / "cache"
    write(base, "inductor/c0/k.so", os.urandom(300))
    return base


@pytest.fixture
def store(tmp_path: Path) -> StagedStore:
    return StagedStore(tmp_path / "volume" / "key" / "staged")


def test_the_canary_is_published_in_the_generation_and_carried_by_a_delta(store, local, tmp_path):
    assert publish(store, local, publisher="a", lease_wait_s=0, canary=CANARY).generation == 1
    assert store.load(1).canary == CANARY
    other = tmp_path / "b" / "cache"
    assert restore(store, other, reader="b").canary == CANARY
    write(other, "triton/x/new.cubin", b"y" * 10)
    assert publish(store, other, publisher="b", lease_wait_s=0).generation == 2
    assert store.load(2).canary == CANARY, "a delta with no canary of its own keeps its base's"


def test_a_distrusted_generation_is_never_restored_nor_built_on(store, local, tmp_path):
    publish(store, local, publisher="a", lease_wait_s=0, canary=CANARY)
    good = store.load(1).files["inductor/c0/k.so"]
    bad = tmp_path / "bad" / "cache"
    restore(store, bad, reader="bad")
    write(bad, "inductor/c0/k.so", b"altered" * 10)
    assert publish(store, bad, publisher="bad", lease_wait_s=0).generation == 2
    store.distrust(2, "canary differed", by="w")
    assert store.distrusted_numbers() == {2}
    assert store.latest()[0].number == 1
    dest = tmp_path / "c" / "cache"
    result = restore(store, dest, reader="c")
    assert result.generation == 1
    assert any("generation 2: distrusted" in p for p in result.problems)
    assert tree(dest) == tree(local)
    # The cold reboot's publish builds on generation 1, under a new number, never on the distrusted one.
    write(dest, "triton/y/cold.cubin", b"z" * 5)
    again = publish(store, dest, publisher="c", lease_wait_s=0, canary={**CANARY, "latency_s": 0.2})
    assert again.generation == 3
    assert store.load(3).files["inductor/c0/k.so"].sha256 == good.sha256
    assert store.load(3).canary["latency_s"] == 0.2
