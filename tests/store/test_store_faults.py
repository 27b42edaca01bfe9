"""The store under faults the first soak never met (issue 30), each injected for real: a second
worker in its own pid namespace or in this one sharing the local cache, a volume whose listing
fails with EIO (the FUSE fault layer), a local disk out of inodes (a real tmpfs), malformed and
foreign objects in a real store, a lease taken over by a real second process, an S3 listing
truncated without a token (a proxy in front of moto), names that are not UTF-8, a path that
turned from a file into a directory, a writer holding a file open across a compaction.

Each test fails on the code before the fix (the finding's number is in its docstring).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from helpers.files import tree, write
from warmstart.store.backend import machine_id
from warmstart.store.bundle import StoreUnavailable
from warmstart.store.bundlegc import collect_garbage
from warmstart.store.publish import MAX_BUNDLES, plan_publish, publish
from warmstart.store.restore import _register_reader, restore
from warmstart.store.tiers import restore_tiers
from warmstart.store.volume import PublishLease, StagedStore
from warmstart_dev.faultfs import FaultRule
from warmstart_dev.slowfs import faulty_mounted


@pytest.fixture
def store(tmp_path: Path) -> StagedStore:
    return StagedStore(tmp_path / "volume" / "key" / "staged")


def local_cache(tmp_path: Path, name: str, files: int = 6, size: int = 300) -> Path:
    base = tmp_path / name / "cache"
    for i in range(files):
        write(base, f"inductor/{name}/k{i}.so", os.urandom(size + i))
    return base


# --------------------------------------------------------------------------- one local cache, two workers

RESTORER = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from warmstart.store.volume import StagedStore
from warmstart.store.tiers import restore_tiers
root, dest, who, hold = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "hold"
got = restore_tiers([StagedStore(Path(root))], dest, reader=who, ttl_s=60, deadline_s=float(sys.argv[5]))
result = got.result
print(json.dumps({"generation": result.generation if result else None, "files": result.files if result else 0,
                  "problems": list(got.problems)}), flush=True)
if hold:  # a serving worker: it compiles a kernel into its cache and keeps serving
    (dest / "inductor" / who).mkdir(parents=True, exist_ok=True)
    (dest / "inductor" / who / "served.so").write_bytes(b"compiled while serving")
    print("serving", flush=True)
    sys.stdin.readline()
"""


def restorer(
    store: StagedStore, dest: Path, who: str, *, pidns: bool, hold: bool = False, deadline_s: float = 30.0, **env: str
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", RESTORER, str(store.root), str(dest), who, "hold" if hold else "-", str(deadline_s)]
    if pidns:  # its own pid namespace: pid 1, as a container's first process is
        argv = ["unshare", "--pid", "--fork", "--mount-proc", *argv]
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def wait_for_line(stream, text: str, timeout_s: float = 60.0) -> list[str]:
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in stream:
            lines.append(line)
            if text in line:
                done.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(timeout_s), f"never saw {text!r}: {''.join(lines)[-3000:]}"
    return lines


def test_two_workers_in_their_own_pid_namespaces_share_a_local_cache(store, tmp_path):
    """Finding 1: both are pid 1. B took A's staging directory for its own leftover and removed it;
    A then swapped in what was there (or crashed, or left no cache at all)."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it makes pid namespaces (unshare --pid)")
    source = local_cache(tmp_path, "a", files=40, size=4000)
    assert publish(store, source, publisher="a", lease_wait_s=0).status == "published"
    dest = tmp_path / "shared" / "cache"
    resume = tmp_path / "resume-a"
    a = restorer(
        store,
        dest,
        "worker-a",
        pidns=True,
        WARMSTART_TEST_STEPS="1",
        WARMSTART_TEST_PAUSE_AT="restore:extracted",
        WARMSTART_TEST_RESUME=str(resume),
    )
    try:
        wait_for_line(a.stderr, "step     | restore:extracted")  # A extracted into its staging directory
        b = restorer(store, dest, "worker-b", pidns=True, deadline_s=3.0)
        _, b_err = b.communicate(timeout=120)
        resume.touch()
        a_out, a_err = a.communicate(timeout=120)
    finally:
        a.kill()
    assert a.returncode == 0, a_err[-3000:]
    assert b.returncode == 0, b_err[-3000:]
    a_result = json.loads(a_out.splitlines()[-1])
    assert (a_result["generation"], a_result["files"]) == (1, 40)
    assert tree(dest) == tree(source), "the cache holds what A's restore reports"
    assert not [p for p in dest.parent.iterdir() if p != dest and not p.name.endswith(".lock")], "no leftovers"
    skipped = [line for line in b_err.splitlines() if "local cache" in line and "another worker" in line]
    assert len(skipped) == 1, b_err[-3000:]


def test_a_second_worker_of_the_key_does_not_swap_away_a_serving_workers_cache(store, tmp_path):
    """Finding 7: one pid namespace, one WARMSTART_LOCAL_CACHE. The second worker's restore replaced
    the serving worker's cache, deleting the kernel it had compiled and not published yet."""
    source = local_cache(tmp_path, "a")
    assert publish(store, source, publisher="a", lease_wait_s=0).status == "published"
    dest = tmp_path / "shared" / "cache"
    a = restorer(store, dest, "worker-a", pidns=False, hold=True)
    try:
        wait_for_line(a.stdout, "serving")
        b = restorer(store, dest, "worker-b", pidns=False, deadline_s=3.0)
        _, b_err = b.communicate(timeout=120)
        assert b.returncode == 0, b_err[-3000:]
        assert (dest / "inductor/worker-a/served.so").read_bytes() == b"compiled while serving"
        assert {k: v for k, v in tree(dest).items() if "worker-a" not in k} == tree(source)
        (line,) = [line for line in b_err.splitlines() if "local cache" in line and "another worker" in line]
        assert str(dest) in line
    finally:
        a.communicate("\n", timeout=30)


# --------------------------------------------------------------------------- malformed and foreign objects


@pytest.mark.parametrize("files", [[], "x", 5, None])
def test_an_index_of_another_shape_is_a_skipped_generation(store, tmp_path, files):
    """Finding 2: `"files"` as valid JSON of another type raised AttributeError out of restore,
    latest(), plan_publish and gc: every boot of the key exited."""
    local = local_cache(tmp_path, "a")
    assert publish(store, local, publisher="a", lease_wait_s=0).status == "published"
    index = json.loads(store.read("generations/g00000001.json"))
    index.update(generation=2, files=files)
    (store.generations_dir / "g00000002.json").write_text(json.dumps(index))  # another tool's, or a future format
    (store.generations_dir / "notes.txt").write_text("a foreign object")
    (store.bundles / "foreign.bin").write_bytes(os.urandom(100))
    dest = tmp_path / "b" / "cache"
    result = restore(store, dest, reader="b")
    assert (result.generation, result.bad_bundles) == (1, ())
    assert len(result.problems) == 1 and "g00000002.json" in result.problems[0], result.problems
    assert tree(dest) == tree(local)
    newest, warnings = store.latest()
    assert newest is not None and newest.number == 1 and len(warnings) == 1
    collect_garbage(store, ttl_s=0).execute(store)
    assert plan_publish(store, dest).empty
    write(dest, "inductor/b/new.so", b"new")
    assert publish(store, dest, publisher="b", lease_wait_s=0).status == "published"


def test_a_corrupt_newest_generation_does_not_stop_every_later_publish(store, tmp_path):
    """Finding 4: the next number came from the newest *loadable* generation, which was taken."""
    local = local_cache(tmp_path, "a")
    assert publish(store, local, publisher="a", lease_wait_s=0).status == "published"
    (store.generations_dir / "g00000002.json").write_bytes(b"\x00not json")
    write(local, "inductor/a/later.so", b"later")
    result = publish(store, local, publisher="a", lease_wait_s=0)
    assert (result.status, result.generation) == ("published", 3), result.detail
    dest = tmp_path / "b" / "cache"
    assert restore(store, dest, reader="b").generation == 3
    assert tree(dest) == tree(local)


def test_a_cache_file_whose_name_is_not_utf8_does_not_stop_the_key(store, tmp_path, caplog):
    """Finding 4: the worker published such a name, refused its own generation on load, and every
    later publish failed ("a generation appeared and vanished")."""
    local = local_cache(tmp_path, "a")
    odd = os.path.join(os.fsencode(local / "inductor" / "a"), b"k\xff.so")
    with open(odd, "wb") as handle:
        handle.write(b"odd name")
    first = publish(store, local, publisher="a", lease_wait_s=0)
    assert first.status == "published", first.detail
    gen = store.load(first.generation)  # loads: the name was left out
    assert len(gen.files) == 6
    assert any("not valid UTF-8" in r.message for r in caplog.records)
    write(local, "inductor/a/later.so", b"later")
    second = publish(store, local, publisher="a", lease_wait_s=0)
    assert (second.status, second.generation) == ("published", first.generation + 1), second.detail


def test_a_path_that_turned_from_a_file_into_a_directory_keeps_the_key_restorable(store, tmp_path):
    """Finding 11: the union kept both `p` (a file) and `p/q`, so no later generation restored."""
    a = tmp_path / "a" / "cache"
    write(a, "inductor/shared/p", b"a file first")
    write(a, "inductor/a/k.so", b"k")
    assert publish(store, a, publisher="a", lease_wait_s=0).status == "published"
    b = tmp_path / "b" / "cache"
    write(b, "inductor/shared/p/q", b"then a directory")
    assert publish(store, b, publisher="b", lease_wait_s=0).status == "published"
    for n in range(MAX_BUNDLES):  # and through compactions, which carry the union
        write(b, f"inductor/b/n{n}.so", os.urandom(50))
        assert publish(store, b, publisher="b", lease_wait_s=0).status == "published"
    dest = tmp_path / "c" / "cache"
    result = restore(store, dest, reader="c")
    assert (result.generation, result.problems) == (store.generation_numbers()[-1], ()), result.problems
    assert (dest / "inductor/shared/p/q").read_bytes() == b"then a directory"
    assert (dest / "inductor/a/k.so").read_bytes() == b"k"


PUBLISHER = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from warmstart.store.publish import publish
from warmstart.store.volume import StagedStore
result = publish(StagedStore(Path(sys.argv[1])), Path(sys.argv[2]), publisher=sys.argv[3], lease_wait_s=0)
print(json.dumps({"status": result.status, "generation": result.generation, "detail": result.detail}), flush=True)
"""


def publisher(root: Path, local: Path, who: str, **env: str) -> subprocess.Popen[str]:
    """A worker's publish of `local` into the store at `root`, pid 1 of its own pid namespace."""
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PUBLISHER, str(root), str(local), who]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


@pytest.mark.parametrize("remover", ["sibling", "anything"])
def test_a_compaction_keeps_its_carried_copies_while_a_cache_sharing_worker_publishes(store, tmp_path, remover):
    """Found by the 200-round soak (round 115, S3): two workers share one local cache, each pid 1 of its
    own container. A, cold, compacts into S3: it copies the base's files out of the store beside the
    cache to repack them. B publishes to the volume meanwhile and, at its start and end, cleared the
    same `<cache>.compacting-1`: A's copies went missing and its union forgot them (394 paths). Each
    publish now has its own; and copies that go missing all the same (`anything`: here the test
    removes them) are carried again after packing, as a base file that changed locally is."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it makes pid namespaces (unshare --pid)")
    source = local_cache(tmp_path, "a", files=3)
    for n in range(MAX_BUNDLES):
        write(source, f"inductor/a/n{n}.so", os.urandom(100))
        assert publish(store, source, publisher="a", lease_wait_s=0).status == "published"
    shared = tmp_path / "shared" / "cache"
    write(shared, "inductor/cold/new.so", b"compiled by the cold worker")
    resume = tmp_path / "resume"
    a = publisher(
        store.root,
        shared,
        "a",
        WARMSTART_TEST_STEPS="1",
        WARMSTART_TEST_PAUSE_AT="publish:carried",
        WARMSTART_TEST_RESUME=str(resume),
    )
    try:
        wait_for_line(a.stderr, "step     | publish:carried")  # A holds the base's files, copied out
        if remover == "sibling":
            other = StagedStore(tmp_path / "other-volume" / "key" / "staged")
            b = publisher(other.root, shared, "b")
            b_out, b_err = b.communicate(timeout=120)
            assert b.returncode == 0 and json.loads(b_out)["status"] == "published", b_err[-3000:]
        else:
            (copies,) = shared.parent.glob("cache.compacting-*")
            shutil.rmtree(copies)
        resume.touch()
        a_out, a_err = a.communicate(timeout=120)
    finally:
        a.kill()
    assert a.returncode == 0, a_err[-3000:]
    result = json.loads(a_out)
    assert result["status"] == "published" and "compacting" in result["detail"], result
    newest = store.load(result["generation"])
    assert set(newest.files) == set(tree(source)) | {"inductor/cold/new.so"}, "the union forgot what its base held"
    dest = tmp_path / "check" / "cache"
    assert restore(store, dest, reader="check").generation == result["generation"]
    assert tree(dest) == tree(source) | {"inductor/cold/new.so": b"compiled by the cold worker"}
    assert not list(shared.parent.glob("cache.compacting-*")), "each publish removed its own copies"


@pytest.mark.parametrize("compacting", [False, True])
def test_a_stale_restored_file_does_not_undo_another_workers_newer_directory(store, tmp_path, compacting):
    """Found by the 200-round soak (round 112, S3): worker A turned `p` into `p/q` and published; worker B,
    which had restored `p` as a file before that, published after A and its stale copy of `p` won the
    conflict, so A's `p/q`, finished before A's publish, left the union. The newer form wins, whoever
    publishes last: a restored file carries its generation's mtime, older than what A wrote."""
    a = tmp_path / "a" / "cache"
    write(a, "inductor/shared/p", b"a file first")
    assert publish(store, a, publisher="a", lease_wait_s=0).status == "published"
    b = tmp_path / "b" / "cache"
    assert restore(store, b, reader="b").generation == 1  # B holds `p` as a file, as restored
    if compacting:  # B's next publish will be a compaction: it repacks all of its local files
        for n in range(MAX_BUNDLES - 2):
            write(a, f"inductor/a/n{n}.so", os.urandom(50))
            assert publish(store, a, publisher="a", lease_wait_s=0).status == "published"
    (a / "inductor/shared/p").unlink()
    time.sleep(0.01)  # A's new form is written after the restore copied `p`'s recorded mtime
    write(a, "inductor/shared/p/q", b"then a directory")
    assert publish(store, a, publisher="a", lease_wait_s=0).status == "published"
    write(b, "inductor/b/k.so", b"b's own kernel")
    result = publish(store, b, publisher="b", lease_wait_s=0)
    assert result.status == "published" and ("compacting" in result.detail) == compacting, result.detail
    newest = store.load(result.generation)
    assert "inductor/shared/p/q" in newest.files and "inductor/shared/p" not in newest.files
    assert "inductor/b/k.so" in newest.files
    dest = tmp_path / "c" / "cache"
    assert restore(store, dest, reader="c").generation == result.generation
    assert (dest / "inductor/shared/p/q").read_bytes() == b"then a directory"


def test_a_compaction_keeps_a_base_file_that_is_open_for_writing_locally(store, tmp_path):
    """Finding 5: a file the base holds, open for writing here, was neither carried (a local copy
    exists) nor packed (not stable): the compaction dropped it from the union."""
    a = local_cache(tmp_path, "a")
    for n in range(MAX_BUNDLES):
        write(a, f"inductor/a/n{n}.so", os.urandom(80))
        assert publish(store, a, publisher="a", lease_wait_s=0).status == "published"
    b = tmp_path / "b" / "cache"
    assert restore(store, b, reader="b").generation == MAX_BUNDLES
    held = b / "inductor/a/k1.so"
    before = held.read_bytes()
    write(b, "inductor/b/new.so", b"new")
    with open(held, "r+b"):  # a compiler holds it open for writing (it has not written yet)
        result = publish(store, b, publisher="b", lease_wait_s=0)
    assert result.status == "published" and "compacting" in result.detail
    newest = store.load(result.generation)
    assert "inductor/a/k1.so" in newest.files
    dest = tmp_path / "c" / "cache"
    assert restore(store, dest, reader="c").generation == result.generation
    assert (dest / "inductor/a/k1.so").read_bytes() == before
    assert tree(dest) == tree(a) | {"inductor/b/new.so": b"new"}


# --------------------------------------------------------------------------- the volume fails


@pytest.mark.fuse
def test_a_volume_listing_that_fails_with_eio_is_not_an_empty_folder(tmp_path):
    """Finding 9: `names()` read EIO as an empty folder: a silent cold boot, and gc that saw no
    readers and removed a generation being restored."""
    source_root = tmp_path / "volume-source"
    with faulty_mounted(source_root, tmp_path / "volume") as (mnt, faults):
        store = StagedStore(mnt / "key" / "staged")
        local = local_cache(tmp_path, "a")
        for n in range(3):
            if n == 2:
                _register_reader(store, "restoring-g1", store.load(1), 600.0)  # a slow restore of generation 1
            write(local, f"inductor/a/g{n}.so", os.urandom(100))
            assert publish(store, local, publisher="a", lease_wait_s=0).status == "published"
        faults.set([FaultRule("readdir", "EIO", 1.0, "/generations")])
        dest = tmp_path / "b" / "cache"
        result = restore(store, dest, reader="b")
        assert result.unavailable and not result.restored
        assert any("Input/output error" in p for p in result.problems), result.problems
        again = publish(store, local, publisher="b", lease_wait_s=0)
        assert again.status == "failed" and "no generation" not in again.detail
        faults.set([FaultRule("readdir", "EIO", 1.0, "/readers")])
        with pytest.raises(StoreUnavailable):
            collect_garbage(store, ttl_s=0)
        faults.clear()
        assert faults.injected().get("readdir:EIO", 0) >= 3
        assert store.generation_numbers() == [1, 2, 3], "the generation being restored is still there"


def test_a_local_disk_out_of_inodes_starts_cold_instead_of_crashing(store, tmp_path, caplog):
    """Finding 12: `staging.mkdir` ran outside any `try`: ENOSPC crashed the boot."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it mounts a small tmpfs")
    local = local_cache(tmp_path, "a")
    assert publish(store, local, publisher="a", lease_wait_s=0).status == "published"
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=64", "tmpfs", str(small)], check=True)
    try:
        dest = small / "cache"
        dest.mkdir()
        filler = small / "filler"
        filler.mkdir()
        with pytest.raises(OSError):
            for n in range(100):
                (filler / str(n)).touch()
        got = restore_tiers([store], dest, reader="b", ttl_s=60, deadline_s=30)
        assert not got.restored
        assert any("No space left on device" in p for p in got.problems), got.problems
        assert dest.is_dir(), "the (empty) cache is still there for vLLM to write to"
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any("volume" in w and "No space left on device" in w for w in warnings), warnings
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


TAKER = """
import sys
from pathlib import Path
from warmstart.store.volume import PublishLease, StagedStore
lease = PublishLease(StagedStore(Path(sys.argv[1])), "taker-q", ttl_s=60)
print("held" if lease.try_acquire() else "refused", flush=True)
sys.stdin.readline()
"""


def test_taking_over_a_stale_lease_never_leaves_two_live_holders(store, tmp_path, monkeypatch):
    """Finding 13: between judging the lease stale and renaming it away, a second worker took it
    over; the rename moved the second worker's live lease, and both held one."""
    store.create()
    stale = {"holder": "dead", "host": "h", "machine": machine_id(), "pid": 0, "ttl_s": 10, "expires": 0}
    store.lease_path.write_text(json.dumps(stale))
    past = time.time() - 3600
    os.utime(store.lease_path, (past, past))
    taker: list[subprocess.Popen[str]] = []
    original = PublishLease._stale

    def judged(self, data):  # a real second process takes the lease over right after this judgement
        verdict = original(self, data)
        if verdict and not taker:
            proc = subprocess.Popen(
                [sys.executable, "-c", TAKER, str(store.root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            taker.append(proc)
            assert proc.stdout.readline().strip() == "held"
        return verdict

    monkeypatch.setattr(PublishLease, "_stale", judged)
    try:
        mine = PublishLease(store, "worker-p", ttl_s=60)
        got = mine.try_acquire()
        holder = json.loads(store.lease_path.read_text())["holder"]
        assert not got and holder == "taker-q", f"two holders: worker-p {got}, the file names {holder}"
    finally:
        for proc in taker:
            proc.communicate("\n", timeout=30)


# --------------------------------------------------------------------------- S3


@pytest.mark.usefixtures("aws_credentials")
def test_an_s3_listing_truncated_without_a_token_is_skipped_not_looped(endpoint, tmp_path):
    """Finding 14: `IsTruncated` without `NextContinuationToken` looped for ever, past the deadline."""
    from warmstart.s3url import parse_s3_url
    from warmstart.store.s3 import S3Store
    from warmstart.store.s3client import make_client
    from warmstart_dev.throttle import throttled

    bucket = f"warm-{uuid.uuid4().hex[:12]}"
    make_client(endpoint, "us-east-1").create_bucket(Bucket=bucket)
    local = local_cache(tmp_path, "a")
    direct = S3Store(make_client(endpoint, "us-east-1"), parse_s3_url(f"s3://{bucket}/w"), "key-a")
    assert publish(direct, local, publisher="a", lease_wait_s=0).status == "published"
    with throttled(endpoint, fault="notoken", every=1) as url:
        store = S3Store(make_client(url, "us-east-1"), parse_s3_url(f"s3://{bucket}/w"), "key-a")
        out: list = []
        worker = threading.Thread(target=lambda: out.append(restore(store, tmp_path / "b", reader="b")), daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "the listing loops"
    (result,) = out
    assert result.unavailable and not result.restored
    assert any("continuation token" in p for p in result.problems), result.problems
