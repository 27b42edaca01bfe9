"""`bench chaos`: a soak of the staged tiers under faults, stopping by itself after `rounds` rounds.

Each round starts `workers` worker processes on one volume folder and one S3 store (moto on
loopback) reached through the fault proxy (`throttle`: 503 SlowDown, bodies cut mid-read,
refused connections, on a random share of requests); some workers have no volume (another
datacenter: the S3 store only). A worker does what a staged boot does to
its tiers, with the scripted engine's part played by a writer: restore from the nearest tier,
"compile" new cache files (one of them written slowly by a thread while the publish runs, as
lazy JIT does), publish to each tier, and now and then collect garbage. The bench SIGKILLs a
random worker at a random moment in some rounds. After every round it checks, talking to the
stores directly (not through the proxy):

- every generation verifies: each bundle restores, with its checksum;
- no bytes that no writer finished writing: every file of every generation, and every file a
  worker restored, holds bytes some writer recorded as finished (recorded after its last byte);
- the union: every file a worker finished before a publish that returned (published or nothing
  new) is in that tier's newest generation (gc here removes old generations only, never a key);
- nothing live deleted: no restore found a bundle missing (a reader's registration protects it).

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
from pathlib import Path
from typing import Any

FAULTS = "slowdown,cut,refuse"
KEY = "chaos-key"
GC_TTL_S = 30.0  # bundles younger than this are never collected (a publish may be about to index them)
READER_TTL_S = 60.0  # a killed worker's reader registration protects its generation this long


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


def _tiers(config: dict[str, Any], endpoint: str) -> list[Any]:
    from warmstart.s3url import parse_s3_url
    from warmstart.store.folder import StagedStore
    from warmstart.store.s3 import S3Store
    from warmstart.store.s3client import make_client

    client = make_client(endpoint, "us-east-1", read_timeout_s=5.0)
    s3 = S3Store(
        client,
        parse_s3_url(f"s3://{config['bucket']}/warmstart"),
        KEY,
        spool_dir=Path(config["spool"]),
        range_size=256 * 1024,
        lease_settle_s=0.2,
    )
    return [StagedStore(Path(config["volume_root"])), s3]


def run_worker(config: dict[str, Any]) -> None:
    """One boot's work on the tiers (through the proxy), every step recorded in the journal."""
    from warmstart.store.garbage import collect_garbage
    from warmstart.store.tiers import publish_tiers, restore_tiers

    journal = Path(config["journal"])
    who = config["who"]
    rng = random.Random(config["seed"])
    local = Path(config["local"])
    tiers = _tiers(config, config["proxy"])
    if rng.random() < 0.3:
        tiers = tiers[1:]  # a worker in another datacenter: the S3 store only
    _journal(journal, {"event": "boot", "who": who, "tiers": [t.kind for t in tiers]})
    restored = restore_tiers(tiers, local, reader=who, ttl_s=READER_TTL_S)
    finished = finished_digests(journal)
    bad = []
    for path in local.rglob("*"):
        if path.is_file():
            rel = path.relative_to(local).as_posix()
            if hashlib.sha256(path.read_bytes()).hexdigest() not in finished.get(rel, set()):
                bad.append(rel)
    source = restored.result.source if restored.restored and restored.result else None
    missing = [p for p in restored.problems if "is missing" in p]
    _journal(journal, {"event": "restored", "who": who, "source": source, "unfinished": bad, "missing": missing})

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
        compile_one(f"inductor/{who}/k{n}.so", rng.randint(200, 300_000))
    late = threading.Thread(target=compile_one, args=(f"triton/{who}/late.cubin", 400_000, 0.02))
    late.start()  # still being written while the publish reads the cache
    for tier in tiers:
        started = time.time()
        result = publish_tiers([tier], local, publisher=who, lease_wait_s=2.0, lease_ttl_s=120.0).first
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
            try:
                collect_garbage(tier, ttl_s=GC_TTL_S).execute(tier)
                _journal(journal, {"event": "gc", "who": who, "tier": tier.kind})
            except Exception as exc:  # a fault of the store: what a worker logs and goes on from
                _journal(journal, {"event": "gc_failed", "who": who, "tier": tier.kind, "reason": str(exc)[:200]})


# --------------------------------------------------------------------------- the checks


def check_tier(
    store: Any, finished: dict[str, set[str]], scratch: Path, verified: set[tuple[str, int]] | None = None
) -> tuple[list[str], Any]:
    """Every generation of one tier restores and holds only finished bytes; (violations, newest).
    `verified`: generations already verified (skipped, and added to)."""
    from warmstart.store.bundle import StoreError
    from warmstart.store.extract import extract_bundle

    violations = []
    newest = None
    numbers = store.generation_numbers()
    for number in numbers:
        if verified is not None and (store.kind, number) in verified and number != numbers[-1]:
            continue  # immutable and verified already: only the newest is read again (for the union)
        try:
            gen = store.load(number)
        except FileNotFoundError:
            continue  # collected meanwhile
        except StoreError as exc:
            violations.append(f"{store.kind} generation {number} unreadable: {exc}")
            continue
        newest = gen
        if verified is not None and (store.kind, number) in verified:
            continue
        dest = scratch / f"{store.kind}-{number}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        try:
            for ref in gen.bundles:
                extract_bundle(store.bundle_chunks(ref), ref, gen, dest)
        except (StoreError, OSError) as exc:
            if store.exists(f"generations/g{number:08d}.json"):
                violations.append(f"{store.kind} generation {number} does not verify: {exc}")
            continue
        for rel in gen.files:
            sha = hashlib.sha256((dest / rel).read_bytes()).hexdigest()
            if sha not in finished.get(rel, set()):
                violations.append(f"{store.kind} generation {number}: {rel} holds bytes no writer finished")
        shutil.rmtree(dest, ignore_errors=True)
        if verified is not None:
            verified.add((store.kind, number))
    return violations, newest


def check_round(
    tiers: list[Any], journal: Path, scratch: Path, verified: set[tuple[str, int]] | None = None
) -> list[str]:
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
            direct = _tiers(base, endpoint)
            verified: set[tuple[str, int]] = set()  # generations are immutable: each is verified once
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
                    proc.join(timeout=120)
                    if proc.is_alive():
                        proc.kill()
                        proc.join()
                        all_violations.append(f"round {round_no}: a worker hung past 120 s")
                for w in range(workers):
                    shutil.rmtree(workdir / "local" / f"r{round_no}w{w}", ignore_errors=True)
                found = check_round(direct, journal, workdir / "scratch", verified)
                all_violations += [f"round {round_no}: {v}" for v in found]
                progress = _summary(
                    journal, stats, round_no + 1, workers, kills, fault_rate, all_violations, time.monotonic() - start
                )
                (workdir / "progress.tmp").write_text(json.dumps(progress))
                (workdir / "progress.tmp").replace(workdir / "progress.json")  # the figures so far, every round
    return _summary(journal, stats, rounds, workers, kills, fault_rate, all_violations, time.monotonic() - start)


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
        "publishes": dict(publishes),
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
