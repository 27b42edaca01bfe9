"""The rehearsal engine (tools/warmstart_dev/rehearsal.py): its tree has every rank of TP 1 to 8 where vLLM 0.33
writes them, a log replays at its recorded pace, and a TP 8 tree survives the store's whole path: publish,
restore, seeding a sibling key, and `warmstart gc` removing that sibling. No vLLM, no wrapper process but gc."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.files import tree
from helpers.run import FIXTURES, base_env, run_warmstart
from warmstart.store.layout import CacheDirs, VolumeLayout
from warmstart.store.publish import publish
from warmstart.store.restore import restore
from warmstart.store.seed import seed_from, sibling_opener
from warmstart.store.siblings import SHAREABLE, plan_seed
from warmstart.store.volume import StagedStore
from warmstart_dev.rehearsal import grown, plan_tree, rank_dirs, timed_lines, tree_present, write_tree

SCALE = 0.02  # a few hundred files: the layout, not the size


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_tree_has_both_of_vllms_rank_directories_for_every_rank(tp):
    """vLLM 0.33: torch_compile_cache/<10 hex>/rank_{r}_{dp}/backbone (compilation/backends.py) and
    torch_aot_compile/<64 hex>/rank_{r}_{dp}/model (compilation/decorators.py), a Triton folder per device."""
    files = plan_tree(tp, scale=SCALE)
    ranks = {(m.group(1), m.group(2)) for f in files if (m := re.search(r"/(\w+)/rank_(\d+)_0/", f.rel))}
    assert {r for _, r in ranks} == {str(r) for r in range(tp)}
    assert sorted(len(parent) for parent, _ in ranks) == [10] * tp + [64] * tp, "a compile hash, an AOT hash"
    (aot,) = {p for p, _ in ranks if len(p) == 64}
    assert all(f.rel.startswith(f"torch_compile_cache/torch_aot_compile/{aot}/") for f in files if aot in f.rel)
    triton = {m.group(1) for f in files if (m := re.search(r"inductor_cache/triton/(\d+)/", f.rel))}
    assert triton == {str(r) for r in range(tp)}
    assert len(rank_dirs(tp, scale=SCALE)) == 2 * tp
    roots = {f.root for f in files}
    assert roots == {
        "VLLM_CACHE_ROOT",
        "TRITON_CACHE_DIR",
        "CUDA_CACHE_PATH",
        "FLASHINFER_WORKSPACE_BASE",
        "DG_JIT_CACHE_DIR",
    }
    assert plan_tree(tp, scale=SCALE) == files, "the same tree for the same arguments: a warm boot finds it"


def test_a_log_replays_at_the_pace_its_timestamps_give():
    """vLLM's own one-second stamps in the 0.33 fixture; the host's millisecond stamps in a real paste."""
    lines = timed_lines(FIXTURES / "gpu-0.33-aot-cold.log")
    assert lines[0][0] == 0.0
    assert [t for t, _ in lines] == sorted(t for t, _ in lines)
    compiled = next(t for t, text in lines if "Compiling a graph for compile range" in text)
    assert compiled == 157.0  # 10:00:00 -> 10:02:37
    host = timed_lines(FIXTURES / "real" / "file-0.20-host-timestamps-wsl-nvfp4.log")
    assert any(t != int(t) for t, _ in host), "milliseconds from the host's stamps"


def test_a_faster_replay_states_durations_on_its_own_clock_and_the_live_phases_match_the_files():
    """Replayed 20x faster with the stated figures divided, the phases the live path computes (lines fed at
    their arrival) times 20 are the file's own, within the log's one-second stamps; undivided, a compile total
    of 92 s arriving 8 s in would leave no bootstrap or weights phase at all."""
    from warmstart.vllm.logformats import markers_for
    from warmstart.vllm.phases import LogEvidence, compute_phases
    from warmstart_dev.rehearsal import scaled

    assert (
        scaled("[backbone] torch.compile took 92.11 s in total", 20) == "[backbone] torch.compile took 4.61 s in total"
    )
    assert (
        scaled("Graph capturing finished in 28 secs, took 0.85 GiB", 4)
        == "Graph capturing finished in 7.00 secs, took 0.85 GiB"
    )
    lines = timed_lines(FIXTURES / "gpu-0.33-aot-cold.log")

    def phases(speed: float, divide: bool) -> dict:
        ev = LogEvidence(specs=markers_for("0.33.0", "cuda"))
        for t, text in lines:
            ev.feed(scaled(text, speed) if divide else text, t / speed)
        return compute_phases(ev, ready_t=ev.first("app_ready").t)

    recorded = phases(1, False)
    fast = phases(20, True)
    for name in ("bootstrap", "weights", "compile", "kv_cache", "cudagraph"):
        assert abs(fast[name] * 20 - recorded[name]) <= 1.0, (name, fast[name] * 20, recorded[name])
    assert phases(20, False)["bootstrap"] == 0.0, "the stated figures must be divided for the comparison to hold"


def test_a_grown_config_line_keeps_its_head_and_reaches_its_size():
    line = "(EngineCore pid=1) INFO 12-01 10:00:18 [core.py:140] Initializing a V1 LLM engine (v0.33.0) with config: x"
    long = grown(line, 1 << 20)
    assert len(long) == 1 << 20 and long.startswith(line)


def cache_env(base: Path) -> dict[str, str]:
    dirs = CacheDirs(base)
    dirs.create()
    return dirs.env()


def rank_files(cache: Path) -> dict[str, int]:
    """Files under each `rank_R_0` directory of the vllm layer, by rank directory (both trees)."""
    counts: dict[str, int] = {}
    for rel in tree(cache):
        if m := re.search(r"(torch_compile_cache/.+?/rank_\d+_0)/", rel):
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def key_dir(volume: Path, name: str, last_used: str) -> StagedStore:
    directory = VolumeLayout(volume, on_volume=True).key_dir(name)
    directory.mkdir(parents=True)
    factors = {"model": "org/m", "revision": "r", "args": {"tensor_parallel_size": 8, "max_model_len": 4096}}
    if name == "key-b":
        factors["args"]["max_model_len"] = 8192
    (directory / "manifest.json").write_text(
        json.dumps({"key": name, "factors": factors, "last_used": last_used, "last_success": last_used})
    )
    return StagedStore(directory / "staged")


def test_a_tp8_tree_survives_publish_restore_seeding_and_gc_with_every_ranks_files(tmp_path):
    volume = tmp_path / "volume"
    local_a = tmp_path / "local-a" / "cache"
    env = cache_env(local_a)
    write_tree(env, 8, scale=SCALE)
    assert tree_present(env, 8, scale=SCALE)
    written = tree(local_a)
    ranks = rank_files(local_a)
    assert len(ranks) == 16 and all(ranks.values()), ranks

    store_a = key_dir(volume, "key-a", "2026-12-01T00:00:00+00:00")
    assert publish(store_a, local_a, publisher="a", lease_wait_s=0).status == "published"
    again = tmp_path / "again" / "cache"
    assert restore(store_a, again, reader="a2").restored
    assert tree(again) == written, "every rank's files, byte for byte"

    # A sibling key (another max_model_len) is seeded: the shareable layers only, never vLLM's rank trees.
    local_b = tmp_path / "local-b" / "cache"
    staged_b = VolumeLayout(volume, on_volume=True).key_dir("key-b") / "staged"
    own = json.loads((store_a.root.parent / "manifest.json").read_text())["factors"]
    own = {**own, "args": {**own["args"], "max_model_len": 8192}}
    seeded = seed_from(
        plan_seed("key-b", own, staged_b, None, "--"), local_b, sibling_opener(staged_b, None), reader="b", ttl_s=60
    )
    assert seeded.source is not None and seeded.source.key == "key-a"
    shareable = {rel: data for rel, data in written.items() if rel.split("/")[0] in SHAREABLE}
    assert shareable and tree(local_b) == shareable
    # The seeded key boots "cold" for vLLM's own cache: its 8 ranks write their trees, then it publishes.
    write_tree(cache_env(local_b), 8, scale=SCALE, seed=1)
    b_files = tree(local_b)
    assert len(rank_files(local_b)) == 16
    store_b = key_dir(volume, "key-b", "2026-12-05T00:00:00+00:00")
    assert publish(store_b, local_b, publisher="b", lease_wait_s=0).status == "published"

    # gc keeps the newest key and removes the sibling the seed came from; key-b restores whole.
    env_gc = base_env(volume, "/nonexistent", tmp_path)
    gc = run_warmstart(["gc", "--keep-last", "1", "--yes", "--json"], env_gc, timeout=120)
    assert gc.returncode == 0, gc.stderr
    assert not VolumeLayout(volume, on_volume=True).key_dir("key-a").exists(), gc.stdout
    final = tmp_path / "final" / "cache"
    assert restore(StagedStore(staged_b), final, reader="c").restored
    assert tree(final) == b_files
    assert rank_files(final) == rank_files(local_b) and len(rank_files(final)) == 16
