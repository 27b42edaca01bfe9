"""Reading bundles back: the streaming tar reader, zstd frames, old bundles, old readers, and kills.

A bundle is read in chunks whose boundaries fall anywhere (8 MiB reads on the volume, ranged GETs
on S3, 4 MiB pieces out of zstd), so the reader is fed every cut that matters here: inside a header,
inside a member's data, inside its padding, inside a GNU long name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard

from helpers.files import tree, write
from helpers.run import base_env, read_until, run_warmstart
from warmstart.store.bundle import BundleRef, FileEntry, Generation, StoreError, bundle_name
from warmstart.store.extract import Ahead, extract_bundle
from warmstart.store.pack import pack_bundle
from warmstart.store.publish import execute_publish, plan_publish
from warmstart.store.restore import restore
from warmstart.store.swap import clear_leftovers, staging_dir
from warmstart.store.volume import StagedStore
from warmstart.store.zst import FRAME_RAW, NOTE_FRAME, is_zstd

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FORMATS = {"tar": False, "zstd": True}
LONG = "inductor/" + "d" * 120 + "/" + "k" * 110 + ".so"  # over tar's 100-byte name field: a GNU 'L' member


def cache(base: Path, *, big: bool = True) -> Path:
    """Files at the sizes that matter to a tar reader, and (`big`) one that spans zstd frames."""
    sizes = {
        "triton/a/kernel.cubin": 0,
        "triton/a/kernel.json": 511,
        "triton/a/kernel.ptx": 512,
        "triton/b/kernel.cubin": 513,
        LONG: 2000,
        "inductor/c1/x.py": 70_000,
    }
    if big:
        sizes["vllm/torch_compile_cache/h/rank_0_0/backbone/artifact"] = FRAME_RAW + 12_345
    for rel, size in sizes.items():
        write(base, rel, (os.urandom(64) * (size // 64 + 1))[:size])
    return base


def packed(local: Path, compress: bool) -> tuple[bytes, BundleRef, Generation]:
    sink = io.BytesIO()
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    out = pack_bundle(local, files, sink, compress=compress)
    ref = BundleRef(bundle_name(out.sha256, "00000000", compressed=compress), out.sha256, out.size, len(out.files))
    entries = {rel: FileEntry(size, mtime, ref.name, sha) for rel, (size, mtime, sha) in out.files.items()}
    return sink.getvalue(), ref, Generation(1, (ref,), entries, 0.0, "test")


def chunks(data: bytes, size: int):
    return iter([data[i : i + size] for i in range(0, len(data), size)])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("chunk", [1, 7, 511, 512, 513, 4096, 8 << 20])
def test_every_file_is_written_whole_wherever_the_chunks_cut(tmp_path, fmt, chunk):
    local = cache(tmp_path / "local", big=chunk >= 4096)
    data, ref, gen = packed(local, FORMATS[fmt])
    assert is_zstd(data) is FORMATS[fmt]
    dest = tmp_path / "dest"
    dest.mkdir()
    assert extract_bundle(chunks(data, chunk), ref, gen, dest) == len(gen.files)
    assert tree(dest) == tree(local)
    for rel in gen.files:
        assert (dest / rel).stat().st_mtime_ns == (local / rel).stat().st_mtime_ns


def test_a_compressed_bundle_is_a_note_then_zstd_frames_of_the_same_tar(tmp_path):
    local = cache(tmp_path / "local")
    plain, _, _ = packed(local, False)
    compressed, _, _ = packed(local, True)
    assert compressed.startswith(NOTE_FRAME)
    inner = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(compressed), read_across_frames=True).read()
    assert inner == plain, "zstd -d gives back the very tar stream a plain bundle holds"
    with tarfile.open(fileobj=io.BytesIO(inner)) as tar:
        assert LONG in tar.getnames()
    frames = 0
    rest = compressed[len(NOTE_FRAME) :]
    while rest:
        size = zstandard.get_frame_parameters(rest).content_size
        assert 0 < size <= FRAME_RAW
        frame = zstandard.ZstdDecompressor().decompressobj()
        frame.decompress(rest)
        rest = frame.unused_data
        frames += 1
    assert frames == -(-len(plain) // FRAME_RAW), "independent frames, FRAME_RAW bytes of tar each"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("damage", ["flip-early", "flip-late", "truncate", "cut-to-note"])
def test_damage_anywhere_is_reported_against_the_bundle(tmp_path, fmt, damage):
    local = cache(tmp_path / "local")
    data, ref, gen = packed(local, FORMATS[fmt])
    blob = bytearray(data)
    if damage == "flip-early":
        blob[len(NOTE_FRAME) + 700 if FORMATS[fmt] else 700] ^= 0x01
    elif damage == "flip-late":
        blob[len(blob) - 5000] ^= 0x01
    elif damage == "truncate":
        del blob[len(blob) // 2 :]
    else:
        del blob[len(NOTE_FRAME) :]
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(StoreError) as raised:
        extract_bundle(chunks(bytes(blob), 8192), ref, gen, dest)
    assert raised.value.bundle == ref.name


def test_tar_bundles_and_indexes_already_on_volumes_keep_restoring(tmp_path):
    """A store as releases before compression wrote it: a GNU tar made by tarfile, and the oldest
    index format (files as [size, mtime_ns, bundle], no sha256)."""
    local = cache(tmp_path / "local")
    store = StagedStore(tmp_path / "volume" / "staged")
    store.create()
    name = "0123456789abcdef-00000000.tar"
    with tarfile.open(store.bundles / name, "w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(local.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=path.relative_to(local).as_posix())
    data = (store.bundles / name).read_bytes()
    files = {
        p.relative_to(local).as_posix(): [p.stat().st_size, p.stat().st_mtime_ns, name]
        for p in local.rglob("*")
        if p.is_file()
    }
    index = {
        "version": 1,
        "generation": 1,
        "created": 0.0,
        "publisher": "old",
        "bundles": [{"name": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "files": len(files)}],
        "files": files,
    }
    (store.generations_dir / "g00000001.json").write_text(json.dumps(index))
    result = restore(store, tmp_path / "dest", reader="new")
    assert result.generation == 1 and result.problems == ()
    assert tree(tmp_path / "dest") == tree(local)


def load_old_reader():
    """The bundle module of the release before compressed bundles (tests/fixtures), as it ran."""
    path = FIXTURES / "bundle_before_zstd.py"
    spec = importlib.util.spec_from_file_location("warmstart.store.bundle_before_zstd", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_an_older_worker_finds_a_compressed_bundle_unreadable_and_writes_nothing(tmp_path):
    """Mixed fleets: an older warmstart reads the new generation's index (its format did not change)
    and the bundle as tar. The note frame makes that a one-member archive that ends at once, so the
    old reader raises its own StoreError naming the bundle (which it then distrusts: its restore takes
    an older generation, its publish writes a tar generation without it) and writes no file."""
    old = load_old_reader()
    local = cache(tmp_path / "local")
    store = StagedStore(tmp_path / "volume" / "staged")
    execute_publish(store, local, plan_publish(store, local), publisher="new")
    raw = (store.generations_dir / "g00000001.json").read_text()
    gen = old.Generation.from_json(json.loads(raw))
    (ref,) = gen.bundles
    assert ref.name.endswith(".tar.zst")
    dest = tmp_path / "old-dest"
    with pytest.raises(old.StoreError) as raised:
        old.extract_bundle(old.file_chunks(store.bundles / ref.name), ref, gen, dest)
    assert raised.value.bundle == ref.name
    assert f"holds 0 of the {len(gen.files)} files" in str(raised.value)
    assert [p for p in dest.rglob("*") if p.is_file()] == []


def test_an_older_worker_still_reads_what_a_new_worker_writes_uncompressed(tmp_path):
    old = load_old_reader()
    local = cache(tmp_path / "local")
    store = StagedStore(tmp_path / "volume" / "staged", compression="none")
    execute_publish(store, local, plan_publish(store, local), publisher="new")
    gen = old.Generation.from_json(json.loads((store.generations_dir / "g00000001.json").read_text()))
    (ref,) = gen.bundles
    dest = tmp_path / "old-dest"
    assert old.extract_bundle(old.file_chunks(store.bundles / ref.name), ref, gen, dest) == len(gen.files)
    assert tree(dest) == tree(local)


def test_ahead_hands_over_items_and_errors_in_order_and_stops_when_closed():
    def items():
        yield 1
        yield 2
        raise StoreError("cut")

    ahead = Ahead(items(), depth=1, name="t")
    assert [next(ahead), next(ahead)] == [1, 2]
    with pytest.raises(StoreError, match="cut"):
        next(ahead)
    closed = threading.Event()

    def endless():
        try:
            while True:
                yield b"x"
        finally:
            closed.set()

    ahead = Ahead(endless(), depth=2, name="t")
    next(ahead)
    ahead.close()
    assert closed.wait(5), "a closed stage stops its thread and closes its source"


def test_leftovers_of_other_restores_go_and_this_processs_own_stay(tmp_path):
    """Run under the cache's exclusive lock (store/cachelock.py): every other restore's directory is a
    dead one's, whatever its pid says (pids repeat across pid namespaces: both containers are pid 1)."""
    dest = tmp_path / "cache"
    others = (
        "cache.restoring-1-s3",
        "cache.restoring-1_0a1b2c3d-volume",
        "cache.replaced-1_0a1b2c3d",
        "cache.compacting-1_0a1b2c3d",  # a killed compaction's carried copies (store/publish.py)
    )
    # This process's: a tier's restore its deadline left behind may still write.
    own = (staging_dir(dest, "volume").name, staging_dir(dest, "s3").name)
    for name in (*others, *own):
        write(tmp_path / name, "f", b"x")
    write(tmp_path / "cache.notes-x", "f", b"not a restore's")
    clear_leftovers(dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*own, "cache.notes-x"])


RESTORER = """
import logging, sys
from pathlib import Path
from warmstart.store.volume import StagedStore
from warmstart.store.restore import restore
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
restore(StagedStore(Path(sys.argv[1])), Path(sys.argv[2]), reader="killed")
"""


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_restore_killed_mid_file_leaves_the_cache_as_it_was(tmp_path, fmt):
    """SIGKILL a real restore process while a file is half written: the cache it was replacing is
    untouched, the half-written file lies only in the dead process's staging directory (never read),
    and the next restore takes the generation whole and removes what the dead one left."""
    store = StagedStore(tmp_path / "volume" / "staged", compression="zstd" if FORMATS[fmt] else "none")
    first = cache(tmp_path / "one")
    execute_publish(store, first, plan_publish(store, first), publisher="a")
    dest = tmp_path / "worker" / "cache"
    assert restore(store, dest, reader="before").generation == 1
    before = tree(dest)
    second = tmp_path / "two"
    write(second, "vllm/big/artifact", os.urandom(10 << 20))  # spans 8 MiB reads and 4 MiB pieces
    assert execute_publish(store, second, plan_publish(store, second), publisher="b").generation == 2

    env = {
        **os.environ,
        "WARMSTART_TEST_STEPS": "1",
        "WARMSTART_TEST_PAUSE_AT": "restore:file_partly_written",
        "WARMSTART_TEST_RESUME": str(tmp_path / "never"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", RESTORER, str(store.root), str(dest)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        read_until(proc, "step     | restore:file_partly_written", [])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    (staging,) = dest.parent.glob(f"cache.restoring-{proc.pid}_*-{store.kind}")  # per process and store
    entries = store.load(2).files
    cut = [rel for rel, blob in tree(staging).items() if len(blob) < entries[rel].size]
    assert len(cut) == 1, "the kill landed inside a file"
    assert tree(dest) == before, "the cache being replaced is untouched"
    assert plan_publish(store, dest).empty, "nothing partial is offered for publishing"

    result = restore(store, dest, reader="after")
    assert result.generation == 2 and result.problems == ()
    assert tree(dest) == tree(first) | tree(second)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["cache", "cache.lock"], (
        "the dead restore's staging is gone"
    )


@pytest.mark.parametrize(("setting", "suffix"), [(None, ".tar.zst"), ("zstd", ".tar.zst"), ("none", ".tar")])
def test_a_boot_writes_bundles_as_the_setting_says_and_the_next_boot_restores_them(
    tmp_path, volume, tiny_model, fake_vllm_python, setting, suffix
):
    extra = {"WARMSTART_BUNDLE_COMPRESSION": setting} if setting else {}
    env = base_env(volume, fake_vllm_python, tmp_path, FAKE_VLLM_ARTIFACTS="3:10000:a", **extra)
    env["WARMSTART_LOCAL_CACHE"] = str(tmp_path / "local-1")
    assert run_warmstart(["boot", "--json"], env).returncode == 0
    (key_dir,) = (volume / "warmstart" / "keys").iterdir()
    (bundle,) = (key_dir / "staged" / "bundles").iterdir()
    assert bundle.name.endswith(suffix)
    env["WARMSTART_LOCAL_CACHE"] = str(tmp_path / "local-2")
    second = json.loads(run_warmstart(["boot", "--json"], env).stdout)
    assert (second["staged"]["generation_restored"], second["verdict"]) == (1, "warm")


@pytest.mark.parametrize("change", ["appended", "cut"])
def test_a_bundle_file_of_another_size_than_its_index_is_bad(tmp_path, change):
    """The volume's bundles are read by positional reads of the index's size: bytes appended
    after them would never be read, so the file's size is checked against the index first."""
    local = cache(tmp_path / "local", big=False)
    store = StagedStore(tmp_path / "volume" / "staged")
    execute_publish(store, local, plan_publish(store, local), publisher="a")
    (ref,) = store.load(1).bundles
    path = store.bundles / ref.name
    data = path.read_bytes()
    path.write_bytes(data + b"\0" * 512 if change == "appended" else data[:-1])
    result = restore(store, tmp_path / "dest", reader="b")
    assert result.generation is None and result.bad_bundles == (ref.name,)
    assert f"{ref.size + 512 if change == 'appended' else ref.size - 1} bytes, index: {ref.size}" in result.problems[0]
