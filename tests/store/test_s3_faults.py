"""The S3 tier under the faults a real store brings, injected by a proxy in front of a real
S3-protocol server (moto on loopback; `warmstart_dev.throttle` with its fault modes): every
request throttled (503 SlowDown), bodies cut mid-read, responses stalled past the read timeout,
connections refused, a server without ListMultipartUploads. A fault costs a bounded time, is
retried where it is transient, and then skips the tier: never a crash, never a bad bundle.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from helpers.files import tree, write
from helpers.run import base_env, run_warmstart
from helpers.s3_server import s3_env
from warmstart.s3url import parse_s3_url
from warmstart.store.bundlegc import collect_garbage
from warmstart.store.publish import publish
from warmstart.store.restore import restore
from warmstart.store.s3 import S3Store
from warmstart.store.s3client import make_client
from warmstart_dev.throttle import throttled

MIB = 1024 * 1024


# The moto server (`endpoint`) and its credentials are tests/store/conftest.py's.
pytestmark = pytest.mark.usefixtures("aws_credentials")


@pytest.fixture
def bucket(endpoint) -> str:
    name = f"warm-{uuid.uuid4().hex[:12]}"
    make_client(endpoint, "us-east-1").create_bucket(Bucket=name)
    return name


def s3_store(url: str, bucket: str, *, read_timeout_s: float | None = None, **kwargs) -> S3Store:
    client = make_client(url, "us-east-1", **({"read_timeout_s": read_timeout_s} if read_timeout_s else {}))
    kwargs = {"part_size": 5 * MIB, "multipart_threshold": 6 * MIB, "range_size": MIB, "lease_settle_s": 0.2} | kwargs
    return S3Store(client, parse_s3_url(f"s3://{bucket}/warmstart"), "key-a", **kwargs)


@pytest.fixture
def local(tmp_path: Path) -> Path:
    base = tmp_path / "worker-a" / "cache"
    for i in range(12):
        write(base, f"inductor/c{i % 3}/k{i}.so", os.urandom(300 + i * 97))
    write(base, "triton/abc/kernel.cubin", os.urandom(3 * MIB + 12345))  # 4 ranges of 1 MiB
    return base


@pytest.fixture
def published(endpoint, bucket, local) -> Path:
    """A generation 1 in the bucket, published straight to the server."""
    assert publish(s3_store(endpoint, bucket), local, publisher="a", lease_wait_s=0).status == "published"
    return local


def test_a_store_that_throttles_every_request_is_skipped_in_bounded_time(endpoint, bucket, published, tmp_path):
    with throttled(endpoint, fault="slowdown", every=1) as url:
        store = s3_store(url, bucket)
        start = time.monotonic()
        result = restore(store, tmp_path / "dest", reader="r")
        restore_s = time.monotonic() - start
        again = publish(store, published, publisher="b", lease_wait_s=0)
        plan_error = None
        try:
            collect_garbage(store, ttl_s=0)
        except Exception as exc:  # what the boot would see
            plan_error = exc
    assert (result.generation, result.unavailable) == (None, True)
    assert "SlowDown" in result.problems[0]
    assert restore_s < 20, "retries are bounded"
    assert again.status == "failed" and "SlowDown" in again.detail
    assert plan_error is not None and "SlowDown" in str(plan_error), "gc says why, the boot catches it"
    assert tree(tmp_path / "dest") == {}


def test_bodies_cut_mid_read_are_fetched_again(endpoint, bucket, published, tmp_path):
    """Every second response is cut after 64 KiB: each cut range is fetched again, on its own."""
    with throttled(endpoint, fault="cut", every=2, cut_bytes=64 * 1024) as url:
        result = restore(s3_store(url, bucket, get_workers=1), tmp_path / "dest", reader="r")
    assert (result.generation, result.bad_bundles) == (1, ()), result.problems
    assert tree(tmp_path / "dest") == tree(published)


def test_a_store_that_cuts_every_body_is_skipped_and_no_bundle_is_blamed(endpoint, bucket, published, tmp_path):
    with throttled(endpoint, fault="cut", every=1, cut_bytes=1024) as url:
        result = restore(s3_store(url, bucket), tmp_path / "dest", reader="r")
    assert (result.generation, result.unavailable, result.bad_bundles) == (None, True, ())
    assert tree(tmp_path / "dest") == {}


def test_a_stalled_store_costs_the_read_timeout_not_the_boot(endpoint, bucket, published, tmp_path):
    with throttled(endpoint, fault="stall", every=1) as url:
        store = s3_store(url, bucket, read_timeout_s=1.0)
        start = time.monotonic()
        result = restore(store, tmp_path / "dest", reader="r")
        seconds = time.monotonic() - start
    assert (result.generation, result.unavailable) == (None, True)
    assert seconds < 15
    assert "timed out" in result.problems[0] or "ReadTimeout" in result.problems[0]


def test_refused_connections_skip_the_tier(endpoint, bucket, published, tmp_path):
    with throttled(endpoint, fault="refuse", every=1) as url:
        result = restore(s3_store(url, bucket), tmp_path / "dest", reader="r")
        again = publish(s3_store(url, bucket), published, publisher="b", lease_wait_s=0)
    assert (result.generation, result.unavailable) == (None, True)
    assert again.status == "failed"


def test_gc_runs_the_rest_of_its_plan_without_list_multipart_uploads(endpoint, bucket, local, tmp_path):
    """Each publish collects garbage; on a store without ListMultipartUploads the old generation
    and its bundles still go."""
    with throttled(endpoint, fault="nouploads") as url:
        store = s3_store(url, bucket)
        for n in range(3):  # three generations: the oldest is beyond the two kept
            write(local, f"inductor/new/n{n}.so", os.urandom(500))
            assert publish(store, local, publisher=f"p{n}", lease_wait_s=0).status == "published"
        assert store.generation_numbers() == [2, 3]
        plan = collect_garbage(store, ttl_s=0)
        plan.execute(store)
    assert restore(s3_store(endpoint, bucket), tmp_path / "dest", reader="r").generation == 3


def test_a_boot_through_a_throttling_store_goes_on_cold(
    tmp_path, volume, tiny_model, endpoint, bucket, fake_vllm_python
):
    with throttled(endpoint, fault="slowdown", every=1) as url:
        env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_S3_URL=f"s3://{bucket}/warmstart", **s3_env(url))
        env["WARMSTART_LOCAL_CACHE"] = str(tmp_path / "l")
        result = run_warmstart(["boot", "--json"], env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert report["staged"]["publish"]["status"] == "published", "the volume tier still works"
    assert report["staged"]["s3"]["publish"]["status"] == "failed"
    warnings = [line for line in result.stderr.splitlines() if "s3 store unavailable" in line]
    assert len(warnings) == 1 and "SlowDown" in warnings[0], result.stderr[-3000:]


@pytest.mark.parametrize("skew_s", [-86400.0, 86400.0])
def test_an_s3_lease_lives_by_the_stores_clock(endpoint, bucket, skew_s):
    """Written by a host whose clock is a day off, by a process elsewhere: it holds while fresh by
    LastModified against the store's Date, and goes stale once not renewed for its TTL."""
    store = s3_store(endpoint, bucket, conditional=True)
    assert store.lease("skewed", 60).try_acquire()
    data = json.loads(store.read("publish.lease"))
    data.update(expires=data["expires"] + skew_s, host="elsewhere", machine="elsewhere", ttl_s=2)
    store.write("publish.lease", json.dumps(data).encode())
    assert not store.lease("here", 60).try_acquire()
    time.sleep(3.2)
    assert store.lease("here", 60).try_acquire()


def test_a_boot_through_a_store_that_stalls_every_response_is_bounded_by_its_deadlines(
    tmp_path, volume, tiny_model, endpoint, bucket, fake_vllm_python
):
    """Every response held back for ever: without a deadline one listing costs about 90 s (30 s
    read timeout, three attempts) and a publish many of those. With 3 s deadlines the boot skips
    the S3 tier with one warning line that names the store and the reason, starts cold, publishes
    to the volume, abandons the S3 publish at its deadline, and exits 0."""
    with throttled(endpoint, fault="stall", every=1) as url:
        env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_S3_URL=f"s3://{bucket}/warmstart", **s3_env(url))
        env.update(
            WARMSTART_LOCAL_CACHE=str(tmp_path / "l"),
            WARMSTART_RESTORE_DEADLINE_S="3",
            WARMSTART_PUBLISH_DEADLINE_S="3",
        )
        start = time.monotonic()
        result = run_warmstart(["boot", "--json"], env, timeout=150)
        seconds = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    restore_s = report["phases"]["restore"]
    assert restore_s is not None and restore_s < 3 + 1.5, report["phases"]
    assert seconds < 3 + 3 + 60, f"deadlines 3 s + 3 s, then a cold boot of the scripted engine: {seconds:.0f} s"
    assert report["staged"]["restored_from"] is None
    assert report["staged"]["publish"]["status"] == "published", "the volume tier still works"
    s3_publish = report["staged"]["s3"]["publish"]
    assert s3_publish["status"] == "failed" and "WARMSTART_PUBLISH_DEADLINE_S" in s3_publish["detail"]
    warnings = [line for line in result.stderr.splitlines() if "store unavailable" in line]
    assert len(warnings) == 1, result.stderr[-3000:]
    assert f"s3://{bucket}/warmstart" in warnings[0] and "WARMSTART_RESTORE_DEADLINE_S" in warnings[0]
    assert not [p for p in (tmp_path / "l").rglob("*") if ".restoring-" in p.name], "nothing partial kept"
