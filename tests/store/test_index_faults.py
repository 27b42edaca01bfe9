"""A malformed generation index is a bad generation, never a crash; `warmstart key` writes nothing."""

from __future__ import annotations

import json
import os

import pytest

from helpers.files import tree, write
from helpers.run import base_env, run_warmstart
from warmstart.store.bundle import safe_relpath
from warmstart.store.publish import publish
from warmstart.store.restore import restore
from warmstart.store.volume import StagedStore


@pytest.mark.parametrize("bad", ["inductor/a\0b/k.so", "inductor/\udc80/k.so"])
def test_a_path_no_filesystem_takes_makes_the_generation_bad(tmp_path, bad):
    store = StagedStore(tmp_path / "volume" / "key" / "staged")
    local = tmp_path / "a" / "cache"
    write(local, "inductor/a/k.so", os.urandom(300))
    assert publish(store, local, publisher="a", lease_wait_s=0).status == "published"
    index = json.loads(store.read("generations/g00000001.json"))
    entry = next(iter(index["files"].values()))
    index["files"] = {bad: entry}
    index["generation"] = 2
    (store.root / "generations" / "g00000002.json").write_text(json.dumps(index))  # JSON escapes both
    dest = tmp_path / "b" / "cache"
    result = restore(store, dest, reader="b")
    assert (result.generation, result.bad_bundles) == (1, ()), "the bad index skipped, its bundle not blamed"
    assert len(result.problems) == 1 and "is no file name" in result.problems[0]
    assert tree(dest) == tree(local)
    assert not safe_relpath(bad)


def test_key_writes_nothing_to_the_volume(tmp_path, volume, tiny_model, fake_vllm_python):
    before = sorted(p.relative_to(volume).as_posix() for p in volume.rglob("*"))
    env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / "local"))
    result = run_warmstart(["key"], env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    after = sorted(p.relative_to(volume).as_posix() for p in volume.rglob("*"))
    assert after == before
    assert not (volume / "warmstart").exists()
    assert "warning:" not in result.stdout


def test_key_prints_what_a_boot_would_warn_about(tmp_path, volume, tiny_model, fake_vllm_python):
    env = base_env(volume, fake_vllm_python, tmp_path, MAX_MODEL_LENGTH="256")
    result = run_warmstart(["key"], env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if "warning:" in line]
    assert "MAX_MODEL_LENGTH" in line and "did you mean MAX_MODEL_LEN?" in line
