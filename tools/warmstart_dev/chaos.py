"""`bench chaos`: a soak of the staged tiers under faults, stopping by itself after `rounds` rounds.

Each round starts `workers` worker processes on one volume folder and one S3 store (moto on
loopback) reached through the fault proxy (`throttle`: 503 SlowDown, bodies cut mid-read,
refused connections, listings truncated without a continuation token, on a random share of
requests); some workers have no volume (another datacenter: the S3 store only). The volume is
the FUSE fault layer (`faultfs`) over a folder: listings fail with EIO, opens with EIO, renames
and links with EIO, writes and creates with ENOSPC, each on a share of calls. A worker does what
a staged boot does to its tiers, with the scripted engine's part played by a writer: restore from
the nearest tier, "compile" new cache files (one of them written slowly by a thread while the
publish runs, as lazy JIT does; one held open for writing across the publishes, as is a restored
file now and then; now and then a name that is not UTF-8, or a path that was a file and becomes a
directory), publish to each tier, and now and then collect garbage, each tier's restore, publish
and collection under a deadline as a boot's are (store/deadline.py). In some rounds two workers
share one local cache, each in a pid namespace of its own (pid 1 both, as two containers on one
host; root only). Before some rounds the bench drops a malformed generation and foreign objects
into each tier. The bench SIGKILLs a random worker at a random moment in some rounds. After every
round it checks, talking to the stores directly (not through the proxy or the fault layer):

- every generation verifies: each bundle restores, with its checksum (a malformed one the bench
  dropped is skipped);
- no bytes that no writer finished writing: every file of every generation, and every file a
  worker restored, holds bytes some writer recorded as finished (recorded after its last byte);
- the union: every file a worker finished before a publish that returned (published or nothing
  new) is in that tier's newest generation (gc here removes old generations only, never a key);
- the union never forgets: every path of a tier's newest generation at the previous check is in
  its newest now (unless it became a directory, or a restore found its bundle corrupt);
- the union restores: no path of a newest generation is the parent directory of another;
- nothing live deleted: no restore found a bundle missing (a reader's registration protects it);
- no worker exited non-zero, none hung: a store fault never ends a boot;
- a restore reports what the cache holds: the files it says it restored are the cache's;
- no silent cold boot: a tier that held a generation never answers "no generation";
- no stuck numbering: no publish failed to claim a generation number.

A round costs what it added, not the whole union: each bundle is read (restored, checksum and
all) once, and a later generation that takes the same members from it is checked against their
recorded digests while the stored object is unchanged (`Verified`). The union every worker
restores grows by about 0.1 MB a round (files of 200 B to 40 kB; 300 kB before).

    warmstart-dev bench chaos --json [--rounds 200] [--workers 3] [--fault-rate 0.05]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS = "slowdown,cut,refuse,notoken"
KEY = "chaos-key"
SHARE_RATE = 0.3  # rounds in which two workers share one local cache (each in its own pid namespace)
TURN_RATE = 0.3  # workers that turn a file of the union into a directory (or write the file)
ODD_NAME_RATE = 0.2  # workers that write a cache file whose name is not UTF-8
HOLD_RATE = 0.5  # workers that hold a restored file open for writing across their publishes
MALFORMED_RATE = 0.1  # rounds before which the bench drops a malformed generation and foreign objects
GC_TTL_S = 30.0  # bundles younger than this are never collected (a publish may be about to index them)
READER_TTL_S = 60.0  # a killed worker's reader registration protects its generation this long
DEADLINE_S = 30.0  # each tier's restore and publish, as WARMSTART_RESTORE/PUBLISH_DEADLINE_S bound a boot's
HANG_S = 300.0  # a worker still running after this is a violation (its deadlines add up to 150 s)
# Sizes: a compiled file of 200 B to 40 kB, and a late one of 64 kB. Responses are cut after 32 KiB
# and bundles fetched in 256 KiB ranges, so cut bodies and multi-range bundles (every compaction's)
# both happen; the union every restore reads grows by about 0.1 MB a round.
FILE_SIZES = (200, 40_000)
LATE_SIZE = 64 * 1024


# --------------------------------------------------------------------------- the worker (a process)


def _journal(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as handle:  # one short line per write: appends do not interleave
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def finished_digests(journal: Path) -> dict[str, set[str]]:
    """rel path -> every digest a writer finished for it."""
    out: dict[str, set[str]] = {}
    for record in _records(journal):
        if record.get("event") == "finished" and record.get("rel"):
            out.setdefault(record["rel"], set()).add(record["sha"])
    return out


def _records(journal: Path) -> list[dict[str, Any]]:
    out = []
    try:
        lines = journal.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill
    return out


def _tiers(config: dict[str, Any], endpoint: str, range_size: int = 256 * 1024) -> list[Any]:
    from warmstart.s3url import parse_s3_url
    from warmstart.store.s3 import S3Store
    from warmstart.store.s3client import make_client
    from warmstart.store.volume import StagedStore

    client = make_client(endpoint, "us-east-1", read_timeout_s=5.0)
    s3 = S3Store(
        client,
        parse_s3_url(f"s3://{config['bucket']}/warmstart"),
        KEY,
        spool_dir=Path(config["spool"]),
        range_size=range_size,
        lease_settle_s=0.2,
    )
    return [StagedStore(Path(config["volume_root"])), s3]


def _local_files(local: Path, skip: tuple[str, ...]) -> dict[str, Path]:
    """rel -> path of every file in a local cache, but those under a name in `skip` (another
    worker's files in a shared cache, a path this one turns into a directory)."""
    out = {}
    for path in local.rglob("*"):
        rel = path.relative_to(local).as_posix()
        if path.is_file() and not any(f"/{name}/" in f"/{rel}" for name in skip):
            out[rel] = path
    return out


def run_worker(config: dict[str, Any]) -> None:
    """One boot's work on the tiers (through the proxy), every step recorded in the journal."""
    from warmstart.store.bundlegc import collect_garbage
    from warmstart.store.deadline import Deadline, bounded, within
    from warmstart.store.tiers import publish_tiers, restore_tiers

    journal = Path(config["journal"])
    who = config["who"]
    rng = random.Random(config["seed"])
    local = Path(config["local"])
    tiers = _tiers(config, config["proxy"])
    if rng.random() < 0.3:
        tiers = tiers[1:]  # a worker in another datacenter: the S3 store only
    sharer = config.get("sharer")  # another worker of this round using the same local cache
    _journal(journal, {"event": "boot", "who": who, "tiers": [t.kind for t in tiers], "pid": os.getpid()})
    _journal_log_lines(journal, who)
    restored = restore_tiers(tiers, local, reader=who, ttl_s=READER_TTL_S, deadline_s=DEADLINE_S)
    seen = _local_files(local, (sharer,) if sharer else ())
    finished = finished_digests(journal)
    bad = [rel for rel, path in seen.items() if _sha(path) not in finished.get(rel, set())]
    result = restored.result
    source = result.source if restored.restored and result else None
    missing = [p for p in restored.problems if "is missing" in p]
    overdue = [p.split(":", 1)[0] for p in restored.problems if "WARMSTART_RESTORE_DEADLINE_S" in p]
    blamed = {kind: list(names) for kind, names in restored.bad_bundles.items() if names}
    _journal(
        journal,
        {
            "event": "restored",
            "who": who,
            "source": source,
            "unfinished": bad,
            "missing": missing,
            "overdue": overdue,
            "blamed": blamed,
            # What the restore says it put in the cache, and what the cache holds (the turning path aside).
            "reported": result.files if source and result else None,
            "held": len(seen) if source else None,
        },
    )

    def compile_one(rel: str, size: int, pause_s: float = 0.0, hold: threading.Event | None = None) -> None:
        data = os.urandom(size)
        path = local / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            step = max(1, size // 16)
            for start in range(0, size, step):
                handle.write(data[start : start + step])
                handle.flush()
                if pause_s:
                    time.sleep(pause_s)
            sha = hashlib.sha256(data).hexdigest()
            if hold is not None:  # every byte written, but the writer keeps it open across the publishes
                hold.wait(60)
            _journal(journal, {"event": "finished", "rel": rel, "sha": sha, "t": time.time(), "who": who})

    for n in range(rng.randint(1, 4)):
        compile_one(f"inductor/{who}/k{n}.so", rng.randint(*FILE_SIZES))
    if config.get("turn") and rng.random() < TURN_RATE:
        _turn(local, config["turn"], compile_one, journal, who)
    if rng.random() < ODD_NAME_RATE:  # a cache file whose name is not UTF-8: never published, never a crash
        odd = os.path.join(os.fsencode(local / "inductor" / who), b"odd-\xff.so")
        with open(odd, "wb") as handle:
            handle.write(os.urandom(100))
        _journal(journal, {"event": "fault", "kind": "non_utf8_name", "who": who})
    held_open = []
    if rng.random() < HOLD_RATE:  # a compiler holds a restored file open for writing (a compaction must keep it)
        restored_files = [p for r, p in sorted(seen.items()) if f"/{who}/" not in f"/{r}" and "/turning/" not in r]
        if restored_files:
            held_open.append(open(rng.choice(restored_files), "r+b"))  # held across the publishes
            _journal(journal, {"event": "fault", "kind": "held_open_restored", "who": who})
    late = threading.Thread(target=compile_one, args=(f"triton/{who}/late.cubin", LATE_SIZE, 0.02))
    late.start()  # still being written while the publish reads the cache
    release = threading.Event()
    kept = threading.Thread(target=compile_one, args=(f"triton/{who}/kept-open.cubin", 2048, 0.0, release))
    kept.start()  # written whole, then held open across the publishes
    _journal(journal, {"event": "fault", "kind": "held_open_written", "who": who})

    def publish_all() -> None:
        for tier in tiers:
            started = time.time()
            result = publish_tiers(
                [tier], local, publisher=who, lease_wait_s=2.0, lease_ttl_s=120.0, deadline_s=DEADLINE_S
            ).first
            assert result is not None
            record = {"event": "publish", "who": who, "tier": tier.kind, "status": result.status, "started": started}
            _journal(journal, {**record, "detail": result.detail[:200]})

    publish_all()
    late.join()
    release.set()
    kept.join()
    for handle in held_open:
        handle.close()
    publish_all()  # the exit publish: what was still being written is new now
    if rng.random() < 0.3:
        for tier in tiers:
            deadline = Deadline(DEADLINE_S, "gc")
            store = bounded(tier, deadline)
            try:
                within(deadline, lambda s=store: collect_garbage(s, ttl_s=GC_TTL_S).execute(s), "gc")
                if deadline.expired:
                    raise TimeoutError(deadline.reason)
                _journal(journal, {"event": "gc", "who": who, "tier": tier.kind})
            except Exception as exc:  # a fault of the store: what a worker logs and goes on from
                _journal(journal, {"event": "gc_failed", "who": who, "tier": tier.kind, "reason": str(exc)[:200]})


def _sha(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def _turn(local: Path, name: str, compile_one: Any, journal: Path, who: str) -> None:
    """A path of the union that was a file becomes a directory (a compiler's layout changed), or,
    where it is not there yet, the file is written."""
    rel = f"inductor/turning/{name}"
    path = local / rel
    if path.is_file():
        path.unlink()
        compile_one(f"{rel}/inner.so", 300)
        _journal(journal, {"event": "fault", "kind": "file_became_directory", "who": who, "rel": rel})
    elif not path.exists():
        compile_one(rel, 300)


def _journal_log_lines(journal: Path, who: str) -> None:
    """Record the restore's per-tier verdict lines: a tier that answers "no generation" while it
    holds one is a silent cold boot (an EIO listing read as an empty folder)."""
    import logging
    import re

    pattern = re.compile(r"no generation to restore in the (\w+) store|(\w+) store unavailable")

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            match = pattern.search(record.getMessage())
            if match:
                event = "tier_empty" if match.group(1) else "tier_unavailable"
                _journal(journal, {"event": event, "who": who, "tier": match.group(1) or match.group(2)})

    logging.getLogger("warmstart").addHandler(Recorder(logging.INFO))
    logging.getLogger("warmstart").setLevel(logging.INFO)


# --------------------------------------------------------------------------- the checks


@dataclass
class Verified:
    """What the checks read already, so that a round costs what it added, not the whole union:
    generations (immutable once created), and per bundle its identity where it is stored (volume:
    size, inode, mtime; S3: size, ETag), its size and SHA-256 in the index, and the digest of each
    member a generation took from it. A later generation that takes the same members from the same
    bundle, with the same SHA-256, while the object is still there unchanged, is checked against
    these digests; any other is read again, as a restore reads it."""

    generations: set[tuple[str, int]] = field(default_factory=set)
    bundles: dict[tuple[str, str], tuple[Any, int, str, dict[str, tuple[int, str]]]] = field(default_factory=dict)


def _identity(store: Any, name: str) -> Any:
    """The stored object as it is now (None when it is gone): any rewrite changes it."""
    from warmstart.store.bundle import StoreError

    try:
        if store.kind == "volume":
            st = (store.root / "bundles" / name).stat()
            return (st.st_size, st.st_ino, st.st_mtime_ns)
        head = store.call("head_object", Key=store._key(f"bundles/{name}"))
        return (int(head["ContentLength"]), head.get("ETag"))
    except (OSError, StoreError):
        return None


def _member_digests(store: Any, gen: Any, scratch: Path, verified: Verified) -> dict[str, str]:
    """rel -> SHA-256 of every file `gen` lists, each bundle read as a restore reads it (checksum,
    sizes, every listed member present) unless verified before. Raises StoreError/OSError."""
    from warmstart.store.extract import extract_bundle

    digests: dict[str, str] = {}
    for ref in gen.bundles:
        wanted = {p: f for p, f in gen.files.items() if f.bundle == ref.name}
        known, size, sha, members = verified.bundles.get((store.kind, ref.name), (None, -1, "", {}))
        identity = _identity(store, ref.name)
        if known is None or identity != known or (size, sha) != (ref.size, ref.sha256):
            members = {}
        elif all(p in members and members[p][0] == f.size for p, f in wanted.items()):
            digests.update({p: members[p][1] for p in wanted})
            continue
        dest = scratch / f"{store.kind}-{gen.number}-{ref.name}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        try:
            extract_bundle(store.bundle_chunks(ref), ref, gen, dest)
            got = {p: (f.size, hashlib.sha256((dest / p).read_bytes()).hexdigest()) for p, f in wanted.items()}
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        if identity is not None and _identity(store, ref.name) == identity:  # unchanged while it was read
            verified.bundles[(store.kind, ref.name)] = (identity, ref.size, ref.sha256, {**members, **got})
        digests.update({p: d for p, (_, d) in got.items()})
    return digests


def check_tier(
    store: Any,
    finished: dict[str, set[str]],
    scratch: Path,
    verified: Verified | None = None,
    dropped: frozenset[int] = frozenset(),
) -> tuple[list[str], Any]:
    """Every generation of one tier restores and holds only finished bytes; (violations, newest).
    `verified`: what earlier rounds read (skipped where unchanged, and added to); `dropped`: the
    malformed generations the bench itself put there (skipped, as a restore skips them)."""
    from warmstart.store.bundle import StoreError

    verified = verified if verified is not None else Verified()
    violations = []
    newest = None
    numbers = [n for n in store.generation_numbers() if n not in dropped]
    for number in numbers:
        if (store.kind, number) in verified.generations and number != numbers[-1]:
            continue  # immutable and verified already: only the newest is read again (for the union)
        try:
            gen = store.load(number)
        except FileNotFoundError:
            continue  # collected meanwhile
        except StoreError as exc:
            violations.append(f"{store.kind} generation {number} unreadable: {exc}")
            continue
        newest = gen
        if (store.kind, number) in verified.generations:
            continue
        try:
            digests = _member_digests(store, gen, scratch, verified)
        except (StoreError, OSError) as exc:
            if store.exists(f"generations/g{number:08d}.json"):
                violations.append(f"{store.kind} generation {number} does not verify: {exc}")
            continue
        for rel in gen.files:
            if rel not in digests:
                violations.append(f"{store.kind} generation {number}: {rel} is in none of its bundles")
            elif digests[rel] not in finished.get(rel, set()):
                violations.append(f"{store.kind} generation {number}: {rel} holds bytes no writer finished")
        verified.generations.add((store.kind, number))
    return violations, newest


@dataclass
class SoakState:
    """What the checks carry from one round to the next: each tier's newest paths (the union never
    forgets), which tiers held a generation (a tier that did never answers "none"), and the
    malformed generations the bench dropped into each tier."""

    paths: dict[str, dict[str, str]] = field(default_factory=dict)  # tier -> newest's path -> its bundle
    held: set[str] = field(default_factory=set)
    dropped: dict[str, set[int]] = field(default_factory=dict)


def _became_directory(rel: str, files: Any) -> bool:
    prefix = rel + "/"
    return any(p.startswith(prefix) for p in files)


def _parent_conflicts(files: Any) -> list[str]:
    """Paths that are also the parent directory of another path: such a generation cannot restore."""
    paths = set(files)
    return sorted({parent for p in paths for parent in _parents(p) if parent in paths})


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def check_round(
    tiers: list[Any],
    journal: Path,
    scratch: Path,
    verified: Verified | None = None,
    state: SoakState | None = None,
    round_no: int | None = None,
) -> list[str]:
    """The invariants after a round (the module's docstring). `state` carries what the next round's
    checks compare with; `round_no` picks the round's own records for the per-round checks."""
    records = _records(journal)
    finished = finished_digests(journal)
    state = state if state is not None else SoakState()
    violations = []
    newest = {}
    # A writer killed mid-file in a shared cache leaves its partial bytes at the final name, where the
    # other worker's publish takes them: these writers write in place, real compilers rename into place.
    killed_sharers = [f"/{r['who']}/" for r in records if r.get("event") == "killed" and r.get("shared")]
    for tier in tiers:
        dropped = frozenset(state.dropped.get(tier.kind, ()))
        found, newest[tier.kind] = check_tier(tier, finished, scratch, verified, dropped)
        violations += [v for v in found if "no writer finished" not in v or not any(k in v for k in killed_sharers)]
    this_round = [r for r in records if round_no is None or str(r.get("who", "")).startswith(f"r{round_no}w")]
    blamed: dict[str, set[str]] = {}
    for record in records:
        if record.get("event") == "restored":
            violations += [
                f"{record['who']} restored unfinished bytes of {rel}"
                for rel in record["unfinished"]
                if not any(k in f"/{rel}" for k in killed_sharers)
            ]
            violations += [f"{record['who']}: a live bundle was deleted: {p}" for p in record["missing"]]
            for kind, names in (record.get("blamed") or {}).items():
                blamed.setdefault(kind, set()).update(names)
    for record in this_round:
        if record.get("event") == "restored" and record.get("reported") != record.get("held"):
            violations.append(
                f"{record['who']}: its restore reported {record['reported']} files, the cache held {record['held']}"
            )
        if record.get("event") == "tier_empty" and record["tier"] in state.held:
            violations.append(f"{record['who']}: the {record['tier']} store held a generation, it answered none")
        if record.get("event") == "publish" and any(
            s in record.get("detail", "") for s in ("could not claim", "appeared and vanished")
        ):
            violations.append(f"{record['who']}: {record['tier']} numbering stuck: {record['detail']}")
    done_at: dict[str, list[tuple[str, float]]] = {}
    for record in records:
        if record.get("event") == "finished":
            done_at.setdefault(record["who"], []).append((record["rel"], record["t"]))
    for record in records:
        if record.get("event") == "publish" and record["status"] in ("published", "nothing_new"):
            gen = newest.get(record["tier"])
            files = gen.files if gen is not None else {}
            for rel, t in done_at.get(record["who"], []):
                if t < record["started"] and rel not in files and not _became_directory(rel, files):
                    violations.append(f"{record['tier']}: {rel} finished before a publish yet not in the union")
    for kind, gen in newest.items():
        if gen is None:
            continue
        violations += [
            f"{kind} generation {gen.number}: {p} is a file and a directory" for p in _parent_conflicts(gen.files)
        ]
        before = state.paths.get(kind, {})
        lost = [
            p
            for p in sorted(set(before) - set(gen.files))
            # a restore that found a bundle corrupt has the next publish leave its files out
            if not _became_directory(p, gen.files) and before[p] not in blamed.get(kind, set())
        ]
        violations += [f"{kind} generation {gen.number} forgot {p}" for p in lost]
        state.paths[kind] = {p: f.bundle for p, f in gen.files.items()}
        state.held.add(kind)
    return violations


# --------------------------------------------------------------------------- the soak


def volume_rules(rate: float) -> list[Any]:
    """The volume's faults (`faultfs`): listings and opens fail with EIO, renames and links (how a
    bundle and a generation are made visible) with EIO, writes and creates with ENOSPC."""
    from .faultfs import FaultRule

    return [
        FaultRule("readdir", "EIO", rate),
        FaultRule("open", "EIO", rate / 4),
        FaultRule("rename", "EIO", rate / 2),
        FaultRule("link", "EIO", rate / 2),
        FaultRule("write", "ENOSPC", rate / 4),
        FaultRule("create", "ENOSPC", rate / 4),
    ]


def _volume(workdir: Path, fault_rate: float, seed: int) -> Any:
    """The faulty FUSE volume over `workdir/volume-source`, or the folder itself (and why) where no
    FUSE mount can be made (not root, no /dev/fuse)."""
    from .slowfs import faulty_mounted

    source = workdir / "volume-source"
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        source.mkdir(parents=True, exist_ok=True)
        return contextlib.nullcontext((source, None))
    return faulty_mounted(source, workdir / "volume", rules=volume_rules(fault_rate), seed=seed)


def drop_malformed(tiers: list[Any], state: SoakState, rng: random.Random) -> list[str]:
    """Put into each tier (directly) a malformed generation above its newest and foreign objects: what
    another tool sharing the prefix, a future format or a hand edit leaves. Returns what was dropped."""
    shapes = [b"[]", b'{"files": [], "bundles": []}', b'{"generation": 1, "files": "x", "bundles": {}}', b"\x00\xff"]
    dropped = []
    for tier in tiers:
        numbers = tier.generation_numbers()
        number = (max(numbers) if numbers else 0) + 1
        data = rng.choice(shapes)
        objects = {
            f"generations/g{number:08d}.json": data,
            "generations/README.txt": b"not a generation",
            "bundles/foreign.bin": os.urandom(64),
            "readers/foreign.json": b"{not json",
        }
        for rel, body in objects.items():
            if tier.kind == "volume":
                path = tier.root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
            else:
                tier.call("put_object", Key=tier._key(rel), Body=body)
        state.dropped.setdefault(tier.kind, set()).add(number)
        dropped.append(f"{tier.kind}:g{number}")
    return dropped


def bench_chaos(
    workdir: Path,
    *,
    rounds: int = 200,
    workers: int = 3,
    fault_rate: float = 0.05,
    kill_rate: float = 0.5,
    seed: int = 0,
) -> dict[str, Any]:
    # Everything a worker runs, imported before the first fork: the forked workers of a long run
    # run the code it started with, whatever is edited on disk meanwhile.
    import warmstart.store.bundlegc
    import warmstart.store.deadline
    import warmstart.store.tiers  # noqa: F401
    from warmstart.store.s3client import make_client

    from .s3server import moto_server
    from .throttle import throttled

    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    rng = random.Random(seed)
    journal = workdir / "journal.jsonl"
    stats = workdir / "faults.json"
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "warmstart-chaos")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "warmstart-chaos-secret")
    start = time.monotonic()
    kills = 0
    all_violations: list[str] = []
    machine: dict[str, Any] = {"load": [], "check_s": 0.0, "union": {}}
    bench_faults: Counter[str] = Counter()
    pidns = os.geteuid() == 0  # pid namespaces need root (CLONE_NEWPID)
    with moto_server() as endpoint, _volume(workdir, fault_rate, seed) as (volume, volume_faults):
        bucket = "chaos"
        make_client(endpoint, "us-east-1").create_bucket(Bucket=bucket)
        faulty = throttled(endpoint, fault=FAULTS, rate=fault_rate, cut_bytes=32 * 1024, seed=seed, stats=str(stats))
        with faulty as proxy:
            staged = Path("warmstart") / "keys" / KEY / "staged"
            base = {
                "bucket": bucket,
                "volume_root": str(volume / staged),
                "spool": str(workdir / "spool"),
                "journal": str(journal),
                "proxy": proxy,
            }
            (volume / staged).parent.mkdir(parents=True)  # the key's directory, as a boot makes it
            Path(base["spool"]).mkdir(parents=True)
            # The checks' own reads: the folder under the fault layer, S3 without the proxy, few requests.
            direct = _tiers({**base, "volume_root": str(workdir / "volume-source" / staged)}, endpoint, 8 * 1024 * 1024)
            verified = Verified()  # what earlier rounds read: generations and bundles are immutable
            state = SoakState()
            forking = multiprocessing.get_context("fork")
            for round_no in range(rounds):
                if round_no and rng.random() < MALFORMED_RATE:
                    for _ in drop_malformed(direct, state, rng):  # one of each per tier
                        bench_faults["malformed_generation"] += 1
                        bench_faults["foreign_objects"] += 3
                shared = workers >= 2 and rng.random() < SHARE_RATE
                procs = []
                for w in range(workers):
                    who = f"r{round_no}w{w}"
                    config = {**base, "who": who, "seed": rng.randrange(1 << 30), "local": str(workdir / "local" / who)}
                    # One worker a round turns a path (never two at once, never in a shared cache).
                    config["turn"] = f"t{round_no // 3}" if w == 0 and not shared else None
                    if shared and w < 2:  # one local cache, two workers; each pid 1 of its own namespace
                        config["local"] = str(workdir / "local" / f"r{round_no}-shared" / "cache")
                        config["sharer"] = f"r{round_no}w{1 - w}"
                        config["pidns"] = pidns
                        bench_faults["shared_local_cache"] += 1
                        bench_faults["pid_namespace"] += int(pidns)
                    # Forked from this process (everything imported already): a round costs the work,
                    # not interpreter start-ups. Each is a process of its own, killed for real.
                    proc = forking.Process(target=_worker_quietly, args=(config,), daemon=True)
                    proc.start()
                    procs.append(proc)
                victim = None
                if rng.random() < kill_rate:
                    time.sleep(rng.uniform(0.0, 2.0))
                    victim = rng.choice(procs)
                    if victim.is_alive():
                        os.kill(victim.pid, signal.SIGKILL)
                        kills += 1
                        who = f"r{round_no}w{procs.index(victim)}"
                        _journal(journal, {"event": "killed", "who": who, "shared": shared and procs.index(victim) < 2})
                for w, proc in enumerate(procs):
                    proc.join(timeout=HANG_S)
                    if proc.is_alive():
                        proc.kill()
                        proc.join()
                        all_violations.append(f"round {round_no}: a worker hung past {HANG_S:g} s")
                    elif proc is not victim and proc.exitcode != 0:
                        all_violations.append(f"round {round_no}: worker r{round_no}w{w} exited with {proc.exitcode}")
                shutil.rmtree(workdir / "local", ignore_errors=True)
                checked = time.monotonic()
                found = check_round(direct, journal, workdir / "scratch", verified, state, round_no)
                all_violations += [f"round {round_no}: {v}" for v in found]
                machine["check_s"] += time.monotonic() - checked
                machine["load"].append(os.getloadavg()[0])
                machine["union"] = _union(direct)
                progress = _summary(
                    journal, stats, round_no + 1, workers, kills, fault_rate, all_violations, time.monotonic() - start
                )
                progress["machine"] = _machine(machine)
                progress["faults_injected"] = _faults(progress, volume_faults, bench_faults, journal)
                (workdir / "progress.tmp").write_text(json.dumps(progress))
                (workdir / "progress.tmp").replace(workdir / "progress.json")  # the figures so far, every round
            volume_injected = volume_faults.injected() if volume_faults is not None else None
    result = _summary(journal, stats, rounds, workers, kills, fault_rate, all_violations, time.monotonic() - start)
    result["machine"] = _machine(machine)
    result["faults_injected"] = _faults(result, volume_faults, bench_faults, journal, volume_injected)
    if volume_faults is None:
        result["volume_faults"] = "off: no FUSE here (needs root, /dev/fuse and fusermount3)"
    return result


def _faults(
    summary: dict[str, Any], volume: Any, bench: Counter[str], journal: Path, injected: dict[str, int] | None = None
) -> dict[str, Any]:
    """Every fault injected, by where: the S3 proxy's, the volume's (`faultfs`), the bench's own
    (malformed objects, shared caches, pid namespaces) and the workers' (odd names, held files...)."""
    workers = Counter(r["kind"] for r in _records(journal) if r.get("event") == "fault")
    volume_counts = injected if injected is not None else (volume.injected() if volume is not None else {})
    return {
        "s3": summary["faults_injected"]
        if "s3" not in summary["faults_injected"]
        else summary["faults_injected"]["s3"],
        "volume": dict(sorted(volume_counts.items())),
        "bench": dict(sorted(bench.items())),
        "workers": dict(sorted(workers.items())),
    }


def _union(tiers: list[Any]) -> dict[str, dict[str, int]]:
    """Each tier's newest generation: files and bytes (what a restore reads)."""
    out = {}
    for tier in tiers:
        try:
            gen, _ = tier.latest()
        except Exception:  # a figure, never a failure of the bench
            continue
        if gen is not None:
            out[tier.kind] = {"files": len(gen.files), "bytes": gen.bytes}
    return out


def _machine(machine: dict[str, Any]) -> dict[str, Any]:
    loads = machine["load"] or [0.0]
    return {
        "cores": os.cpu_count(),
        "load_1min_mean": round(sum(loads) / len(loads), 1),
        "load_1min_max": round(max(loads), 1),
        "check_seconds": round(machine["check_s"], 1),
        "union_at_end": machine["union"],
    }


def _summary(
    journal: Path,
    stats: Path,
    rounds: int,
    workers: int,
    kills: int,
    fault_rate: float,
    violations: list[str],
    seconds: float,
) -> dict[str, Any]:
    records = _records(journal)
    events = Counter(r.get("event") for r in records)
    publishes = Counter(f"{r['tier']}:{r['status']}" for r in records if r.get("event") == "publish")
    restores = Counter(str(r.get("source")) for r in records if r.get("event") == "restored")
    overdue = Counter(t for r in records if r.get("event") == "restored" for t in r.get("overdue", []))
    abandoned = Counter(
        r["tier"] for r in records if r.get("event") == "publish" and "WARMSTART_PUBLISH_DEADLINE_S" in r["detail"]
    )
    try:
        faults = json.loads(stats.read_text())
    except (OSError, ValueError):
        faults = {"requests": 0, "injected": {}}
    unique = sorted(set(violations))
    by_invariant = Counter(_invariant(v) for v in unique)
    return {
        "benchmark": "chaos",
        "rounds": rounds,
        "workers_per_round": workers,
        "kills": kills,
        "faults_injected": faults.get("injected", {}),
        "faulted_share_of_requests": fault_rate,
        "boots": events["boot"],
        "restores_by_source": dict(restores),
        "restores_past_deadline": dict(overdue),
        "publishes": dict(publishes),
        "publishes_past_deadline": dict(abandoned),
        "gcs": events["gc"],
        "gc_failures": events["gc_failed"],
        "violations": len(unique),
        "violations_by_invariant": dict(sorted(by_invariant.items())),
        "violation_examples": unique[:10],
        "seconds": round(seconds, 1),
    }


INVARIANTS = {
    "does not verify": "generations_verify",
    "in none of its bundles": "generations_verify",
    "unreadable": "generations_load",
    "bytes no writer finished": "finished_bytes_only",
    "restored unfinished bytes": "finished_bytes_only",
    "yet not in the union": "union_holds_every_published_file",
    "forgot": "union_never_forgets",
    "is a file and a directory": "union_restores",
    "live bundle was deleted": "nothing_live_deleted",
    "exited with": "no_worker_exits",
    "hung past": "no_worker_hangs",
    "its restore reported": "restore_reports_the_cache",
    "it answered none": "no_silent_cold_boot",
    "numbering stuck": "numbering_never_sticks",
}


def _invariant(violation: str) -> str:
    return next((name for text, name in INVARIANTS.items() if text in violation), "other")


def _worker_quietly(config: dict[str, Any]) -> None:
    """A forked worker: its log lines (warnings under faults are expected) go nowhere."""
    import logging

    logging.getLogger().handlers[:] = [logging.NullHandler()]
    logging.getLogger("warmstart").handlers[:] = [logging.NullHandler()]
    logging.getLogger("warmstart").propagate = False
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    if config.get("pidns"):
        _in_own_pid_namespace(config)
    run_worker(config)


def _in_own_pid_namespace(config: dict[str, Any]) -> None:
    """Run the worker as pid 1 of a new pid namespace, as a container's first process is: this
    process unshares and forks; the child (pid 1 there) runs the worker and dies with this one
    (PR_SET_PDEATHSIG), so the bench's SIGKILL still ends it; this one exits with its status."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.unshare(0x20000000) != 0:  # CLONE_NEWPID
        return  # not permitted here: the worker runs in this namespace
    child = os.fork()
    if child == 0:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        try:
            run_worker(config)
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    os._exit(os.waitstatus_to_exitcode(status))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        run_worker(json.loads(sys.argv[2]))
        return
    raise SystemExit("usage: warmstart-dev bench chaos (this module's --worker is the bench's own)")


if __name__ == "__main__":
    main()
