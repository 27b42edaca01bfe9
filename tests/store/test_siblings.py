"""Siblings (issue 21): which key a new key is seeded from, what is seeded, and what the boot read.

Selection is a pure function of manifests' factors; seeding runs the staged restore on a sibling's
real store (a folder here, the moto S3 server below); reads are told by access times on this
filesystem. Real vLLM proves the whole boot in test_siblings_vllm.py.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from helpers.files import tree, write
from helpers.run import MODEL_ID, base_env, run_warmstart
from helpers.s3_server import ACCESS_KEY, SECRET_KEY, s3_env
from warmstart.explain import explain_current
from warmstart.report.seeded import seeded_verdict
from warmstart.s3url import parse_s3_url
from warmstart.store.layout import VolumeLayout
from warmstart.store.publish import publish
from warmstart.store.restore import restore
from warmstart.store.s3 import S3Store
from warmstart.store.s3client import make_client
from warmstart.store.scan import scan_key, scan_volume
from warmstart.store.seed import SeedResult, SeedUse, atimes_updated, seed_from, seed_use, sibling_opener
from warmstart.store.siblings import (
    NOT_SEEDED,
    SHAREABLE,
    SeedSource,
    Sibling,
    choose_seeds,
    plan_seed,
    record_key,
    refusal,
)
from warmstart.store.volume import StagedStore
from warmstart_dev.testmodel import write_test_model

CPU = {"kind": "cpu", "name": "x86_64", "capability": "avx512", "count": 1, "features": ["avx512f", "amx"]}
ENGINE = {
    "dist": "vllm",
    "vllm": "0.33.0",
    "torch": "2.14.0",
    "triton": "3.9.0",
    "python": "3.12.3",
    "flashinfer": "0.7.2.post1",
    "deep_gemm": "2.3.0",
}


def factors(**changes) -> dict:
    base = {
        "model": "org/tiny",
        "revision": "abc",
        "hardware": copy.deepcopy(CPU),
        "engine": dict(ENGINE),
        "args": {"max_model_len": 256, "max_num_seqs": 4},
        "vllm_env": {"VLLM_USE_AOT_COMPILE": "0"},
    }
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = base
        for p in parents:
            node = node[p]
        node[leaf] = value
    return base


def sib(key: str, f: dict, *, gens: int = 1, tier: str = "volume", used: str = "2026-12-01") -> Sibling:
    return Sibling(key, f, tier, gens, used)


# --------------------------------------------------------------------------- selection


def test_the_layers_seeded_are_the_content_addressed_ones_and_never_vllms_own():
    assert set(SHAREABLE) == {"inductor", "triton", "deep_gemm", "flashinfer"}
    assert {"vllm_compile", "startup_plan", "flashinfer_autotune", "cuda"} <= set(NOT_SEEDED)
    assert not set(SHAREABLE) & set(NOT_SEEDED)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"engine__triton": "3.8.0"}, "engine.triton"),
        ({"engine__torch": "2.13.0"}, "engine.torch"),
        ({"engine__vllm": "0.32.0"}, "engine.vllm"),
        ({"engine__flashinfer": "0.7.1"}, "engine.flashinfer"),
        ({"engine__deep_gemm": "2.2.0"}, "engine.deep_gemm"),
        ({"engine__python": "3.11.7"}, "engine.python"),
        ({"hardware__capability": "avx2"}, "hardware.capability"),  # Inductor's key lacks the CPU's ISA
        ({"hardware__features": ["avx512f"]}, "hardware.features"),
        ({"hardware__name": "aarch64"}, "hardware.name"),
    ],
)
def test_a_sibling_of_other_builds_or_hardware_is_refused_even_when_nearest(change, named):
    own = factors(args__max_model_len=384)
    other = factors(**change)  # the same flags as... closer than the good one below
    good = factors(args__max_model_len=512, args__max_num_seqs=8)
    plan = choose_seeds("own", own, [sib("near-but-unfit", other), sib("good", good)])
    assert [s.key for s in plan.sources] == ["good"]
    assert plan.refused[0][0] == "near-but-unfit" and named in plan.refused[0][1]
    assert refusal(own, other) is not None and refusal(own, good) is None


def test_gpu_count_differs_and_the_sibling_still_qualifies():
    own = factors(hardware__kind="gpu", hardware__name="H100", hardware__capability="9.0", hardware__count=2)
    other = copy.deepcopy(own)
    other["hardware"]["count"] = 1
    assert refusal(own, other) is None


def test_nearest_first_by_model_then_flags_then_most_recent_and_the_volume_before_s3():
    own = factors(args__max_model_len=384)
    same_model_two_flags = factors(args__max_model_len=512, args__max_num_seqs=8)
    other_model_same_flags = factors(model="org/other", args__max_model_len=384)
    other_revision = factors(revision="def", args__max_model_len=384)
    one_flag_old = factors(args__max_model_len=256)
    one_flag_new = factors(args__max_num_seqs=8, args__max_model_len=384)
    siblings = [
        sib("other-model", other_model_same_flags),
        sib("two-flags", same_model_two_flags),
        sib("old", one_flag_old, used="2026-11-01"),
        sib("new", one_flag_new, used="2026-12-02", tier="s3"),
        sib("new", one_flag_new, used="2026-12-02"),
        sib("other-rev", other_revision),
        sib("no-gen", factors(args__max_model_len=384, args__max_num_seqs=5), gens=0),
        sib("own", own),
    ]
    plan = choose_seeds("own", own, siblings, limit=5)
    assert [(s.key, s.tier) for s in plan.sources] == [
        ("new", "volume"),
        ("old", "volume"),
        ("two-flags", "volume"),
        ("other-rev", "volume"),
        ("other-model", "volume"),
    ]
    assert plan.sources[0].differs == {"args.max_num_seqs": [8, 4]}


def test_no_source_says_why():
    own = factors()
    assert choose_seeds("own", own, []).note == "no other key with a generation"
    unfit = choose_seeds("own", own, [sib("x", factors(engine__torch="2.0"))])
    assert unfit.sources == () and unfit.note == "no sibling qualifies"


# --------------------------------------------------------------------------- seeding from a real store


def key_on_volume(volume: Path, name: str, f: dict, files: dict[str, bytes]) -> StagedStore:
    """A key directory as a boot leaves it: its manifest and one published generation."""
    key_dir = VolumeLayout(volume, on_volume=True).key_dir(name)
    key_dir.mkdir(parents=True)
    (key_dir / "manifest.json").write_text(json.dumps({"key": name, "factors": f, "last_used": "2026-12-01"}))
    local = volume.parent / f"local-{name}"
    for rel, data in files.items():
        write(local, rel, data)
    store = StagedStore(key_dir / "staged")
    assert publish(store, local, publisher=name, lease_wait_s=0).status == "published"
    return store


SIBLING_FILES = {
    "inductor/fxgraph/ab/fkey1/entry": os.urandom(300),
    "inductor/aotautograd/akey1/entry": os.urandom(200),
    "inductor/cx/cxyz.py": b"# output code\n",
    "inductor/cx/cxyz.so": os.urandom(4000),
    "triton/HASH1/kernel.json": b"{}",
    "triton/HASH1/kernel.cubin": os.urandom(2000),
    "deep_gemm/cache/kernel.gemm.d1/kernel.cubin": os.urandom(1000),
    "flashinfer/.cache/flashinfer/0.7.2/90/cached_ops/mod/mod.so": os.urandom(1500),
    "vllm/torch_compile_cache/1234567890/rank_0_0/backbone/artifact": os.urandom(5000),
    "vllm/startup_plan/plan.json": b"{}",
    "vllm/modelinfos/x.json": b"{}",
    "cuda/ComputeCache/index": os.urandom(100),
    "flashinfer_autotune/abc/autotune_configs.json": b"{}",
}


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    v = tmp_path / "volume"
    key_on_volume(v, "key-a", factors(), SIBLING_FILES)
    return v


def seed_volume_key(volume: Path, own: dict, dest: Path, name: str = "key-b") -> SeedResult:
    staged_root = VolumeLayout(volume, on_volume=True).key_dir(name) / "staged"
    plan = plan_seed(name, own, staged_root, None, "--")
    return seed_from(plan, dest, sibling_opener(staged_root, None), reader="worker-b", ttl_s=60)


def test_a_new_key_is_seeded_with_the_shareable_layers_only(volume, tmp_path):
    dest = tmp_path / "local-b" / "cache"
    result = seed_volume_key(volume, factors(args__max_model_len=384), dest)
    assert result.source is not None and result.source.key == "key-a"
    assert result.source.differs == {"args.max_model_len": [256, 384]}
    wanted = {rel: data for rel, data in SIBLING_FILES.items() if rel.split("/")[0] in SHAREABLE}
    assert tree(dest) == wanted, "vLLM's compile cache, start-up plan, autotune and CUDA's cache are never seeded"
    assert result.result is not None and result.result.per_layer["inductor"][0] == 4
    sibling = StagedStore(VolumeLayout(volume, on_volume=True).key_dir("key-a") / "staged")
    assert sibling.reader_registrations() == {}, "the restore registered on the sibling's store and left"
    assert sibling.generation_numbers() == [1], "the sibling's store is only read"


def test_a_key_with_a_generation_of_its_own_is_not_seeded(volume, tmp_path):
    key_on_volume(volume, "key-b", factors(args__max_model_len=384), {"inductor/own/x.so": b"own"})
    staged_root = VolumeLayout(volume, on_volume=True).key_dir("key-b") / "staged"
    plan = plan_seed("key-b", factors(args__max_model_len=384), staged_root, None, "--")
    assert plan.sources == () and plan.note == "the key has generations of its own"


def test_an_unfit_sibling_on_the_volume_is_never_restored(tmp_path):
    volume = tmp_path / "volume"
    key_on_volume(volume, "key-a", factors(engine__triton="3.8.0"), SIBLING_FILES)
    dest = tmp_path / "local-b" / "cache"
    result = seed_volume_key(volume, factors(args__max_model_len=384), dest)
    assert result.source is None and not tree(dest)


def test_a_sibling_with_nothing_shareable_seeds_nothing_and_says_so(tmp_path):
    volume = tmp_path / "volume"
    only_vllm = {k: v for k, v in SIBLING_FILES.items() if k.startswith(("vllm/", "cuda/"))}
    key_on_volume(volume, "key-a", factors(), only_vllm)
    dest = tmp_path / "local-b" / "cache"
    result = seed_volume_key(volume, factors(args__max_model_len=384), dest)
    assert result.source is None and not tree(dest)
    assert result.note == "no file of the seeded layers in key-a"


def test_a_corrupt_sibling_is_skipped_for_the_next(volume, tmp_path):
    key_on_volume(volume, "key-c", factors(args__max_model_len=384), SIBLING_FILES)
    # key-c is nearer (no flag differs); its bundle is damaged
    bundles = VolumeLayout(volume, on_volume=True).key_dir("key-c") / "staged" / "bundles"
    bundle = next(bundles.iterdir())
    data = bytearray(bundle.read_bytes())
    data[700] ^= 0xFF
    bundle.write_bytes(bytes(data))
    dest = tmp_path / "local-b" / "cache"
    result = seed_volume_key(volume, factors(args__max_model_len=384), dest)
    assert result.source is not None and result.source.key == "key-a"
    assert any("key-c" in p for p in result.problems)
    assert len(tree(dest)) == 8


def test_reads_are_told_per_layer_with_inductors_hits(volume, tmp_path):
    dest = tmp_path / "local-b" / "cache"
    if not atimes_updated(tmp_path):
        pytest.skip("this filesystem keeps no access times (noatime): reads cannot be told here")
    result = seed_volume_key(volume, factors(args__max_model_len=384), dest)
    assert result.atimes
    (dest / "inductor/fxgraph/ab/fkey1/entry").read_bytes()  # a lookup that hit
    (dest / "inductor/cx/cxyz.so").read_bytes()
    (dest / "triton/HASH1/kernel.json").read_bytes()
    write(dest, "inductor/new/compiled.so", b"new")  # added: not a seeded file
    os.utime(dest / "deep_gemm/cache/kernel.gemm.d1/kernel.cubin")  # rewritten (mtime now)
    use = seed_use(result, dest)
    assert use["inductor"] == SeedUse(files=4, bytes=4514, read=2, hits=1, rewritten=0, gone=0)
    assert use["triton"].read == 1 and use["triton"].hits is None
    assert use["deep_gemm"].rewritten == 1 and use["deep_gemm"].read == 0
    assert use["flashinfer"] == SeedUse(files=1, bytes=1500, read=0, hits=0, rewritten=0, gone=0)
    (dest / "flashinfer/.cache/flashinfer/0.7.2/90/cached_ops/mod/mod.so").read_bytes()  # a module loaded
    assert seed_use(result, dest)["flashinfer"].hits == 1


def test_reads_unknown_without_access_times(volume, tmp_path):
    dest = tmp_path / "local-b" / "cache"
    result = seed_volume_key(volume, factors(args__max_model_len=384), dest)
    blind = SeedResult(result.source, result.result, result.files, atimes=False)
    assert seed_use(blind, dest)["inductor"].read is None


def verdict_of(verdict, **uses):
    source = SeedSource("key-a", "volume", {})
    seed = SeedResult(source, None, {"x": (1, 1)}, True)
    return seeded_verdict(verdict, seed, {k: SeedUse(1, 1, *v, 0, 0) for k, v in uses.items()})


def test_the_verdict_of_a_seeded_boot():
    assert verdict_of("warm", inductor=(3, 2)) == "partial", "this key's own caches held nothing"
    assert verdict_of("cold", inductor=(3, 2)) == "partial", "compiled some, reused Inductor entries"
    assert verdict_of("cold", inductor=(3, 0)) == "cold", "read only output code: no entry of Inductor's hit"
    assert verdict_of("cold", inductor=(None, None)) == "cold", "cannot be told: no claim"
    assert verdict_of("cold", triton=(5, None)) == "partial", "a GPU boot that compiled but reused kernels"
    assert verdict_of("cold", flashinfer=(2, 0)) == "cold", "ninja read its log, then rebuilt every module"
    assert seeded_verdict("cold", SeedResult(None, None, {}, True), {}) == "cold"
    assert verdict_of(None, inductor=(3, 2)) is None, "a failed boot has no verdict"


def test_the_seeded_key_publishes_its_own_generation_and_outlives_its_sibling(volume, tmp_path):
    """gc counts a key's files once: the seeded key's generation holds its own copies, so removing
    the sibling (as gc does) leaves it whole; its bytes are its own bundles."""
    dest = tmp_path / "local-b" / "cache"
    seed_volume_key(volume, factors(args__max_model_len=384), dest)
    write(dest, "inductor/new/compiled.so", b"new")
    layout = VolumeLayout(volume, on_volume=True)
    b_dir = layout.key_dir("key-b")
    b_dir.mkdir(parents=True)
    (b_dir / "manifest.json").write_text(json.dumps({"factors": factors(args__max_model_len=384)}))
    b_store = StagedStore(b_dir / "staged")
    result = publish(b_store, dest, publisher="b", lease_wait_s=0)
    assert (result.status, result.files) == ("published", 9)
    gen = b_store.load(result.generation)
    assert {f.bundle for f in gen.files.values()} <= {b.name for b in gen.bundles}
    b_bytes = scan_key(b_dir, (), []).bytes_by_kind["bundles"]
    assert b_bytes == sum(p.stat().st_size for p in b_store.bundles.iterdir()) == gen.bundles[0].size
    shutil.rmtree(layout.key_dir("key-a"))
    again = tmp_path / "local-b2" / "cache"
    assert restore(b_store, again, reader="b2").restored
    assert tree(again) == tree(dest)


def test_explain_says_a_new_key_will_be_seeded_and_from_where(volume):
    key_on_volume(volume, "key-unfit", factors(args__max_model_len=384, hardware__capability="avx2"), SIBLING_FILES)
    scan = scan_volume(VolumeLayout(volume, on_volume=True))
    found = explain_current("key-b", factors(args__max_model_len=384), "staged", scan)
    assert found.next_boot == "partial expected"
    assert "seeded from key-a" in found.reason and "--max-model-len 256 -> 384" in found.reason
    assert "seed from  key-a (volume store): inductor, triton, deep_gemm, flashinfer" in found.lines()
    assert found.to_json()["seed"]["refused"][0]["key"] == "key-unfit"
    direct = explain_current("key-b", factors(args__max_model_len=384), "direct", scan)
    assert direct.next_boot == "cold", "direct mode is never seeded"
    off = explain_current("key-b", factors(args__max_model_len=384), "staged", scan, seeding=False)
    assert off.next_boot == "cold" and off.seed is None, "WARMSTART_SEED_SIBLINGS=off seeds nothing"


# --------------------------------------------------------------------------- the S3 store


@pytest.fixture
def s3(endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    client = make_client(endpoint, "us-east-1")
    bucket = f"sib-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    url = parse_s3_url(f"s3://{bucket}/warmstart")
    return lambda key: S3Store(client, url, key, lease_settle_s=0.2)


def test_siblings_in_the_s3_store_are_found_by_their_key_file_and_seed(s3, tmp_path):
    a = s3("tiny--abc--cpu-x86_64-avx512--vllm-0.33.0--aaaa")
    local = tmp_path / "local-a"
    for rel, data in SIBLING_FILES.items():
        write(local, rel, data)
    assert publish(a, local, publisher="a", lease_wait_s=0).status == "published"
    record_key(a, "tiny--abc--cpu-x86_64-avx512--vllm-0.33.0--aaaa", factors(), "2026-12-01T00:00:00+00:00")
    unfit = s3("tiny--abc--cpu-x86_64-avx512--vllm-0.33.0--cccc")
    assert publish(unfit, local, publisher="c", lease_wait_s=0).status == "published"
    record_key(unfit, "tiny--abc--cpu-x86_64-avx512--vllm-0.33.0--cccc", factors(engine__torch="2.9"), "x")
    other_hw = s3("tiny--abc--cpu-x86_64-avx2--vllm-0.33.0--dddd")  # never read: its name says another CPU
    assert publish(other_hw, local, publisher="d", lease_wait_s=0).status == "published"
    own_name = "tiny--abc--cpu-x86_64-avx512--vllm-0.33.0--bbbb"
    own = s3(own_name)
    plan = plan_seed(own_name, factors(args__max_model_len=384), None, own, "--cpu-x86_64-avx512--")
    assert [(s.key, s.tier) for s in plan.sources] == [("tiny--abc--cpu-x86_64-avx512--vllm-0.33.0--aaaa", "s3")]
    assert [k for k, _ in plan.refused] == ["tiny--abc--cpu-x86_64-avx512--vllm-0.33.0--cccc"]
    dest = tmp_path / "local-b" / "cache"
    result = seed_from(plan, dest, sibling_opener(None, own), reader="b", ttl_s=60)
    assert result.source is not None and result.source.tier == "s3"
    assert set(tree(dest)) == {rel for rel in SIBLING_FILES if rel.split("/")[0] in SHAREABLE}


def test_a_key_new_to_a_datacenter_is_seeded_from_a_sibling_in_the_s3_store(
    tmp_path, endpoint, fake_vllm_python, monkeypatch
):
    """The wiring with the scripted engine: A's boot publishes to its volume and the store, with its
    key.json; B (another MAX_MODEL_LEN, in another datacenter: an empty volume) is told by explain
    that it will be seeded from A in the store, and is."""
    bucket = f"sib-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    make_client(endpoint, "us-east-1").create_bucket(Bucket=bucket)
    volume_a, volume_b = tmp_path / "dc-a", tmp_path / "dc-b"
    for v in (volume_a, volume_b):
        write_test_model(v / "huggingface-cache" / "hub", MODEL_ID)

    logs: list[str] = []

    def run(volume: Path, local: str, command: list[str], **extra: str) -> dict:
        env = base_env(
            volume, fake_vllm_python, tmp_path, WARMSTART_S3_URL=f"s3://{bucket}/warmstart", **s3_env(endpoint)
        )
        env.update(WARMSTART_LOCAL_CACHE=str(tmp_path / local), **extra)
        result = run_warmstart(command, env, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        logs.append(result.stderr)
        return json.loads(result.stdout)

    a = run(volume_a, "local-a", ["boot", "--json"], FAKE_VLLM_ARTIFACTS="3:1000:a")
    assert a["staged"]["s3"]["publish"]["status"] == "published"
    said = run(volume_b, "local-x", ["explain", "--json"], MAX_MODEL_LEN="384")
    assert said["next_boot"] == "partial expected" and said["seed"]["sources"][0]["key"] == a["key"]
    assert said["seed"]["sources"][0]["tier"] == "s3"
    b = run(volume_b, "local-b", ["boot", "--json"], MAX_MODEL_LEN="384")
    seeded = b["staged"]["seeded"]
    assert (seeded["from"], seeded["tier"], b["verdict"]) == (a["key"], "s3", "partial")
    assert seeded["layers"]["inductor"]["files"] == 4 and b["caches"]["inductor"]["files_added"] == 0
    assert b["staged"]["s3"]["publish"]["status"] == "published", "B's own generation, in the store too"
    restore_lines = [line for line in logs[-1].splitlines() if "warmstart | restore" in line]
    assert restore_lines[-1].endswith(": seeding from a sibling key"), restore_lines
    assert not [line for line in restore_lines if "starting cold" in line], "the log says what the boot does"
