"""`bench chaos`: a soak of the staged tiers under faults, stopping by itself after `rounds` rounds.

Each round starts `workers` worker processes on one volume folder and one S3 store (moto on
loopback) reached through the fault proxy (`throttle`: 503 SlowDown, bodies cut mid-read,
refused connections, on a random share of requests); some workers have no volume (another
datacenter: the S3 store only). A worker does what a staged boot does to
its tiers, with the scripted engine's part played by a writer: restore from the nearest tier,
"compile" new cache files (one of them written slowly by a thread while the publish runs, as
lazy JIT does), publish to each tier, and now and then collect garbage, each tier's restore,
publish and collection under a deadline as a boot's are (store/deadline.py). The bench SIGKILLs a
random worker at a random moment in some rounds. After every round it checks, talking to the
stores directly (not through the proxy):

- every generation verifies: each bundle restores, with its checksum;
- no bytes that no writer finished writing: every file of every generation, and every file a
  worker restored, holds bytes some writer recorded as finished (recorded after its last byte);
- the union: every file a worker finished before a publish that returned (published or nothing
  new) is in that tier's newest generation (gc here removes old generations only, never a key);
- nothing live deleted: no restore found a bundle missing (a reader's registration protects it).

A round costs what it added, not the whole union: each bundle is read (restored, checksum and
all) once, and a later generation that takes the same members from it is checked against their
recorded digests while the stored object is unchanged (`Verified`). The union every worker
restores grows by about 0.1 MB a round (files of 200 B to 40 kB; 300 kB before).

    warmstart-dev bench chaos --json [--rounds 200] [--workers 3] [--fault-rate 0.05]
"""

from __future__ import annotations

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

FAULTS = "slowdown,cut,refuse"
KEY = "chaos-key"
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
    _journal(journal, {"event": "boot", "who": who, "tiers": [t.kind for t in tiers]})
    restored = restore_tiers(tiers, local, reader=who, ttl_s=READER_TTL_S, deadline_s=DEADLINE_S)
    finished = finished_digests(journal)
    bad = []
    for path in local.rglob("*"):
        if path.is_file():
            rel = path.relative_to(local).as_posix()
            if hashlib.sha256(path.read_bytes()).hexdigest() not in finished.get(rel, set()):
                bad.append(rel)
    source = restored.result.source if restored.restored and restored.result else None
    missing = [p for p in restored.problems if "is missing" in p]
    overdue = [p.split(":", 1)[0] for p in restored.problems if "WARMSTART_RESTORE_DEADLINE_S" in p]
    _journal(
        journal,
        {"event": "restored", "who": who, "source": source, "unfinished": bad, "missing": missing, "overdue": overdue},
    )

    def compile_one(rel: str, size: int, pause_s: float = 0.0) -> None:
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
            _journal(journal, {"event": "finished", "rel": rel, "sha": sha, "t": time.time(), "who": who})

    for n in range(rng.randint(1, 4)):
        compile_one(f"inductor/{who}/k{n}.so", rng.randint(*FILE_SIZES))
    late = threading.Thread(target=compile_one, args=(f"triton/{who}/late.cubin", LATE_SIZE, 0.02))
    late.start()  # still being written while the publish reads the cache
    for tier in tiers:
        started = time.time()
        result = publish_tiers(
            [tier], local, publisher=who, lease_wait_s=2.0, lease_ttl_s=120.0, deadline_s=DEADLINE_S
        ).first
        assert result is not None
        _journal(
            journal,
            {
                "event": "publish",
                "who": who,
                "tier": tier.kind,
                "status": result.status,
                "started": started,
                "detail": result.detail[:200],
            },
        )
    late.join()
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
    store: Any, finished: dict[str, set[str]], scratch: Path, verified: Verified | None = None
) -> tuple[list[str], Any]:
    """Every generation of one tier restores and holds only finished bytes; (violations, newest).
    `verified`: what earlier rounds read (skipped where unchanged, and added to)."""
    from warmstart.store.bundle import StoreError

    verified = verified if verified is not None else Verified()
    violations = []
    newest = None
    numbers = store.generation_numbers()
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


def check_round(tiers: list[Any], journal: Path, scratch: Path, verified: Verified | None = None) -> list[str]:
    records = _records(journal)
    finished = finished_digests(journal)
    violations = []
    newest = {}
    for tier in tiers:
        found, newest[tier.kind] = check_tier(tier, finished, scratch, verified)
        violations += found
    for record in records:
        if record.get("event") == "restored":
            violations += [f"{record['who']} restored unfinished bytes of {rel}" for rel in record["unfinished"]]
            violations += [f"{record['who']}: a live bundle was deleted: {p}" for p in record["missing"]]
    done_at: dict[str, list[tuple[str, float]]] = {}
    for record in records:
        if record.get("event") == "finished":
            done_at.setdefault(record["who"], []).append((record["rel"], record["t"]))
    for record in records:
        if record.get("event") == "publish" and record["status"] in ("published", "nothing_new"):
            gen = newest.get(record["tier"])
            files = gen.files if gen is not None else {}
            for rel, t in done_at.get(record["who"], []):
                if t < record["started"] and rel not in files:
                    violations.append(f"{record['tier']}: {rel} finished before a publish yet not in the union")
    return violations


# --------------------------------------------------------------------------- the soak


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
    with moto_server() as endpoint:
        bucket = "chaos"
        make_client(endpoint, "us-east-1").create_bucket(Bucket=bucket)
        faulty = throttled(endpoint, fault=FAULTS, rate=fault_rate, cut_bytes=32 * 1024, seed=seed, stats=str(stats))
        with faulty as proxy:
            base = {
                "bucket": bucket,
                "volume_root": str(workdir / "volume" / "warmstart" / "keys" / KEY / "staged"),
                "spool": str(workdir / "spool"),
                "journal": str(journal),
                "proxy": proxy,
            }
            Path(base["volume_root"]).parent.mkdir(parents=True)  # the key's directory, as a boot makes it
            Path(base["spool"]).mkdir(parents=True)
            direct = _tiers(base, endpoint, range_size=8 * 1024 * 1024)  # the checks' own reads: few requests
            verified = Verified()  # what earlier rounds read: generations and bundles are immutable
            forking = multiprocessing.get_context("fork")
            for round_no in range(rounds):
                procs = []
                for w in range(workers):
                    who = f"r{round_no}w{w}"
                    config = {**base, "who": who, "seed": rng.randrange(1 << 30), "local": str(workdir / "local" / who)}
                    # Forked from this process (everything imported already): a round costs the work,
                    # not interpreter start-ups. Each is a process of its own, killed for real.
                    proc = forking.Process(target=_worker_quietly, args=(config,), daemon=True)
                    proc.start()
                    procs.append(proc)
                if rng.random() < kill_rate:
                    time.sleep(rng.uniform(0.0, 2.0))
                    victim = rng.choice(procs)
                    if victim.is_alive():
                        os.kill(victim.pid, signal.SIGKILL)
                        kills += 1
                for proc in procs:
                    proc.join(timeout=HANG_S)
                    if proc.is_alive():
                        proc.kill()
                        proc.join()
                        all_violations.append(f"round {round_no}: a worker hung past {HANG_S:g} s")
                for w in range(workers):
                    shutil.rmtree(workdir / "local" / f"r{round_no}w{w}", ignore_errors=True)
                checked = time.monotonic()
                found = check_round(direct, journal, workdir / "scratch", verified)
                all_violations += [f"round {round_no}: {v}" for v in found]
                machine["check_s"] += time.monotonic() - checked
                machine["load"].append(os.getloadavg()[0])
                machine["union"] = _union(direct)
                progress = _summary(
                    journal, stats, round_no + 1, workers, kills, fault_rate, all_violations, time.monotonic() - start
                )
                progress["machine"] = _machine(machine)
                (workdir / "progress.tmp").write_text(json.dumps(progress))
                (workdir / "progress.tmp").replace(workdir / "progress.json")  # the figures so far, every round
    result = _summary(journal, stats, rounds, workers, kills, fault_rate, all_violations, time.monotonic() - start)
    result["machine"] = _machine(machine)
    return result


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
        "violation_examples": unique[:10],
        "seconds": round(seconds, 1),
    }


def _worker_quietly(config: dict[str, Any]) -> None:
    """A forked worker: its log lines (warnings under faults are expected) go nowhere."""
    import logging

    logging.getLogger().handlers[:] = [logging.NullHandler()]
    logging.getLogger("warmstart").handlers[:] = [logging.NullHandler()]
    logging.getLogger("warmstart").propagate = False
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    run_worker(config)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        run_worker(json.loads(sys.argv[2]))
        return
    raise SystemExit("usage: warmstart-dev bench chaos (this module's --worker is the bench's own)")


if __name__ == "__main__":
    main()
