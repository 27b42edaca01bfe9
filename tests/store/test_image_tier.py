"""The image tier and `warmstart export`: a key's generation baked into the image, read-only, verified.

Store-level: a volume folder publishes, `export` copies its newest verified generation, and the
image tier restores it through the same tiers code a boot runs (`store.tiers.restore_tiers`).
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from helpers.files import stat_tree, tree, write
from warmstart.store.bundle import StoreError
from warmstart.store.export import (
    ExportError,
    StoredKey,
    Wanted,
    choose_keys,
    export,
    export_key,
    gpu_matches,
    store_opener,
    stored_keys,
)
from warmstart.store.image import ImageStore, ReadOnly, image_store, scan_image
from warmstart.store.publish import publish
from warmstart.store.tiers import publish_tier, restore_tiers
from warmstart.store.volume import StagedStore

KEY = "tiny-llama--9fbe67ea--h100-80gb-hbm3-sm90x1--vllm-0.33.0--6cb17eac28"
FACTORS = {
    "model": "org/tiny",
    "revision": "9fbe67ea" * 5,
    "hardware": {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "count": 1, "features": []},
    "engine": {"dist": "vllm", "vllm": "0.33.0"},
    "args": {"max_model_len": 512},
    "vllm_env": {"VLLM_ENABLE_STARTUP_PLAN": "1"},
}


@pytest.fixture
def local(tmp_path: Path) -> Path:
    base = tmp_path / "gpu-worker" / "cache"
    for i in range(20):
        write(base, f"triton/k{i % 3}/kernel{i}.cubin", os.urandom(300 + 53 * i))
    write(base, "vllm/torch_compile_cache/ab12/rank_0_0/backbone/artifact", os.urandom(40000))
    return base


@pytest.fixture
def volume(tmp_path: Path, local: Path) -> Path:
    """A volume's keys folder where a GPU worker published `KEY` (two generations)."""
    keys = tmp_path / "volume" / "warmstart" / "keys"
    store = StagedStore(keys / KEY / "staged")
    assert publish(store, local, publisher="gpu", lease_wait_s=0).status == "published"
    write(local, "triton/late/served.cubin", os.urandom(999))  # compiled while serving: generation 2
    assert publish(store, local, publisher="gpu", lease_wait_s=0).generation == 2
    manifest = {"factors": FACTORS, "last_used": "2026-12-01T10:00:00+00:00"}
    (keys / KEY / "manifest.json").write_text(json.dumps(manifest))
    return keys


def baked(volume: Path, out: Path) -> Path:
    chosen, missing = choose_keys(stored_keys(volume, None), names=[KEY])
    assert not missing
    export(chosen, store_opener(volume, None), out)
    return out


def test_restore_from_the_read_only_image_tier_first(volume, local, tmp_path):
    image = baked(volume, tmp_path / "image-caches")
    before = stat_tree(image)
    tier = image_store(image, KEY)
    assert isinstance(tier, ImageStore)
    dest = tmp_path / "new-worker" / "cache"
    restored = restore_tiers([tier, StagedStore(volume / KEY / "staged")], dest, reader="w", ttl_s=60)
    assert restored.restored and restored.result.source == "image" and restored.result.generation == 2
    assert tree(dest) == tree(local)
    assert not restored.problems
    # Nothing was written to the image: no reader registration, no temporary, no changed file.
    assert stat_tree(image) == before
    assert not (image / "keys" / KEY / "staged" / "readers").exists()


def test_the_image_tier_refuses_every_write(volume, local, tmp_path):
    tier = image_store(baked(volume, tmp_path / "image-caches"), KEY)
    assert tier is not None
    for write_op in (
        tier.create,
        lambda: tier.create_generation(3, b"{}"),
        tier.bundle_writer,
        lambda: tier.write("generations/g00000003.json", b"{}"),
        lambda: tier.remove("generations/g00000002.json"),
    ):
        with pytest.raises(ReadOnly):
            write_op()
    assert not tier.lease("w", 60).try_acquire()
    # A publish aimed at it (never done by a boot) is refused, and leaves it as it was.
    write(local, "triton/new/k.cubin", b"x" * 10)
    before = stat_tree(tier.root)
    assert publish_tier(tier, local, publisher="w", lease_wait_s=0, lease_ttl_s=60).status == "skipped"
    assert stat_tree(tier.root) == before


def test_a_corrupt_baked_bundle_is_refused_and_the_next_tier_used(volume, local, tmp_path):
    image = baked(volume, tmp_path / "image-caches")
    bundles = sorted((image / "keys" / KEY / "staged" / "bundles").iterdir(), key=lambda p: p.stat().st_size)
    victim = bundles[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    victim.write_bytes(bytes(data))
    dest = tmp_path / "new-worker" / "cache"
    restored = restore_tiers(
        [image_store(image, KEY), StagedStore(volume / KEY / "staged")], dest, reader="w", ttl_s=60
    )
    assert restored.restored and restored.result.source == "volume"
    assert tree(dest) == tree(local)
    assert any(p.startswith("image: generation 2:") for p in restored.problems), restored.problems
    assert victim.name in restored.bad_bundles["image"]
    assert restored.bad_bundles.get("volume") == ()


def test_a_key_the_image_lacks_is_no_image_tier(volume, tmp_path):
    image = baked(volume, tmp_path / "image-caches")
    assert image_store(image, "other-key") is None
    assert image_store(None, KEY) is None
    assert image_store(tmp_path / "no-such-folder", KEY) is None


def test_export_takes_the_newest_generation_that_verifies(volume, local, tmp_path):
    store = StagedStore(volume / KEY / "staged")
    gen2 = store.load(2)
    newest = next(b for b in gen2.bundles if b.name not in {r.name for r in store.load(1).bundles})
    path = store.bundles / newest.name
    path.write_bytes(b"\0" * path.stat().st_size)  # generation 2's own bundle is damaged
    out = tmp_path / "image-caches"
    exported = export_key(store, KEY, FACTORS, out)
    assert exported.generation == 1 and len(exported.problems) == 1
    assert sorted(os.listdir(out / "keys" / KEY / "staged" / "generations")) == ["g00000001.json"]
    gen1 = store.load(1)
    assert sorted(os.listdir(out / "keys" / KEY / "staged" / "bundles")) == sorted(b.name for b in gen1.bundles)
    # The index is copied byte for byte, so the restore in the image checks the published checksums.
    copied = out / "keys" / KEY / "staged" / "generations" / "g00000001.json"
    assert copied.read_bytes() == (store.generations_dir / "g00000001.json").read_bytes()
    path.unlink()
    for bundle in store.bundles.iterdir():
        bundle.write_bytes(b"")
    with pytest.raises(ExportError, match="nothing to export"):
        export_key(store, KEY, FACTORS, tmp_path / "again")


def test_export_as_a_tar_unpacks_to_the_same_folder(volume, tmp_path):
    folder = baked(volume, tmp_path / "as-folder")
    archive = baked(volume, tmp_path / "caches.tar")
    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        # The "data" filter where this Python has it (3.11.4 and later; Debian 12's 3.11.2 has not).
        tar.extractall(unpacked, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    assert all(not n.startswith(("/", "..")) for n in names) and "export.json" in names
    without_record = {k: v for k, v in tree(folder).items() if k != "export.json"}
    assert {k: v for k, v in tree(unpacked).items() if k != "export.json"} == without_record
    (key,) = scan_image(unpacked)[0]
    assert (key.name, key.generation, key.factors) == (KEY, 2, FACTORS)
    assert key.bundle_bytes == sum(len(v) for k, v in without_record.items() if "/bundles/" in k)


def test_export_adds_keys_to_an_earlier_export_and_refuses_a_foreign_folder(volume, tmp_path):
    out = baked(volume, tmp_path / "image-caches")
    record = json.loads((out / "export.json").read_text())
    assert set(record["keys"]) == {KEY} and record["keys"][KEY]["generation"] == 2
    baked(volume, out)  # again: replaced in place, still one key
    assert [k.name for k in scan_image(out)[0]] == [KEY]
    foreign = tmp_path / "foreign"
    write(foreign, "something.txt", b"x")
    with pytest.raises(ExportError, match="something else than an export"):
        baked(volume, foreign)


# --------------------------------------------------------------------------- which key


def wanted(**args) -> Wanted:
    env = {"gpu": {"VLLM_ENABLE_STARTUP_PLAN": "1"}, "cpu": {"VLLM_USE_AOT_COMPILE": "0"}}
    return Wanted("org/tiny", None, args or {"max_model_len": 512}, lambda kind: env[kind])


def test_the_environment_key_is_found_by_the_gpu_named():
    h200 = {**FACTORS, "hardware": {**FACTORS["hardware"], "name": "NVIDIA H200"}}
    other_flags = {**FACTORS, "args": {"max_model_len": 1024}}
    older = {**FACTORS, "engine": {"dist": "vllm", "vllm": "0.32.0"}}
    stored = [
        StoredKey("h100-new", FACTORS, "volume", "2026-12-02"),
        StoredKey("h100-old", older, "volume", "2026-11-01"),
        StoredKey("h200", h200, "s3", "2026-12-01"),
        StoredKey("h100-1024", other_flags, "volume", "2026-12-03"),
    ]
    chosen, missing = choose_keys(stored, wanted=wanted(), gpus=["H100", "nvidia h200", "RTX 5090"])
    assert sorted(chosen) == ["h100-new", "h200"] and chosen["h200"].tier == "s3"
    assert missing == ["no key of org/tiny with these flags on 'RTX 5090' in the store(s)"]
    chosen, _ = choose_keys(stored, wanted=wanted(max_model_len=1024), gpus=["H100"])
    assert list(chosen) == ["h100-1024"]
    pinned = Wanted("org/tiny", "other-revision", {"max_model_len": 512}, wanted().vllm_env)
    assert choose_keys(stored, wanted=pinned, gpus=["H100"])[0] == {}
    # The image's own vLLM variables (vLLM's image sets VLLM_USAGE_SOURCE) are in its keys, not here: a key
    # with more variables matches, after one with exactly these.
    imaged = {**FACTORS, "vllm_env": {**FACTORS["vllm_env"], "VLLM_USAGE_SOURCE": "production-docker-image"}}
    with_image = [StoredKey("imaged", imaged, "volume", "2026-12-09"), *stored]
    assert list(choose_keys(with_image, wanted=wanted(), gpus=["H100"])[0]) == ["h100-new"]
    assert list(choose_keys(with_image[:1], wanted=wanted(), gpus=["H100"])[0]) == ["imaged"]
    other_value = {**FACTORS, "vllm_env": {"VLLM_ENABLE_STARTUP_PLAN": "0"}}
    assert choose_keys([StoredKey("off", other_value, "volume")], wanted=wanted(), gpus=["H100"])[0] == {}
    # By name, the volume's copy first when both hold it.
    both = [StoredKey("k", FACTORS, "s3"), StoredKey("k", FACTORS, "volume")]
    assert choose_keys(both, names=["k", "absent"]) == ({"k": both[0]}, ["no key absent in the store(s)"])


def test_gpu_names_match_loosely_and_cpu_only_cpu():
    h100 = FACTORS["hardware"]
    assert gpu_matches(h100, "H100") and gpu_matches(h100, "nvidia h100 80gb") and gpu_matches(h100, "NVIDIA H100")
    assert not gpu_matches(h100, "H200") and not gpu_matches(h100, "cpu")
    assert gpu_matches({"kind": "cpu", "name": "x86_64"}, "CPU")
    assert not gpu_matches({"kind": "cpu", "name": "x86_64"}, "x86")


def test_a_store_that_cannot_be_listed_is_an_export_error(tmp_path):
    class Broken(StagedStore):
        def names(self, folder: str) -> dict[str, float]:
            raise StoreError("EIO")

    with pytest.raises(ExportError, match="cannot be listed"):
        export_key(Broken(tmp_path / "s"), KEY, FACTORS, tmp_path / "out")


# --------------------------------------------------------------------------- from S3 (moto)


@pytest.fixture
def s3_root(endpoint, aws_credentials, tmp_path):
    """An S3 store under s3://BUCKET/warmstart (the key it names is unused: it lists every key)."""
    import uuid

    from warmstart.s3url import parse_s3_url
    from warmstart.store.s3 import S3Store
    from warmstart.store.s3client import make_client

    client = make_client(endpoint, "us-east-1")
    bucket = f"image-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    (tmp_path / "spool").mkdir()
    return S3Store(client, parse_s3_url(f"s3://{bucket}/warmstart"), "-", spool_dir=tmp_path / "spool")


def without_record(folder: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree(folder).items() if k != "export.json"}


def test_export_from_s3_equals_export_from_the_volume(volume, s3_root, tmp_path):
    # Runpod's S3 API in front of a volume serves that volume's files under the same names: put them there.
    staged = volume / KEY / "staged"
    for path in sorted(p for p in staged.rglob("*") if p.is_file()):
        s3_root.call(
            "put_object", Key=s3_root.url.key(f"keys/{KEY}/staged/{path.relative_to(staged)}"), Body=path.read_bytes()
        )
    record = {"key": KEY, "factors": FACTORS, "published": "2026-12-01T10:00:00+00:00"}
    s3_root.call("put_object", Key=s3_root.url.key(f"keys/{KEY}/staged/key.json"), Body=json.dumps(record).encode())
    from_volume = baked(volume, tmp_path / "from-volume")
    found = stored_keys(None, s3_root)
    assert [(k.name, k.tier, dict(k.factors)) for k in found] == [(KEY, "s3", FACTORS)]
    chosen, missing = choose_keys(found, wanted=wanted(), gpus=["H100"])
    assert list(chosen) == [KEY] and not missing
    result = export(chosen, store_opener(None, s3_root), tmp_path / "from-s3")
    assert [(k.key, k.tier, k.generation) for k in result.keys] == [(KEY, "s3", 2)]
    assert without_record(tmp_path / "from-s3") == without_record(from_volume)
    assert json.loads((tmp_path / "from-s3" / "export.json").read_text())["keys"][KEY]["from"] == "s3"


def test_keys_published_to_each_tier_export_to_the_same_caches(volume, local, s3_root, tmp_path):
    from warmstart.store.restore import restore
    from warmstart.store.siblings import record_key, sibling_store

    s3 = sibling_store(s3_root, KEY)
    published = publish(s3, local, publisher="gpu", lease_wait_s=0)
    assert published.status == "published", published.detail
    record_key(s3, KEY, FACTORS, "2026-12-01T10:00:00+00:00")
    exports = {
        "volume": baked(volume, tmp_path / "from-volume"),
        "s3": export(
            *choose_keys(stored_keys(None, s3_root), names=[KEY])[:1], store_opener(None, s3_root), tmp_path / "from-s3"
        ).path,
    }
    restored = {}
    for tier, out in exports.items():
        dest = tmp_path / f"restored-{tier}"
        assert restore(image_store(out, KEY), dest, reader="w").restored
        restored[tier] = tree(dest)
    assert restored["s3"] == restored["volume"] == tree(local)


@pytest.mark.parametrize("bad", ["..", ".", "a b", "..%2f", ".hidden", "UPPER..x", "x" * 300])
def test_a_key_name_a_store_lists_that_is_no_key_name_is_skipped_and_the_export_folder_survives(
    volume, s3_root, tmp_path, caplog, bad
):
    """Any writer to the bucket can add `keys/../`: its CommonPrefix became the key `..`, a plain
    `--gpu` export chose it, and `rmtree(out/keys/..)` removed `out` (issue 38, finding 5). A name
    that is not a key's (key.py's grammar) is skipped, with a warning, wherever a listing yields it."""
    staged = volume / KEY / "staged"
    record = {"key": KEY, "factors": FACTORS, "published": "2999-01-01T00:00:00+00:00"}  # the newest
    for path in sorted(p for p in staged.rglob("*") if p.is_file()):
        s3_root.call(
            "put_object", Key=s3_root.url.key(f"keys/{bad}/staged/{path.relative_to(staged)}"), Body=path.read_bytes()
        )
    s3_root.call("put_object", Key=s3_root.url.key(f"keys/{bad}/staged/key.json"), Body=json.dumps(record).encode())
    listed = s3_root.call("list_objects_v2", Prefix=s3_root.url.key("keys/"), Delimiter="/")
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == [s3_root.url.key(f"keys/{bad}/")]
    out = tmp_path / "image-caches"
    out.mkdir()
    (out / "README.md").write_text("the repo's own file")
    found = stored_keys(volume, s3_root)
    assert [k.name for k in found] == [KEY]
    assert any("not a key name" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    chosen, missing = choose_keys(found, wanted=wanted(), gpus=["H100"])
    assert list(chosen) == [KEY] and not missing
    export(chosen, store_opener(volume, s3_root), out)
    assert (out / "README.md").read_text() == "the repo's own file"
    assert sorted(os.listdir(out / "keys")) == [KEY]


def test_a_gpu_that_matches_no_key_names_the_nearest_keys_and_what_differs():
    """`warmstart export --gpu H100` said only `no key`: now it names the near keys, as explain does (issue 38)."""
    from warmstart.imagecmd import near_keys

    h200 = {**FACTORS, "hardware": {**FACTORS["hardware"], "name": "NVIDIA H200"}}
    stored = [StoredKey("k-h100", FACTORS, "volume", "2026-12-02"), StoredKey("k-h200", h200, "s3", "2026-12-01")]
    assert near_keys(stored, wanted(), "H100") == []  # one matches: nothing to explain
    lines = near_keys(stored, wanted(max_model_len=1024), "H100")
    assert lines[0] == "--gpu H100: nearest key k-h100 (volume): --max-model-len 512 -> 1024"
    assert lines[1] == "--gpu H100: nearest key k-h200 (s3): GPU NVIDIA H200 -> H100, --max-model-len 512 -> 1024"
    assert near_keys(stored, wanted(), "B200")[0].startswith("--gpu B200: nearest key k-h100 (volume): GPU NVIDIA H100")
    assert near_keys([], wanted(), "H100") == ["--gpu H100: the store(s) hold no key at all"]


def test_image_caches_that_give_this_key_nothing_say_which_keys_they_hold_and_why(volume, tmp_path, caplog):
    """WARMSTART_IMAGE_CACHES at a .tar, or at caches without this boot's key, was silently ignored;
    so was `warmstart ls --image x.tar` (issue 38). The boot says why; ls reads the .tar as it is."""
    from warmstart.imagecmd import image_block

    folder = baked(volume, tmp_path / "image-caches")
    archive = baked(volume, tmp_path / "caches.tar")
    other = KEY.replace("h100-80gb-hbm3-sm90x1", "h200-141gb-hbm3e-sm90x1")
    flags_only = KEY[: -len("6cb17eac28")] + "0123456789"

    def warned() -> str:
        (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        caplog.clear()
        return line

    assert image_store(archive, KEY) is None
    assert f"{archive} is a file (it holds 1 key(s): {KEY})" in warned()
    assert image_store(folder, other) is None
    hardware = "hardware h100-80gb-hbm3-sm90x1 (this boot: h200-141gb-hbm3e-sm90x1)"
    assert f"they hold {KEY}: differs in {hardware}" in warned()
    assert image_store(folder, flags_only) is None
    assert "its flags or vLLM variables differ" in warned()
    assert image_store(tmp_path / "nowhere", KEY) is None and "no such folder" in warned()
    assert image_store(folder, KEY) is not None and not caplog.records
    (tmp_path / "plain").mkdir()  # a plain build: the caches folder holds only a README, nothing to say
    assert image_store(tmp_path / "plain", KEY) is None and not caplog.records
    from_tar, from_folder = image_block(archive), image_block(folder)
    assert from_tar is not None and from_folder is not None
    assert from_tar["keys"] == from_folder["keys"] and from_tar["keys"][0]["generation"] == 2
    assert from_tar["warnings"] and "is a .tar" in from_tar["warnings"][0]
