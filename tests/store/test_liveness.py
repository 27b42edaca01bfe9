"""Liveness that survives pid namespaces and clock skew: a lease names its machine and pid
namespace, and its age is read on the store's clock, never on the writer's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from warmstart.store.folder import PublishLease, StagedStore

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")

TRY_ACQUIRE = """
import sys
from pathlib import Path
from warmstart.store.folder import PublishLease, StagedStore
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
        time.sleep(0.3)
    assert time.time() - store.lease_path.stat().st_mtime < 5


LIVE_KEYS = """
import sys
from pathlib import Path
from warmstart.store.booting import live_boot_keys
from warmstart.store.layout import VolumeLayout
print(sorted(live_boot_keys(VolumeLayout(Path(sys.argv[1]), on_volume=True))))
"""


def test_a_boot_marker_is_live_for_a_collector_in_another_pid_namespace(tmp_path):
    """gc in a container sharing the hostname must not take a booting key for abandoned."""
    from warmstart.store.booting import write_boot_marker
    from warmstart.store.layout import VolumeLayout

    write_boot_marker(VolumeLayout(tmp_path, on_volume=True), "key-1", "worker-1", 600)
    result = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", LIVE_KEYS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['key-1']"
