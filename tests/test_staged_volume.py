"""Staged mode on the slow mock volume (a real FUSE filesystem): faults and kill -9 trials.

The engine here is the scripted one: these tests are about what warmstart writes to the
volume when things go wrong, and only a scripted engine can be timed to die on cue.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import WARMSTART, base_env, group_alive, run_warmstart
from warmstart.dev.slowfs import is_mounted, mounted
from warmstart.dev.testmodel import write_test_model
from warmstart.store.staged import StagedStore, publish, restore

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


def test_kill_9_at_random_points_of_a_publish_never_leaves_a_partial_generation(tmp_path, fake_vllm_python):
    """20 trials: boot, start publishing, SIGKILL the worker at a random moment. Every next boot
    must restore exactly the newest complete generation (or start cold), never a partial one."""
    rng = random.Random(20261129)
    killed_inside = 0
    with mounted(tmp_path / "backing", tmp_path / "volume", latency_ms=2, bandwidth_mbps=10) as volume:
        write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
        for trial in range(20):
            env = base_env(
                volume,
                fake_vllm_python,
                tmp_path,
                WARMSTART_CACHE_MODE="staged",
                WARMSTART_LOCAL_CACHE=str(tmp_path / f"local-{trial}"),
                FAKE_VLLM_ARTIFACTS=f"8:150000:t{trial}",
                FAKE_VLLM_PIDFILE=str(tmp_path / "pids"),
            )
            store = key_store(volume) if (volume / "warmstart" / "keys").exists() else None
            expected = max(complete_generations(store), default=None) if store else None
            proc = subprocess.Popen(
                [WARMSTART, "boot", "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            log = []
            assert proc.stderr is not None
            for line in proc.stderr:
                log.append(line)
                if "publishing new cache files" in line:
                    break
            else:
                raise AssertionError("".join(log[-30:]))
            time.sleep(rng.uniform(0.0, 1.2))
            if proc.poll() is None:
                killed_inside += 1
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            restored = [line for line in log if "warmstart | restore" in line]
            if expected is None:
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
        assert complete_generations(store) == store.generation_numbers(), "a partial generation became visible"
        assert killed_inside >= 10, f"only {killed_inside} kills landed inside a publish"
        final = restore(store, tmp_path / "final", reader="check")
        assert final.generation == store.generation_numbers()[-1]
        assert final.problems == ()
