"""A deadline on a whole tier's restore and publish (store/deadline.py), under real stalls: a
volume read that blocks (a FIFO where a generation file should be: `open` waits for a writer that
never comes, as a read from a network file system that stopped answering does), and an S3-protocol
server behind the fault proxy that holds responses back. Past the deadline the tier is skipped,
nothing of its restore is kept, and the restore left behind never writes the local cache later.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from helpers.files import tree, write
from warmstart.s3url import parse_s3_url
from warmstart.store.backend import GENERATIONS
from warmstart.store.bundle import gen_name
from warmstart.store.publish import publish
from warmstart.store.s3 import S3Store
from warmstart.store.s3client import make_client
from warmstart.store.tiers import publish_tier, restore_tiers
from warmstart.store.volume import StagedStore
from warmstart_dev.throttle import throttled

MIB = 1024 * 1024


def left_behind(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"warmstart-{name}" and t.is_alive()]


def wait_gone(name: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while left_behind(name) and time.monotonic() < end:
        time.sleep(0.05)
    assert not left_behind(name), f"the {name} left behind never stopped"


def published_volume(root: Path, local: Path) -> StagedStore:
    write(local, "inductor/a/k.so", os.urandom(5000))
    write(local, "triton/b/kernel.cubin", os.urandom(70_000))
    store = StagedStore(root / "staged")
    assert publish(store, local, publisher="p", lease_wait_s=0).status == "published"
    return store


def test_a_hung_volume_costs_one_deadline_and_its_late_restore_writes_nothing(tmp_path, caplog):
    """The generation file is a FIFO: reading it blocks until a writer opens it. The restore is
    skipped at its deadline with one warning naming the store and the reason; once unblocked,
    the restore left behind must not empty or replace the cache the boot went on with."""
    store = published_volume(tmp_path / "key", tmp_path / "publisher")
    generation = store.root / GENERATIONS / gen_name(1)
    generation.unlink()
    os.mkfifo(generation)
    dest = tmp_path / "cache"
    write(dest, "old/left.so", b"from an earlier boot")
    start = time.monotonic()
    restored = restore_tiers([store], dest, reader="r", ttl_s=60, deadline_s=1.5)
    seconds = time.monotonic() - start
    assert 1.4 < seconds < 1.5 + 5, seconds  # the margin: a loaded machine, not the store
    assert not restored.restored and restored.result is not None and restored.result.unavailable
    assert restored.bad_bundles == {"volume": ()}, "a stalled store blames no bundle"
    assert tree(dest) == {}, "the boot goes on cold, from an empty cache"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "volume store unavailable" in warnings[0] and str(store.root) in warnings[0]
    assert "WARMSTART_RESTORE_DEADLINE_S" in warnings[0] and "stuck reading generation 1" in warnings[0]

    write(dest, "inductor/cold/k.so", b"what the cold boot compiles meanwhile")
    with open(generation, "wb"):  # unblock the reader: it reads nothing, a bad index, and goes on
        pass
    wait_gone("restore")
    assert tree(dest) == {"inductor/cold/k.so": b"what the cold boot compiles meanwhile"}
    assert [p.name for p in tmp_path.iterdir() if ".restoring-" in p.name] == []


def test_a_restore_within_its_deadline_is_untouched_by_it(tmp_path):
    store = published_volume(tmp_path / "key", tmp_path / "publisher")
    restored = restore_tiers([store], tmp_path / "cache", reader="r", ttl_s=60, deadline_s=30)
    assert restored.restored and tree(tmp_path / "cache") == tree(tmp_path / "publisher")
    assert not left_behind("restore")


@pytest.fixture
def bucket(endpoint) -> str:
    name = f"deadline-{uuid.uuid4().hex[:12]}"
    make_client(endpoint, "us-east-1").create_bucket(Bucket=name)
    return name


def s3_store(url: str, bucket: str, *, read_timeout_s: float = 30.0, **kwargs) -> S3Store:
    client = make_client(url, "us-east-1", read_timeout_s=read_timeout_s)
    kwargs = {"range_size": MIB, "lease_settle_s": 0.2, "get_workers": 1} | kwargs
    return S3Store(client, parse_s3_url(f"s3://{bucket}/warmstart"), "key-a", **kwargs)


@pytest.mark.usefixtures("aws_credentials")
def test_an_s3_restore_that_stalls_mid_bundle_keeps_nothing_and_writes_nothing_late(endpoint, bucket, tmp_path):
    """Every third response is held back; each stall costs the 1 s read timeout and is retried, so
    the restore would finish, later than its 2 s deadline. Past the deadline: skipped, no bundle
    blamed, the cache empty; when the restore left behind ends, the cache is still the boot's."""
    local = tmp_path / "publisher"
    write(local, "triton/abc/kernel.cubin", os.urandom(4 * MIB + 5))  # five ranged GETs of 1 MiB
    write(local, "inductor/x/k.so", os.urandom(3000))
    assert publish(s3_store(endpoint, bucket), local, publisher="p", lease_wait_s=0).status == "published"
    dest = tmp_path / "cache"
    with throttled(endpoint, fault="stall", every=3) as url:
        start = time.monotonic()
        restored = restore_tiers([s3_store(url, bucket, read_timeout_s=1.0)], dest, reader="r", ttl_s=60, deadline_s=2)
        seconds = time.monotonic() - start
        assert seconds < 2 + 5, seconds  # the margin: a loaded machine
        assert not restored.restored and restored.bad_bundles == {"s3": ()}
        assert "WARMSTART_RESTORE_DEADLINE_S" in restored.problems[0]
        assert tree(dest) == {}
        write(dest, "inductor/cold/k.so", b"the cold boot's")
        wait_gone("restore")
    assert tree(dest) == {"inductor/cold/k.so": b"the cold boot's"}
    assert [p.name for p in tmp_path.iterdir() if ".restoring-" in p.name] == []
    assert s3_store(endpoint, bucket).names("readers") == {}, "its reader registration went with it"


@pytest.mark.usefixtures("aws_credentials")
def test_a_publish_to_a_stalled_store_is_abandoned_at_its_deadline(endpoint, bucket, tmp_path, caplog):
    local = tmp_path / "cache"
    write(local, "inductor/x/k.so", os.urandom(3000))
    with throttled(endpoint, fault="stall", every=1) as url:
        start = time.monotonic()
        store = s3_store(url, bucket, read_timeout_s=1.0)
        result = publish_tier(store, local, publisher="p", lease_wait_s=0, lease_ttl_s=60, deadline_s=2)
        seconds = time.monotonic() - start
    assert result.status == "failed" and seconds < 2 + 5, (result, seconds)  # without: 90 s a request
    assert "WARMSTART_PUBLISH_DEADLINE_S" in result.detail and "previous generation is intact" in result.detail
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "WARMSTART_PUBLISH_DEADLINE_S" in warnings[0], warnings
    wait_gone("publish")
    assert s3_store(endpoint, bucket).generation_numbers() == [], "the publish left behind created nothing"


def test_seeding_from_a_hung_sibling_costs_one_deadline_and_goes_on_to_the_next(tmp_path):
    """Seeding (issue 21) restores a sibling key's layers as a tier's restore does: each source
    within the restore deadline. The nearest sibling's generation file is a FIFO (a hung read): it
    is given up at the deadline and the next sibling seeds the key."""
    from warmstart.store.seed import seed_from, sibling_opener
    from warmstart.store.siblings import SeedPlan, SeedSource

    keys = tmp_path / "keys"
    hung = published_volume(keys / "key-hung", tmp_path / "hung-publisher")
    good = published_volume(keys / "key-good", tmp_path / "good-publisher")
    generation = hung.root / GENERATIONS / gen_name(1)
    generation.unlink()
    os.mkfifo(generation)
    sources = (SeedSource("key-hung", "volume", {}), SeedSource("key-good", "volume", {}))
    plan = SeedPlan(("inductor", "triton"), sources)
    dest = tmp_path / "cache"
    start = time.monotonic()
    try:
        seeded = seed_from(
            plan, dest, sibling_opener(keys / "key-own" / "staged", None), reader="r", ttl_s=60, deadline_s=1.5
        )
        seconds = time.monotonic() - start
    finally:
        with open(generation, "wb"):  # unblock the reader left behind
            pass
    wait_gone("restore")
    assert seeded.source is not None and seeded.source.key == "key-good"
    assert any("WARMSTART_RESTORE_DEADLINE_S" in p for p in seeded.problems), seeded.problems
    assert 1.4 < seconds < 1.5 + 5, seconds
    assert tree(dest) == tree(tmp_path / "good-publisher")
    assert good.generation_numbers() == [1]


@pytest.mark.usefixtures("aws_credentials")
def test_listing_the_siblings_of_a_stalled_s3_store_costs_one_deadline(endpoint, bucket, tmp_path):
    """Planning a seed lists the S3 store's keys before vLLM starts (issue 21): a store that holds
    every response back costs the restore deadline there, and the plan says why it has no S3 sibling."""
    from warmstart.store.siblings import plan_seed

    with throttled(endpoint, fault="stall", every=1) as url:
        start = time.monotonic()
        plan = plan_seed("key-a", {}, None, s3_store(url, bucket, read_timeout_s=1.0), "--cpu--", deadline_s=2)
        seconds = time.monotonic() - start
        wait_gone("siblings")
    assert seconds < 2 + 5, seconds
    assert plan.sources == () and "could not be listed" in plan.note and "WARMSTART_RESTORE_DEADLINE_S" in plan.note
