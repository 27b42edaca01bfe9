"""Staged mode on the slow mock volume (a real FUSE filesystem): faults and kill -9 trials.

The engine here is the scripted one: these tests are about what warmstart writes to the
volume when things go wrong, and only a scripted engine can be timed to die on cue.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from helpers.run import base_env, group_alive, paused_env, read_until, run_warmstart, start_warmstart
from warmstart.store.publish import publish
from warmstart.store.restore import restore
from warmstart.store.volume import StagedStore
from warmstart_dev.slowfs import is_mounted, mounted
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.fuse


def key_store(volume: Path) -> StagedStore:
    (key_dir,) = (volume / "warmstart" / "keys").iterdir()
    return StagedStore(key_dir / "staged")


def test_slowfs_supports_what_compilers_do_and_always_unmounts(tmp_path):
    mnt = tmp_path / "mnt"
    with pytest.raises(RuntimeError, match="boom"), mounted(tmp_path / "backing", mnt, latency_ms=0.5) as m:
        (m / "a" / "b").mkdir(parents=True)
        (m / "a" / "b" / "f.tmp").write_bytes(b"data")
        os.rename(m / "a" / "b" / "f.tmp", m / "a" / "b" / "f")
        os.chmod(m / "a" / "b" / "f", 0o600)
        os.utime(m / "a" / "b" / "f", ns=(1, 2))
        os.link(m / "a" / "b" / "f", m / "a" / "b" / "g")
        assert (m / "a" / "b" / "g").read_bytes() == b"data"
        assert (tmp_path / "backing" / "a" / "b" / "f").stat().st_mtime_ns == 2
        os.unlink(m / "a" / "b" / "g")
        os.unlink(m / "a" / "b" / "f")
        os.rmdir(m / "a" / "b")
        raise RuntimeError("boom")  # a failing test body must still unmount
    assert not is_mounted(mnt)


def test_enospc_while_publishing_keeps_the_previous_generation(tmp_path):
    local = tmp_path / "local" / "cache"
    (local / "inductor" / "a").mkdir(parents=True)
    (local / "inductor" / "a" / "small.so").write_bytes(os.urandom(20_000))
    with mounted(tmp_path / "backing", tmp_path / "mnt", latency_ms=0.5, quota_bytes=200_000) as m:
        store = StagedStore(m / "key" / "staged")
        assert publish(store, local, publisher="a", lease_wait_s=0).status == "published"
        (local / "triton" / "b").mkdir(parents=True)
        (local / "triton" / "b" / "big.cubin").write_bytes(os.urandom(400_000))
        failed = publish(store, local, publisher="a", lease_wait_s=0)
        assert failed.status == "failed"
        assert "No space left on device" in failed.detail
        assert "previous generation is intact" in failed.detail
        assert store.generation_numbers() == [1]
        assert not [p for p in store.bundles.iterdir() if p.name.startswith(".tmp-")], "temporaries left behind"
        assert not store.lease_path.exists(), "lease not released"
        dest = tmp_path / "other" / "cache"
        assert restore(store, dest, reader="b").generation == 1
        assert (dest / "inductor" / "a" / "small.so").read_bytes() == (
            local / "inductor" / "a" / "small.so"
        ).read_bytes()


def test_boot_survives_a_publish_that_fails(tmp_path, fake_vllm_python):
    with mounted(tmp_path / "backing", tmp_path / "volume", latency_ms=0.5, quota_bytes=3_500_000) as volume:
        write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")  # ~2.9 MB of the quota
        env = base_env(
            volume,
            fake_vllm_python,
            tmp_path,
            WARMSTART_CACHE_MODE="staged",
            WARMSTART_LOCAL_CACHE=str(tmp_path / "local"),
            FAKE_VLLM_ARTIFACTS="4:500000:x",
        )
        result = run_warmstart(["boot", "--json"], env, timeout=120)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["verdict"] == "cold"  # the engine served
        assert report["staged"]["publish"]["status"] == "failed"
        assert any("No space left on device" in w for w in report["warnings"])
        store = key_store(volume)  # nothing half-written: no generation, no temporary, no lease
        assert store.generation_numbers() == []
        assert leftovers(store) == {
            k: [] for k in ("bundle_tmp", "orphan_bundles", "generation_tmp", "readers", "lease")
        }


def test_corrupt_bundle_is_reported_in_the_boot_and_replaced(tmp_path, fake_vllm_python):
    volume = tmp_path / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    env = base_env(
        volume,
        fake_vllm_python,
        tmp_path,
        WARMSTART_CACHE_MODE="staged",
        WARMSTART_LOCAL_CACHE=str(tmp_path / "local-1"),
        FAKE_VLLM_ARTIFACTS="3:10000:a",
    )
    assert run_warmstart(["boot", "--json"], env).returncode == 0
    store = key_store(volume)
    (bundle,) = store.bundles.iterdir()
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bundle.write_bytes(bytes(data))
    env["WARMSTART_LOCAL_CACHE"] = str(tmp_path / "local-2")
    second = json.loads(run_warmstart(["boot", "--json"], env).stdout)
    assert second["expected"] == "miss"  # nothing intact to restore
    assert second["staged"]["generation_restored"] is None
    assert "fails its checksum" in second["staged"]["restore_problems"][0]
    assert any("fails its checksum" in w for w in second["warnings"])
    assert second["staged"]["publish"]["generation"] == 2
    assert bundle.name not in {b.name for b in store.load(2).bundles}
    env["WARMSTART_LOCAL_CACHE"] = str(tmp_path / "local-3")
    third = json.loads(run_warmstart(["boot", "--json"], env).stdout)
    assert (third["staged"]["generation_restored"], third["verdict"]) == (2, "warm")


def complete_generations(store: StagedStore) -> list[int]:
    """Generations whose index reads and whose every bundle is present at its recorded size."""
    good = []
    for number in store.generation_numbers():
        gen = store.load(number)
        if all((store.bundles / b.name).stat().st_size == b.size for b in gen.bundles):
            good.append(number)
    return good


# The publish's own steps, in order (warmstart.store.backend.step), then a restore's.
PUBLISH_STEPS = (
    "publish:start",
    "publish:lease_held",
    "publish:bundle_tmp_written",
    "publish:bundle_renamed",
    "publish:generation_tmp_written",
    "publish:generation_linked",
    "publish:collected",
)
RESTORE_STEPS = ("restore:registered", "restore:extracted")
# After these, the new generation is visible: a kill there must not lose it.
PUBLISHED_BY = ("publish:generation_linked", "publish:collected")


def leftovers(store: StagedStore) -> dict[str, list[str]]:
    """What killed workers left behind on the volume."""
    referenced = {b.name for n in store.generation_numbers() for b in store.load(n).bundles}
    bundles = sorted(p.name for p in store.bundles.iterdir()) if store.bundles.is_dir() else []
    return {
        "bundle_tmp": [n for n in bundles if n.startswith(".tmp-")],
        "orphan_bundles": [n for n in bundles if not n.startswith(".tmp-") and n not in referenced],
        "generation_tmp": [p.name for p in store.generations_dir.glob(".tmp-*")],
        "readers": [p.name for p in store.readers.glob("*.json")],
        "lease": [store.lease_path.name] if store.lease_path.exists() else [],
    }


def test_kill_9_at_each_step_of_a_publish_never_leaves_a_partial_generation(tmp_path, fake_vllm_python):
    """18 trials: boot, stop the worker at a named step of its publish (or restore), SIGKILL it there.
    The worker is paused at the step when it dies, so every kill provably lands inside a publish (or
    a restore) at a known point. Then: each next boot restores exactly the newest complete generation,
    the generation advances exactly when the kill came after the generation was linked, and the
    temporaries, orphan bundles and reader registrations that the kills left are collected."""
    steps = (PUBLISH_STEPS + RESTORE_STEPS) * 2
    resume = tmp_path / "never"  # a paused worker is killed, never resumed
    landed: list[str] = []
    with mounted(tmp_path / "backing", tmp_path / "volume", latency_ms=2, bandwidth_mbps=10) as volume:
        write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
        newest = 0
        for trial, where in enumerate(steps):
            env = base_env(
                volume,
                fake_vllm_python,
                tmp_path,
                WARMSTART_CACHE_MODE="staged",
                WARMSTART_LOCAL_CACHE=str(tmp_path / f"local-{trial}"),
                FAKE_VLLM_ARTIFACTS=f"4:100000:t{trial}",
                FAKE_VLLM_PIDFILE=str(tmp_path / "pids"),
            )
            if where in RESTORE_STEPS:
                # A registration outlives its killed reader by the TTL: 1 s, so the final collection may take it.
                env["WARMSTART_LEASE_TTL_S"] = "1"
            store = key_store(volume) if (volume / "warmstart" / "keys").exists() else None
            expected = max(complete_generations(store), default=None) if store else None
            proc = start_warmstart(["boot", "--json"], paused_env(env, where, resume))
            log: list[str] = []
            try:
                read_until(proc, f"step     | {where}", log)
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
            landed.append(where)
            restored = [line for line in log if "warmstart | restore" in line]
            if where in RESTORE_STEPS:
                assert not restored  # killed before its restore finished
            elif expected is None:
                assert "no generation to restore" in restored[-1], restored
            else:
                assert f"generation {expected}:" in restored[-1], (expected, restored)
            assert not any("skipped" in line for line in restored), restored
            engine_pgid = int((tmp_path / "pids").read_text().split()[0])
            deadline = time.monotonic() + 20
            while group_alive(engine_pgid) and time.monotonic() < deadline:
                time.sleep(0.1)  # the engine follows its killed parent (parent-death signal)
            assert not group_alive(engine_pgid)

            store = key_store(volume)
            now_newest = max(store.generation_numbers(), default=0)
            assert now_newest == newest + (1 if where in PUBLISHED_BY else 0), (trial, where, now_newest, newest)
            newest = now_newest
            left = leftovers(store)
            if where == "publish:bundle_tmp_written":
                assert left["bundle_tmp"], left
            if where in ("publish:bundle_renamed", "publish:generation_tmp_written"):
                assert left["orphan_bundles"], left  # written, verified, never referenced
            if where in ("publish:generation_tmp_written", "publish:generation_linked"):
                assert left["generation_tmp"], left
            if where in RESTORE_STEPS:
                assert left["readers"], left
            if where not in ("publish:start", *RESTORE_STEPS):
                assert left["lease"], left  # held by the dead worker; the next one takes it over

        assert landed.count("publish:generation_linked") == 2 and newest == 4  # 2 linked + 2 after collection
        assert complete_generations(store) == store.generation_numbers(), "a partial generation became visible"
        left = leftovers(store)
        assert left["bundle_tmp"] and left["orphan_bundles"] and left["generation_tmp"] and left["readers"], left

        # One more worker, once the leftovers are older than its TTL: its publish collects them all.
        time.sleep(1.5)
        env = base_env(
            volume,
            fake_vllm_python,
            tmp_path,
            WARMSTART_LOCAL_CACHE=str(tmp_path / "local-final"),
            FAKE_VLLM_ARTIFACTS="1:1000:final",
            WARMSTART_LEASE_TTL_S="1",
        )
        final_boot = json.loads(run_warmstart(["boot", "--json"], env, timeout=120).stdout)
        assert final_boot["staged"]["generation_restored"] == newest
        assert final_boot["staged"]["publish"]["generation"] == newest + 1
        assert leftovers(store) == {k: [] for k in left}, leftovers(store)
        assert len(store.generation_numbers()) <= 2  # older generations collected too
        final = restore(store, tmp_path / "final", reader="check")
        assert final.generation == store.generation_numbers()[-1]
        assert final.problems == ()


def test_a_waiting_worker_takes_the_lease_afterwards_and_adds_only_what_is_missing(tmp_path, fake_vllm_python):
    """Two cold workers whose publishes overlap: A holds the lease (paused mid-publish), B waits for it,
    then publishes only the files A's generation lacks, on top of it."""
    resume = tmp_path / "resume-a"
    with mounted(tmp_path / "backing", tmp_path / "volume", latency_ms=0.5) as volume:
        write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")

        def env(name: str, artifacts: str) -> dict[str, str]:
            return base_env(
                volume,
                fake_vllm_python,
                tmp_path,
                WARMSTART_LOCAL_CACHE=str(tmp_path / name),
                FAKE_VLLM_ARTIFACTS=artifacts,
                WARMSTART_TEST_STEPS="1",
                WARMSTART_PUBLISH_WAIT_S="120",
            )

        a = start_warmstart(
            ["boot", "--json"], paused_env(env("local-a", "4:50000:a"), "publish:bundle_tmp_written", resume)
        )
        b = None
        log_a: list[str] = []
        log_b: list[str] = []
        try:
            read_until(a, "step     | publish:bundle_tmp_written", log_a)
            b = start_warmstart(["boot", "--json"], env("local-b", "3:50000:b"))
            read_until(b, "step     | publish:lease_busy", log_b)
            assert any("the publish lease is held by" in line for line in log_b), log_b[-5:]
            assert b.poll() is None
            resume.touch()  # A goes on: it publishes generation 1 and releases the lease
            out_a, err_a = a.communicate(timeout=60)
            out_b, err_b = b.communicate(timeout=120)
        finally:
            for proc in (a, b):
                if proc is not None and proc.poll() is None:
                    proc.kill()
        assert a.returncode == 0 and b.returncode == 0, err_a[-2000:] + err_b[-2000:]
        report_a, report_b = json.loads(out_a), json.loads(out_b)
        assert report_a["staged"]["publish"]["generation"] == 1
        assert report_a["staged"]["publish"]["files"] == 5  # fake-kernel.so and fake/a/*
        assert report_b["staged"]["generation_restored"] is None  # B started before A published
        steps_b = [line.split("|")[-1].strip() for line in log_b + err_b.splitlines() if "step     |" in line]
        assert steps_b.index("publish:lease_busy") < steps_b.index("publish:lease_held")
        published = report_b["staged"]["publish"]
        assert (published["status"], published["generation"], published["files"]) == ("published", 2, 3)
        assert published["detail"] == "3 files the generation 1 lacks"

        store = key_store(volume)
        first, second = store.load(1), store.load(2)
        added = set(second.files) - set(first.files)
        assert added == {f"inductor/fake/b/kernel-{i}.so" for i in range(3)}
        assert second.bundles[:-1] == first.bundles  # A's bundle kept, one new bundle holding B's three files
        assert second.bundles[-1].files == 3
        assert not store.lease_path.exists()
