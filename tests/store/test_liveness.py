"""Liveness that survives pid namespaces and clock skew: a lease names its machine and pid
namespace, and its age is read on the store's clock, never on the writer's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from warmstart.store.volume import PublishLease, StagedStore

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")

TRY_ACQUIRE = """
import sys
from pathlib import Path
from warmstart.store.volume import PublishLease, StagedStore
print(PublishLease(StagedStore(Path(sys.argv[1])), "other-namespace", ttl_s=60).try_acquire())
"""


def in_new_pid_namespace(root: Path) -> str:
    """`try_acquire` from a process in a pid namespace of its own (same hostname, same kernel)."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid not permitted here: {probe.stderr.decode()[-200:]}")
    result = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", TRY_ACQUIRE, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_a_live_lease_holds_against_a_worker_in_another_pid_namespace(tmp_path):
    store = StagedStore(tmp_path / "staged")
    lease = PublishLease(store, "here", ttl_s=60)
    assert lease.try_acquire()
    assert in_new_pid_namespace(store.root) == "False", "its pid is absent there, yet it is alive"
    assert json.loads(store.lease_path.read_text())["holder"] == "here"
    lease.release()
    assert in_new_pid_namespace(store.root) == "True"


@pytest.mark.parametrize("skew_s", [-86400.0, 86400.0])
def test_expiry_is_judged_on_the_store_clock_not_the_writers(tmp_path, skew_s):
    """A lease written by a host whose clock is a day off: fresh on the volume's clock, it holds;
    not renewed for its TTL on the volume's clock, it is stale, whatever its `expires` says."""
    store = StagedStore(tmp_path / "staged")
    assert PublishLease(store, "skewed", ttl_s=60).try_acquire()
    data = json.loads(store.lease_path.read_text())
    data.update(expires=data["expires"] + skew_s, host="elsewhere", machine="elsewhere", pid=1)
    store.lease_path.write_text(json.dumps(data))  # written now, on the volume's clock
    assert not PublishLease(store, "here", ttl_s=60).try_acquire()
    past = time.time() - 120
    os.utime(store.lease_path, (past, past))  # last written two minutes ago, on the volume's clock
    assert PublishLease(store, "here", ttl_s=60).try_acquire()


def test_a_held_lease_is_renewed_while_its_publish_runs(tmp_path):
    store = StagedStore(tmp_path / "staged")
    lease = PublishLease(store, "slow", ttl_s=60)
    assert lease.try_acquire()
    past = time.time() - 50
    os.utime(store.lease_path, (past, past))
    with lease.renewed(0.05):
        # Renewed every 0.05 s: seen within 10 s even on a loaded machine (a fixed 0.3 s was not, once
        # beside a test suite and a soak on 2 cores); a lease never renewed stays 50 s old and fails.
        deadline = time.monotonic() + 10
        while time.time() - store.lease_path.stat().st_mtime >= 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert time.time() - store.lease_path.stat().st_mtime < 5


LIVE_KEYS = """
import sys
from pathlib import Path
from warmstart.store.markers import live_boot_keys
from warmstart.store.layout import VolumeLayout
print(sorted(live_boot_keys(VolumeLayout(Path(sys.argv[1]), on_volume=True))))
"""


def test_a_boot_marker_is_live_for_a_collector_in_another_pid_namespace(tmp_path):
    """gc in a container sharing the hostname must not take a booting key for abandoned."""
    from warmstart.store.layout import VolumeLayout
    from warmstart.store.markers import write_boot_marker

    write_boot_marker(VolumeLayout(tmp_path, on_volume=True), "key-1", "worker-1", 600)
    result = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", LIVE_KEYS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['key-1']"


def skewed_marker(layout, key: str, worker: str, skew_s: float) -> Path:
    """A boot marker as a host whose clock is `skew_s` off writes it, from another machine (so no
    pid can prove it dead here): its recorded times are off, its file's mtime is the volume's."""
    from warmstart.store.history import read_json, write_json_atomic
    from warmstart.store.markers import write_boot_marker

    marker = write_boot_marker(layout, key, worker, 600)
    data = read_json(marker)
    data.update(expires=data["expires"] + skew_s, host="elsewhere", machine="elsewhere", pid=1)
    write_json_atomic(marker, data)  # written now, on the volume's clock
    return marker


@pytest.mark.parametrize("skew_s", [-86400.0, 86400.0])
def test_a_boot_marker_expires_on_the_volumes_clock_not_the_writers(tmp_path, skew_s):
    """gc keeps a key whose marker is fresh on the volume's clock, whatever its `expires` says,
    and takes one that was not written or renewed for its TTL for dead, whatever `expires` says."""
    from warmstart.store.gc import GcOptions, plan_gc
    from warmstart.store.layout import VolumeLayout
    from warmstart.store.markers import live_boot_keys
    from warmstart.store.scan import scan_volume

    layout = VolumeLayout(tmp_path, on_volume=True)
    (layout.keys_dir / "key-1").mkdir(parents=True)
    marker = skewed_marker(layout, "key-1", "worker-1", skew_s)
    assert live_boot_keys(layout) == {"key-1"}
    plan = plan_gc(scan_volume(layout), GcOptions(older_than_days=0))
    assert plan.remove_keys == () and "boot of this key is in progress" in plan.kept_because["key-1"]

    past = time.time() - 1200  # last written 20 minutes ago on the volume's clock: past its 600 s
    os.utime(marker, (past, past))
    assert live_boot_keys(layout) == set()
    plan = plan_gc(scan_volume(layout), GcOptions(older_than_days=0))
    assert [k.name for k in plan.remove_keys] == ["key-1"]


def test_the_serving_upkeep_renews_its_marker_on_the_volumes_clock(tmp_path):
    """A serving worker's marker is renewed by the upkeep (worker/upkeep.py): the renewal moves
    the file's mtime, so a worker that has served past the TTL keeps its key."""
    from types import SimpleNamespace

    from warmstart.report.model import BootReport
    from warmstart.store.layout import VolumeLayout
    from warmstart.store.markers import live_boot_keys
    from warmstart.worker.upkeep import MARKER_TTL_S, ServingUpkeep

    layout = VolumeLayout(tmp_path, on_volume=True)
    plan = SimpleNamespace(
        layout=layout,
        key=SimpleNamespace(dirname="key-1"),
        model=SimpleNamespace(repo_id="org/model", revision="abc"),
        tiers=(),
    )
    boot = SimpleNamespace(plan=plan, worker="worker-1", store=None, marker=None, published=None)
    report = BootReport(None, None, None, None, None, {}, {}, None)
    keeper = ServingUpkeep(boot, report, interval_s=60.0)  # type: ignore[arg-type]
    keeper.mark_serving()
    marker = boot.marker
    assert live_boot_keys(layout) == {"key-1"}
    past = time.time() - 2 * MARKER_TTL_S
    os.utime(marker, (past, past))  # served past its TTL without a renewal
    assert live_boot_keys(layout) == set()
    keeper.mark_serving()
    assert live_boot_keys(layout) == {"key-1"}
    assert time.time() - marker.stat().st_mtime < 60


SKEWED_COLLECTOR = """
import json, sys, time
_real = time.time
time.time = lambda: _real() + float(sys.argv[1])  # this host's clock runs off (the store's does not)
from pathlib import Path
from warmstart.store.bundlegc import collect_garbage
if sys.argv[2] == "volume":
    from warmstart.store.volume import StagedStore
    store = StagedStore(Path(sys.argv[3]))
else:
    from warmstart.s3url import parse_s3_url
    from warmstart.store.s3 import S3Store
    from warmstart.store.s3client import make_client
    store = S3Store(make_client(sys.argv[3], "us-east-1"), parse_s3_url(sys.argv[4]), "key-a")
print("ready", flush=True)
sys.stdin.readline()  # started and imported: collect the moment the test says so
plan = collect_garbage(store, ttl_s=float(sys.argv[5]))
print(json.dumps({"generations": plan.generations, "bundles": plan.bundles, "temporaries": plan.temporaries}))
"""


@pytest.mark.parametrize("tier", ["volume", "s3"])
@pytest.mark.parametrize("skew_s", [-86400.0, 86400.0])
def test_a_collector_whose_clock_is_a_day_off_judges_every_age_on_the_stores_clock(
    tmp_path, tier, skew_s, request, monkeypatch
):
    """The collector runs on a host whose clock is a day ahead or behind. It must keep a bundle a
    publish wrote a moment ago (not indexed yet) and a generation a fresh reader registration
    protects, and must collect a bundle and a registration that are old on the store's clock."""
    from helpers.files import write
    from warmstart.store.publish import publish
    from warmstart.store.restore import _register_reader

    if tier == "volume":
        store = StagedStore(tmp_path / "staged")
        args = [str(store.root), ""]
    else:
        from helpers.s3_server import ACCESS_KEY, SECRET_KEY
        from warmstart.s3url import parse_s3_url
        from warmstart.store.s3 import S3Store
        from warmstart.store.s3client import make_client

        endpoint = request.getfixturevalue("endpoint")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        bucket = f"skew-{os.urandom(6).hex()}"
        make_client(endpoint, "us-east-1").create_bucket(Bucket=bucket)
        url = f"s3://{bucket}/warmstart"
        store = S3Store(make_client(endpoint, "us-east-1"), parse_s3_url(url), "key-a", lease_settle_s=0.2)
        args = [endpoint, url]
    local = tmp_path / "local"
    for n in range(3):  # generations 1-3: the first is beyond the two kept, a registration protects it
        write(local, f"inductor/k{n}.so", os.urandom(2000))
        assert publish(store, local, publisher="p", lease_wait_s=0).status == "published"
        if n == 0:
            first = store.load(1)
            _register_reader(store, "live-reader", first, ttl_s=600)

    def orphan() -> str:
        writer = store.bundle_writer()
        writer.sink.write(b"x" * 1024)
        return writer.commit(1024, hashlib.sha256(b"x" * 1024).hexdigest(), 1).name

    collector = subprocess.Popen(
        [sys.executable, "-c", SKEWED_COLLECTOR, str(skew_s), tier, *args, "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    old_bundle = orphan()
    _register_reader(store, "old-reader", first, ttl_s=1)
    time.sleep(3.5)  # the collector's TTL is 2 s: these are old now on the store's clock (S3: 1 s steps)
    assert collector.stdout is not None and collector.stdout.readline().strip() == "ready"
    young_bundle = orphan()  # a publish that has not created its generation yet
    _register_reader(store, "live-reader", first, ttl_s=600)  # renewed: fresh on the store's clock
    out, err = collector.communicate("go\n", timeout=120)
    assert collector.returncode == 0, err[-2000:]
    plan = json.loads(out)
    assert plan["generations"] == [], "a live reader's generation stays"
    assert young_bundle not in plan["bundles"], "a bundle a publish is about to index stays"
    assert old_bundle in plan["bundles"], "an old unreferenced bundle goes"
    assert "readers/old-reader.json" in plan["temporaries"] and "readers/live-reader.json" not in plan["temporaries"]
