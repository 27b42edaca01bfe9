"""The S3 tier against a real S3-protocol server (moto's server mode on loopback, started here).

Store-level tests drive `store.s3.S3Store` through the same restore/publish/garbage code as
the volume; boot-level fault tests use the scripted engine (a fault must be injected on cue)
and real vLLM proves the two-datacenter story (test_two_datacenters_share_one_bucket).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from helpers.files import tree, write
from helpers.run import WARMSTART, base_env, run_warmstart
from helpers.s3_server import ACCESS_KEY, SECRET_KEY, moto_server, s3_env
from warmstart.engine.ports import free_port
from warmstart.s3url import parse_s3_url
from warmstart.settings import SettingsError, from_env
from warmstart.store.bundlegc import collect_garbage
from warmstart.store.publish import execute_publish, plan_publish, publish
from warmstart.store.restore import restore
from warmstart.store.s3 import S3Store
from warmstart.store.s3client import CONNECT_TIMEOUT_S, MAX_ATTEMPTS, make_client
from warmstart_dev.testmodel import write_test_model
from warmstart_dev.throttle import throttled

MIB = 1024 * 1024


# The moto server (`endpoint`) and its credentials are tests/store/conftest.py's.
pytestmark = pytest.mark.usefixtures("aws_credentials")


@pytest.fixture
def client(endpoint):
    return make_client(endpoint, "us-east-1")


@pytest.fixture
def bucket(client) -> str:
    name = f"warm-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


def s3_store(client, bucket: str, **kwargs) -> S3Store:
    # Small parts and ranges, so that test-sized bundles take the multipart and parallel paths.
    kwargs = {"part_size": 5 * MIB, "multipart_threshold": 6 * MIB, "range_size": MIB, "lease_settle_s": 0.2} | kwargs
    return S3Store(client, parse_s3_url(f"s3://{bucket}/warmstart"), "key-a", **kwargs)


@pytest.fixture
def local(tmp_path: Path) -> Path:
    base = tmp_path / "worker-a" / "cache"
    for i in range(40):
        write(base, f"inductor/c{i % 5}/k{i}.so", os.urandom(200 + i * 91))
    write(base, "triton/abc/kernel.cubin", os.urandom(13 * MIB))  # 3 parts of 5 MiB
    write(base, "vllm/torch_compile_cache/h1/rank_0_0/backbone/artifact", os.urandom(30000))
    return base


def keys(client, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_settings_accept_an_s3_url_and_refuse_bad_ones():
    settings = from_env(
        {"MODEL_NAME": "org/m", "WARMSTART_S3_URL": "s3://vol123/warmstart", "WARMSTART_S3_REGION": "EU-RO-1"}
    )
    assert (settings.s3_url, settings.s3_region) == ("s3://vol123/warmstart", "EU-RO-1")
    assert parse_s3_url("s3://vol123/warmstart/").key("keys/k") == "warmstart/keys/k"
    assert parse_s3_url("s3://vol123").key("keys/k") == "keys/k"
    with pytest.raises(SettingsError) as err:
        from_env(
            {
                "MODEL_NAME": "org/m",
                "WARMSTART_S3_URL": "https://vol123/warmstart",
                "WARMSTART_S3_ENDPOINT_URL": "https://user:pw@s3api-eu-ro-1.runpod.io",
            }
        )
    assert any(p.startswith("WARMSTART_S3_URL=") for p in err.value.problems)
    assert any(p.startswith("WARMSTART_S3_ENDPOINT_URL: must not carry credentials") for p in err.value.problems)
    assert not any("pw" in p for p in err.value.problems if p.startswith("WARMSTART_S3_ENDPOINT_URL"))


def test_publish_multipart_then_restore_with_ranged_gets(client, bucket, local, tmp_path):
    store = s3_store(client, bucket)
    result = publish(store, local, publisher="a", lease_wait_s=0)
    assert (result.status, result.generation, result.files) == ("published", 1, 42)
    (bundle,) = store.names("bundles")
    head = client.head_object(Bucket=bucket, Key=f"warmstart/keys/key-a/staged/bundles/{bundle}")
    assert head["ContentLength"] > 13 * MIB and head["ETag"].endswith('-3"'), "a 3-part multipart upload"
    dest = tmp_path / "worker-b" / "cache"
    write(dest, "inductor/stale/left-over.so", b"old")
    restored = restore(store, dest, reader="b")
    assert (restored.generation, restored.source, restored.problems) == (1, "s3", ())
    assert tree(dest) == tree(local)
    for rel in tree(local):
        assert (dest / rel).stat().st_mtime_ns == (local / rel).stat().st_mtime_ns
    # The volume's layout under the prefix, few objects, no reader registration left.
    assert keys(client, bucket) == [
        "warmstart/.warmstart-conditional-probe",
        f"warmstart/keys/key-a/staged/bundles/{bundle}",
        "warmstart/keys/key-a/staged/generations/g00000001.json",
    ]
    assert publish(store, dest, publisher="b", lease_wait_s=0).status == "nothing_new"


@pytest.mark.parametrize("conditional", [True, False], ids=["if-none-match", "read-after-write-lease"])
def test_two_publishers_at_once_both_land_in_one_generation(client, bucket, local, tmp_path, conditional):
    probe = s3_store(client, bucket)
    assert probe.conditional_writes() is True, "moto honours If-None-Match"
    publish(probe, local, publisher="seed", lease_wait_s=0)
    caches = {}
    for name in ("dc-a", "dc-b"):
        caches[name] = tmp_path / name / "cache"
        restore(s3_store(client, bucket, conditional=conditional), caches[name], reader=name)
        write(caches[name], f"triton/{name}/only-{name}.cubin", os.urandom(3000))
    barrier = threading.Barrier(2)
    results = {}

    def run(name: str) -> None:
        store = s3_store(client, bucket, conditional=conditional)
        barrier.wait()
        results[name] = publish(store, caches[name], publisher=name, lease_wait_s=30, lease_ttl_s=60)

    threads = [threading.Thread(target=run, args=(n,)) for n in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status for r in results.values()) == ["published", "published"], results
    assert sorted(r.generation for r in results.values()) == [2, 3]
    store = s3_store(client, bucket)
    newest, _ = store.latest()
    assert newest.number == 3
    assert {"triton/dc-a/only-dc-a.cubin", "triton/dc-b/only-dc-b.cubin"} <= set(newest.files)
    check = tmp_path / "check"
    assert restore(store, check, reader="check").generation == 3
    assert tree(check) == tree(caches["dc-a"]) | tree(caches["dc-b"])
    assert not store.exists("publish.lease"), "the lease is released"


@pytest.mark.parametrize("conditional", [True, False], ids=["if-none-match", "read-after-write-lease"])
def test_the_lease_is_exclusive_and_expires(client, bucket, conditional):
    store = s3_store(client, bucket, conditional=conditional)
    first, second = store.lease("a", 60), store.lease("b", 60)
    assert first.try_acquire()
    assert not second.try_acquire()
    first.release()
    assert not store.exists("publish.lease")
    assert second.try_acquire()
    # A holder that died elsewhere loses the lease once not renewed for its TTL, on the store's clock.
    data = json.loads(store.read("publish.lease"))
    data.update(ttl_s=1, host="elsewhere", machine="elsewhere")
    store.write("publish.lease", json.dumps(data).encode())
    assert not store.lease("c", 60).try_acquire()
    time.sleep(2.2)  # LastModified and Date: whole seconds
    third = store.lease("c", 60)
    assert third.try_acquire()
    assert json.loads(store.read("publish.lease"))["holder"] == "c"
    second.release()  # no longer its lease: it must not remove c's
    assert json.loads(store.read("publish.lease"))["holder"] == "c"
    third.release()

    # Two workers that both find no lease and write theirs at once: exactly one holds it.
    barrier = threading.Barrier(2)
    held = {}

    def take(name: str) -> None:
        lease = s3_store(client, bucket, conditional=conditional, lease_settle_s=0.5).lease(name, 60)
        barrier.wait()
        held[name] = lease.try_acquire()

    threads = [threading.Thread(target=take, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(held.values()) == [False, True], held
    assert json.loads(store.read("publish.lease"))["holder"] == next(n for n, h in held.items() if h)


def test_racing_generation_creates_never_clobber(client, bucket, local, tmp_path):
    """Two publishers that both think they may publish (no lease at all): the conditional
    create lets one have generation 2; the other builds on it as generation 3."""
    store = s3_store(client, bucket)
    publish(store, local, publisher="seed", lease_wait_s=0)
    a, b = tmp_path / "a", tmp_path / "b"
    restore(store, a, reader="a")
    restore(store, b, reader="b")
    write(a, "triton/a/x.cubin", b"a" * 10)
    write(b, "triton/b/y.cubin", b"b" * 20)
    plan_a, plan_b = plan_publish(store, a), plan_publish(store, b)
    assert execute_publish(store, a, plan_a, publisher="a").generation == 2
    assert execute_publish(store, b, plan_b, publisher="b").generation == 3
    assert store.load(2).files.keys() <= store.load(3).files.keys()
    assert {"triton/a/x.cubin", "triton/b/y.cubin"} <= set(store.load(3).files)


def test_an_interrupted_multipart_upload_leaves_the_store_as_it_was(client, bucket, local, tmp_path):
    store = s3_store(client, bucket)
    publish(store, local, publisher="seed", lease_wait_s=0)
    before = keys(client, bucket)
    write(local, "triton/new/big.cubin", os.urandom(12 * MIB))
    calls = {"n": 0}
    upload_part = client.upload_part

    def flaky(**kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionResetError("connection lost mid-upload")
        return upload_part(**kwargs)

    client.upload_part = flaky
    try:
        failed = publish(store, local, publisher="a", lease_wait_s=0)
    finally:
        client.upload_part = upload_part
    assert failed.status == "failed" and "previous generation is intact" in failed.detail
    assert keys(client, bucket) == before, "no bundle, generation or lease appeared"
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == [], "the upload was aborted"

    # A worker killed mid-upload cannot abort: its upload stays until the collector, after the TTL.
    key = "warmstart/keys/key-a/staged/bundles/0123456789abcdef-deadbeef.tar"
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=os.urandom(5 * MIB))
    assert restore(store, tmp_path / "b", reader="b").generation == 1
    # (moto reports every upload as initiated in 2010, so the TTL itself is not tested here.)
    plan = collect_garbage(store, ttl_s=600)
    assert plan.temporaries == (f".uploads/{upload}/bundles/0123456789abcdef-deadbeef.tar",)
    plan.execute(store)
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert publish(store, local, publisher="a", lease_wait_s=0).generation == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_corrupt_object_is_detected_and_never_referenced_again(client, bucket, local, tmp_path, damage):
    store = s3_store(client, bucket)
    publish(store, local, publisher="a", lease_wait_s=0)
    ref = store.load(1).bundles[0]
    key = f"warmstart/keys/key-a/staged/bundles/{ref.name}"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF  # inside a file's data: only the checksum sees it
        client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    elif damage == "truncate":
        client.put_object(Bucket=bucket, Key=key, Body=bytes(data[: len(data) // 3]))
    else:
        client.delete_object(Bucket=bucket, Key=key)
    dest = tmp_path / "b" / "cache"
    result = restore(store, dest, reader="b")
    assert (result.generation, result.unavailable) == (None, False)
    assert tree(dest) == {}
    assert result.bad_bundles == (ref.name,)
    assert len(result.problems) == 1 and ref.name in result.problems[0]
    republished = publish(store, local, publisher="c", lease_wait_s=0, distrust=result.bad_bundles)
    assert (republished.status, republished.generation, republished.files) == ("published", 2, 42)
    assert ref.name not in {b.name for b in store.load(2).bundles}
    assert restore(store, tmp_path / "d" / "cache", reader="d").generation == 2


def test_an_unreachable_endpoint_is_reported_not_fatal(tmp_path, local):
    client = make_client(f"http://127.0.0.1:{free_port()}", "us-east-1")  # nothing listens there
    config = client.meta.config
    assert (config.connect_timeout, config.retries["total_max_attempts"]) == (CONNECT_TIMEOUT_S, MAX_ATTEMPTS)
    store = s3_store(client, "nobody")
    result = restore(store, tmp_path / "dest", reader="r")
    assert (result.generation, result.unavailable, result.bad_bundles) == (None, True, ())
    assert "S3 endpoint unreachable" in result.problems[0]
    published = publish(store, local, publisher="a", lease_wait_s=0)
    assert published.status == "failed" and "unreachable" in published.detail


def test_wrong_credentials_are_refused_and_never_printed(tmp_path, local):
    with moto_server(auth=True) as url:  # every access key is unknown to this server
        store = s3_store(make_client(url, "us-east-1"), "nobody")
        result = restore(store, tmp_path / "dest", reader="r")
        published = publish(store, local, publisher="a", lease_wait_s=0)
    assert (result.generation, result.unavailable, result.bad_bundles) == (None, True, ())
    assert "S3 refused the request (InvalidAccessKeyId)" in result.problems[0]
    assert published.status == "failed" and "credentials" in published.detail
    assert SECRET_KEY not in json.dumps([result.problems, published.detail])


def boot_env(volume: Path, python: str, home: Path, endpoint: str, bucket: str, **extra: str) -> dict[str, str]:
    env = base_env(volume, python, home, WARMSTART_S3_URL=f"s3://{bucket}/warmstart", **s3_env(endpoint))
    env.update(extra)
    return env


def test_boot_goes_on_when_the_store_is_unreachable(tmp_path, volume, tiny_model, fake_vllm_python):
    dead = f"http://127.0.0.1:{free_port()}"
    env = boot_env(volume, fake_vllm_python, tmp_path, dead, "nobody", WARMSTART_LOCAL_CACHE=str(tmp_path / "l"))
    result = run_warmstart(["boot", "--json"], env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["expected"] == "miss" and report["verdict"] is not None
    assert "s3 store unavailable, going on without it: S3 endpoint unreachable" in result.stderr
    assert report["staged"]["publish"]["status"] == "published", "the volume still gets its generation"
    assert report["staged"]["s3"]["publish"]["status"] == "failed"
    assert any(w.startswith("s3: publish failed") for w in report["warnings"])
    assert SECRET_KEY not in result.stderr + result.stdout


def test_boot_with_refused_credentials_goes_on_and_prints_no_secret(tmp_path, tiny_model, volume, fake_vllm_python):
    with moto_server(auth=True) as url:
        env = boot_env(volume, fake_vllm_python, tmp_path, url, "nobody", WARMSTART_LOCAL_CACHE=str(tmp_path / "l"))
        result = run_warmstart(["boot", "--json"], env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "S3 refused the request (InvalidAccessKeyId)" in result.stderr
    report = json.loads(result.stdout)
    assert report["staged"]["s3"]["publish"]["status"] == "failed"
    assert SECRET_KEY not in result.stderr + result.stdout
    boots = "".join(p.read_text() for p in volume.rglob("boots.jsonl"))
    assert SECRET_KEY not in boots and ACCESS_KEY not in boots


def test_tiers_with_the_scripted_engine(tmp_path, endpoint, client, bucket, fake_vllm_python):
    """The wiring, fast: what volume A publishes reaches volume B and a volume-less worker
    through the store; B's restore is written through to volume B; an empty volume with a
    generation in the store restores from the store, a volume with one restores from it."""
    volume_a, volume_b = tmp_path / "dc-a", tmp_path / "dc-b"
    for volume in (volume_a, volume_b):
        write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")

    def boot(volume: Path, local: str, **extra: str) -> dict:
        python = fake_vllm_python
        env = boot_env(volume, python, tmp_path, endpoint, bucket, **{"WARMSTART_LOCAL_CACHE": str(tmp_path / local)})
        env.update(extra)
        result = run_warmstart(["boot", "--json"], env, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout)

    a = boot(volume_a, "local-a", FAKE_VLLM_ARTIFACTS="5:20000:a")
    assert (a["staged"]["restored_from"], a["staged"]["publish"]["status"]) == (None, "published")
    assert a["staged"]["s3"]["publish"]["status"] == "published"
    assert a["staged"]["s3"]["store"].startswith(f"s3://{bucket}/warmstart/keys/")

    b = boot(volume_b, "local-b")
    assert (b["expected"], b["staged"]["restored_from"]) == ("hit", "s3")
    assert b["caches"]["inductor"]["restored_files"] == 6
    assert b["staged"]["publish"]["status"] == "published", "written through to volume B"
    assert b["staged"]["s3"]["publish"]["status"] == "nothing_new"

    again = boot(volume_b, "local-b2")
    assert again["staged"]["restored_from"] == "volume", "B's volume now serves B's workers"

    image_hub = volume_a / "huggingface-cache" / "hub"
    c = boot(tmp_path / "no-volume", "local-c", WARMSTART_BAKED_HF_CACHE=str(image_hub))
    assert (c["on_volume"], c["expected"], c["staged"]["restored_from"]) == (False, "hit", "s3")
    assert c["staged"]["publish"]["status"] == "nothing_new"
    assert "s3" in c["staged"] and c["staged"]["s3"]["publish"] == c["staged"]["publish"]


def serve_until_published(env: dict[str, str], log_path: Path) -> dict:
    """Run `warmstart serve` (local API server) until the boot report shows the S3 publish done."""
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [WARMSTART, "serve", "--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                try:
                    request = urllib.request.Request(
                        f"http://127.0.0.1:{port}/runsync",
                        data=json.dumps({"input": {"warmstart": "boot_report"}}).encode(),
                        headers={"content-type": "application/json"},
                    )
                    with urllib.request.urlopen(request, timeout=30) as resp:
                        output = json.loads(resp.read())["output"]
                    report = output[0] if isinstance(output, list) else output  # an aggregated stream
                    if report["staged"]["s3"]["publish"] is not None:
                        return report
                except (urllib.error.URLError, ConnectionError, KeyError, TypeError):
                    pass
                time.sleep(0.5)
            raise AssertionError(log_path.read_text()[-3000:])
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def test_serve_publishes_to_the_store_in_the_background(
    tmp_path, volume, tiny_model, endpoint, bucket, fake_vllm_python
):
    """The store is slow (300 ms per request): jobs are taken before its publish ends."""
    with throttled(endpoint, latency_ms=300, mbps=100) as slow:
        env = boot_env(volume, fake_vllm_python, tmp_path, slow, bucket, WARMSTART_LOCAL_CACHE=str(tmp_path / "l"))
        report = serve_until_published(env, tmp_path / "serve.log")
    assert report["staged"]["s3"]["publish"]["status"] == "published"
    log = (tmp_path / "serve.log").read_text()
    assert log.index("warmstart | serve    | taking jobs") < log.index("warmstart | publish  | s3 generation 1")

    dead = f"http://127.0.0.1:{free_port()}"
    env = boot_env(volume, fake_vllm_python, tmp_path, dead, bucket, WARMSTART_LOCAL_CACHE=str(tmp_path / "l2"))
    report = serve_until_published(env, tmp_path / "serve-dead.log")
    assert report["staged"]["s3"]["publish"]["status"] == "failed", "and the worker went on serving jobs"


@pytest.mark.vllm
def test_two_datacenters_share_one_bucket(tmp_path, endpoint, client, bucket, vllm_python, default_cold_boot):
    """Volume A and volume B (two datacenters) and a worker with no volume share one bucket:
    A holds a cold boot's generation (a copy of the run's shared cold boot, tests/helpers/sharedboot.py:
    the same key, the S3 tier being no key factor) and its first boot with the bucket set publishes it
    there; B's first boot restores from the store and is warm (and writes the generation through to
    volume B); the volume-less boot restores from the store, warm. (A cold boot that publishes to the
    bucket itself is test_tiers_with_the_scripted_engine's; A booting cold here cost about 30 s of CPU.)"""
    volume_a, cold = default_cold_boot.copy_to(tmp_path / "dc-a")
    volume_b = tmp_path / "dc-b"
    write_test_model(volume_b / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    image_hub = volume_a / "huggingface-cache" / "hub"  # the no-volume worker's model: baked in the image

    def boot(volume: Path, local: str, **extra: str) -> dict:
        env = boot_env(volume, vllm_python, tmp_path, endpoint, bucket, WARMSTART_LOCAL_CACHE=str(tmp_path / local))
        env.update(extra)
        result = run_warmstart(["boot", "--json"], env, timeout=900)
        assert result.returncode == 0, result.stderr[-4000:]
        report = json.loads(result.stdout)
        staged = report["staged"]
        print(  # the figures, with pytest -s
            f"{volume.name}: {report['verdict']} ready {report['ready_s']} s, restore {report['phases']['restore']} s "
            f"from {staged['restored_from']}, publish {staged['publish']}, s3 publish {staged['s3']['publish']}"
        )
        return report

    a = boot(volume_a, "local-a")
    assert (cold["expected"], cold["verdict"]) == ("miss", "cold") and "s3" not in cold["staged"]
    assert cold["staged"]["publish"]["status"] == "published"
    assert (a["expected"], a["verdict"]) == ("hit", "warm"), a["caches"]
    assert (a["staged"]["restored_from"], a["staged"]["publish"]["status"]) == ("volume", "nothing_new")
    assert a["staged"]["s3"]["publish"]["status"] == "published"

    b = boot(volume_b, "local-b")
    assert b["staged"]["restored_from"] == "s3"
    assert (b["expected"], b["verdict"]) == ("hit", "warm"), b["caches"]
    assert b["caches"]["inductor"]["restored_files"] > 0
    assert b["staged"]["publish"]["status"] == "published", "written through to volume B"
    assert b["staged"]["s3"]["publish"]["status"] in ("nothing_new", "published")  # what the warm boot added
    assert list((volume_b / "warmstart" / "keys").glob("*/staged/generations/g00000001.json"))

    c = boot(tmp_path / "no-volume", "local-c", WARMSTART_BAKED_HF_CACHE=str(image_hub))
    assert c["on_volume"] is False
    assert c["staged"]["restored_from"] == "s3"
    assert (c["expected"], c["verdict"]) == ("hit", "warm"), c["caches"]
    assert c["staged"]["publish"]["status"] in ("nothing_new", "published")
    assert cold["key"] == a["key"] == b["key"] == c["key"]


def test_a_distrusted_generation_in_s3_is_never_restored_nor_built_on(client, bucket, tmp_path):
    store = s3_store(client, bucket)
    base = tmp_path / "a" / "cache"
    write(base, "inductor/c0/k.so", os.urandom(300))
    publish(store, base, publisher="a", lease_wait_s=0, canary={"format": 1})
    write(base, "inductor/c0/k.so", b"altered" * 10)
    assert publish(store, base, publisher="a", lease_wait_s=0).generation == 2
    store.distrust(2, "canary differed", by="w")
    assert "warmstart/keys/key-a/staged/distrusted/g00000002.json" in keys(client, bucket)
    assert store.distrusted_numbers() == {2}
    assert store.latest()[0].number == 1
    restored = restore(store, tmp_path / "b" / "cache", reader="b")
    assert restored.generation == 1 and restored.canary == {"format": 1}
