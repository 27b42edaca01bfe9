"""Staged caches: restore a key's published generation onto local disk; publish new ones back.

Writing compilers' thousands of small files straight onto a network volume is slow to
read (a round trip per open and stat) and unsafe when several workers boot cold at once.
In staged mode a store holds, per key, immutable *bundles* (tar files) and *generations*
(JSON indexes naming the bundles and every file in them); the format is `store.bundle`.
On the volume (`store.folder`):

    <key_dir>/staged/
        bundles/<sha256 prefix>-<id>.tar    written as .tmp-*, verified, then renamed
        generations/g00000007.json          a generation; exists only once complete
        readers/<reader>.json               a restore in progress (protects its bundles)
        publish.lease                       who may publish now, until when

An S3 prefix holds the same names (`store.s3`); the algorithms here are written once
against `store.backend.BundleStore` and run on both.

A boot restores the newest complete generation in a few large sequential reads, checking
each bundle's SHA-256 while it streams, into a fresh local directory that then replaces
the key's local cache. A corrupt or truncated bundle is reported and the next older
generation tried. After vLLM serves, the worker that holds the lease publishes a bundle of
the files the current generation lacks and a generation that lists the old bundles plus
the new one (the union); others wait for the lease and then publish only what is still
missing, usually nothing. Generations are created without overwriting (`os.link` on the
volume, a conditional or verified PUT on S3), so even two publishers that both believe they
hold the lease cannot clobber each other. Old generations and unreferenced bundles are
removed only when no registered reader can still be restoring them, generation first,
bundles after, so the store is consistent after every step.

Like huggingface_hub's cache manager, each operation is a scan, then a plan, then an
`execute()`: a dry run is free.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..limits import LEASE_TTL_S
from ..tree import scan_tree
from .backend import (
    BUNDLES,
    GENERATIONS,
    READERS,
    BundleStore,
    step,
)
from .bundle import (
    BundleRef,
    FileEntry,
    Generation,
    StoreError,
    StoreUnavailable,
    extract_bundle,
    gen_name,
    layer_of,
    now,
    pack_bundle,
    per_layer,
)

log = logging.getLogger("warmstart")

KEEP_GENERATIONS = 2
MAX_BUNDLES = 8  # more deltas than this and the next publish writes one full bundle


def worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


# --------------------------------------------------------------------------- restore


@dataclass(frozen=True)
class RestoreResult:
    generation: int | None
    files: int
    bytes: int
    seconds: float
    per_layer: Mapping[str, tuple[int, int]]  # layer -> (files, bytes)
    problems: tuple[str, ...] = ()  # corrupt generations or bundles that were skipped
    bad_bundles: tuple[str, ...] = ()  # never to be referenced again by a publish
    source: str = ""  # the store's kind ("volume", "s3") it came from
    unavailable: bool = False  # the store could not be reached: nothing is known about it

    @property
    def restored(self) -> bool:
        return self.generation is not None


def _register_reader(store: BundleStore, reader: str, gen: Generation, ttl_s: float) -> str:
    """Atomically (a half-written registration would protect nothing from the collector)."""
    rel = f"{READERS}/{reader}.json"
    payload = {"generation": gen.number, "bundles": [b.name for b in gen.bundles], "expires": now() + ttl_s}
    store.write(rel, json.dumps(payload, sort_keys=True).encode())
    return rel


def restore(store: BundleStore, dest: Path, *, reader: str, ttl_s: float = 1800.0) -> RestoreResult:
    """Replace `dest` with the newest generation that restores intact (or leave it empty)."""
    start = time.monotonic()
    problems: list[str] = []
    bad: list[str] = []
    staging = dest.with_name(dest.name + f".restoring-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    unavailable = False
    unregistered = False
    try:
        numbers = store.generation_numbers()
    except (StoreError, OSError) as exc:  # nothing can be known about a store that cannot be listed
        numbers, unavailable = [], True
        problems.append(str(exc))
    for number in reversed(numbers):
        try:
            gen = store.load(number)
        except FileNotFoundError:
            continue
        except StoreUnavailable as exc:
            problems.append(str(exc))
            unavailable = True
            break
        except StoreError as exc:
            problems.append(str(exc))
            continue
        registration = None
        try:
            registration = _register_reader(store, reader, gen, ttl_s)
        except (OSError, StoreError) as exc:
            # A read-only or full volume, or read-only credentials, can still be read: restore
            # unregistered (a registration only delays garbage collection; a bundle that a collector
            # removes meanwhile fails its check and the next generation is tried). An unreachable
            # store fails again at the next request.
            if not unregistered:
                log.warning("warmstart | restore  | cannot register as a reader (%s): restoring unprotected", exc)
                unregistered = True
        try:
            step("restore:registered")
            if not store.exists(f"{GENERATIONS}/{gen_name(number)}"):
                continue  # removed between listing and registering: take the next
            staging.mkdir(parents=True)
            for ref in gen.bundles:
                extract_bundle(store.bundle_chunks(ref), ref, gen, staging)
            step("restore:extracted")
        except StoreUnavailable as exc:
            problems.append(f"generation {number}: {exc}")
            shutil.rmtree(staging, ignore_errors=True)
            unavailable = True
            break
        except (StoreError, OSError) as exc:
            problems.append(f"generation {number}: {exc}")
            if isinstance(exc, StoreError) and exc.bundle:
                bad.append(exc.bundle)
            shutil.rmtree(staging, ignore_errors=True)
            continue
        finally:
            if registration is not None:
                try:
                    store.remove(registration)
                except (OSError, StoreError):
                    pass
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, dest)
        files = [(p, f.size) for p, f in gen.files.items()]
        seconds = time.monotonic() - start
        return RestoreResult(
            number, len(files), gen.bytes, seconds, per_layer(files), tuple(problems), tuple(bad), store.kind
        )
    # Nothing restorable: start cold, from an empty directory.
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    return RestoreResult(None, 0, 0, time.monotonic() - start, {}, tuple(problems), tuple(bad), store.kind, unavailable)


# --------------------------------------------------------------------------- publish


@dataclass(frozen=True)
class PublishPlan:
    """What a publish would write: files the current generation lacks, on top of it (or all, fresh)."""

    base: Generation | None
    files: Mapping[str, tuple[int, int]]  # path -> (size, mtime_ns), relative to the local cache base
    full: bool  # a fresh generation that does not reference the base's bundles
    reason: str

    @property
    def empty(self) -> bool:
        return not self.files

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.files.values())


def plan_publish(store: BundleStore, local: Path, *, distrust: Iterable[str] = ()) -> PublishPlan:
    """Compare the local cache with the newest generation in the store."""
    base, _ = store.latest()
    scan = scan_tree(local)
    local_files = {p: v for p, v in scan.files.items() if layer_of(p) is not None}
    distrusted = set(distrust)
    if base is None:
        return PublishPlan(None, local_files, True, f"no generation in the {store.kind} store yet")
    if distrusted & {b.name for b in base.bundles}:
        return PublishPlan(base, local_files, True, "the newest generation holds a corrupt bundle: writing it anew")
    if len(base.bundles) >= MAX_BUNDLES:
        return PublishPlan(base, local_files, True, f"compacting {len(base.bundles)} bundles into one")
    missing = {p: v for p, v in local_files.items() if p not in base.files}
    return PublishPlan(base, missing, False, f"{len(missing)} files the generation {base.number} lacks")


@dataclass(frozen=True)
class PublishResult:
    status: str  # published | nothing_new | skipped | failed
    generation: int | None = None
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    detail: str = ""
    per_layer: Mapping[str, tuple[int, int]] = field(default_factory=dict)


def _write_bundle(store: BundleStore, local: Path, files: Mapping[str, tuple[int, int]]) -> BundleRef:
    """Pack the files into one bundle through the store's writer, which verifies and names it."""
    writer = store.bundle_writer()
    try:
        size, sha = pack_bundle(local, files, writer.sink)
        return writer.commit(size, sha, len(files))
    except BaseException:
        writer.abort()
        raise


def execute_publish(store: BundleStore, local: Path, plan: PublishPlan, *, publisher: str) -> PublishResult:
    """Write the plan: one bundle, then a generation created in place (never overwriting one)."""
    start = time.monotonic()
    if plan.empty:
        return PublishResult(
            "nothing_new",
            plan.base.number if plan.base else None,
            detail=f"the {store.kind} store's generation already holds every local file",
        )
    store.create()
    # Files may have changed since the plan's scan; pack what is there now.
    files = {}
    for rel in plan.files:
        try:
            st = os.stat(local / rel)
        except FileNotFoundError:
            continue
        files[rel] = (st.st_size, st.st_mtime_ns)
    ref = _write_bundle(store, local, files)
    base = plan.base
    entries = {} if plan.full or base is None else dict(base.files)
    bundles = () if plan.full or base is None else base.bundles
    for rel, (size, mtime_ns) in files.items():
        entries[rel] = FileEntry(size, mtime_ns, ref.name)
    number = (base.number if base else 0) + 1
    for _ in range(5):
        gen = Generation(number, (*bundles, ref), entries, now(), publisher)
        data = json.dumps(gen.to_json(), sort_keys=True).encode()
        if not store.create_generation(number, data):
            # Someone published this number meanwhile: build on theirs, keep our bundle.
            newest, _ = store.latest()
            if newest is None:
                raise StoreError("a generation appeared and vanished during publish") from None
            entries = dict(newest.files)
            for rel, (size, mtime_ns) in files.items():
                entries.setdefault(rel, FileEntry(size, mtime_ns, ref.name))
            bundles = newest.bundles
            number = newest.number + 1
            continue
        return PublishResult(
            "published",
            number,
            len(files),
            ref.size,
            time.monotonic() - start,
            plan.reason,
            per_layer((p, s) for p, (s, _) in files.items()),
        )
    raise StoreError("could not claim a generation number after 5 tries")


def publish(
    store: BundleStore,
    local: Path,
    *,
    publisher: str,
    lease_wait_s: float,
    lease_ttl_s: float = LEASE_TTL_S,
    distrust: Iterable[str] = (),
) -> PublishResult:
    """Take the lease (waiting up to `lease_wait_s`), publish what is missing, collect garbage."""
    start = time.monotonic()
    lease = store.lease(publisher, lease_ttl_s)
    step("publish:start")
    try:
        got = lease.try_acquire()
        if not got:
            log.info(
                "warmstart | publish  | the publish lease is held by %s: waiting up to %.0f s, then publishing "
                "only what its generation lacks",
                lease.current_holder() or "?",
                lease_wait_s,
            )
            step("publish:lease_busy")
            got = lease.acquire(lease_wait_s)
    except (OSError, StoreError) as exc:
        reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
        return PublishResult("failed", seconds=time.monotonic() - start, detail=f"publish failed, no lease: {reason}")
    if not got:
        return PublishResult("skipped", detail="another worker holds the publish lease")
    try:
        step("publish:lease_held")
        plan = plan_publish(store, local, distrust=distrust)
        result = execute_publish(store, local, plan, publisher=publisher)
        try:
            collect_garbage(store, ttl_s=lease_ttl_s).execute(store)
        except (OSError, StoreError) as exc:
            log.warning("warmstart | publish  | garbage collection failed: %s", exc)
        step("publish:collected")
        return replace(result, seconds=time.monotonic() - start)  # lease and garbage included
    except (OSError, StoreError) as exc:
        reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
        return PublishResult(
            "failed",
            seconds=time.monotonic() - start,
            detail=f"publish failed, the previous generation is intact: {reason}",
        )
    finally:
        try:
            lease.release()
        except (OSError, StoreError) as exc:
            log.warning("warmstart | publish  | could not release the lease (it expires by itself): %s", exc)


# --------------------------------------------------------------------------- garbage


@dataclass(frozen=True)
class GarbagePlan:
    generations: tuple[str, ...]  # generation files to remove (first)
    bundles: tuple[str, ...]  # bundle files to remove (after)
    temporaries: tuple[str, ...]  # abandoned temporaries and expired reader registrations

    def execute(self, store: BundleStore) -> None:
        """Remove each entry; one that fails does not stop the others, except that no bundle is
        removed after a generation could not be (that generation may still reference it).
        Raises StoreError naming the failures once every possible step ran."""
        failed: list[str] = []

        def remove(rel: str) -> bool:
            try:
                store.remove(rel)
                return True
            except (OSError, StoreError) as exc:
                failed.append(f"{rel}: {exc}")
                return False

        generations_gone = all([remove(f"{GENERATIONS}/{name}") for name in self.generations])
        if generations_gone:
            for name in self.bundles:
                remove(f"{BUNDLES}/{name}")
        for rel in self.temporaries:
            remove(rel)
        if failed:
            kept = "" if generations_gone else " (no bundle removed: a generation could not be)"
            raise StoreError(f"{len(failed)} removal(s) failed{kept}: {failed[0]}")


def collect_garbage(store: BundleStore, *, ttl_s: float, keep: int = KEEP_GENERATIONS) -> GarbagePlan:
    """Plan removals: generations beyond the newest `keep` that no live reader uses, bundles no
    remaining generation or reader references, temporaries older than `ttl_s`."""
    live_generations: set[int] = set()
    live_bundles: set[str] = set()
    temporaries: list[str] = []
    t = now()
    for name, data in store.reader_registrations().items():
        try:
            if data is not None and float(data["expires"]) >= t:
                live_generations.add(int(data["generation"]))
                live_bundles.update(data.get("bundles", []))
                continue
        except (ValueError, KeyError, TypeError):
            pass
        temporaries.append(f"{READERS}/{name}")
    numbers = store.generation_numbers()
    kept = set(numbers[-keep:]) | live_generations
    remove_gens = [n for n in numbers if n not in kept]
    referenced = set(live_bundles)
    for number in kept:
        try:
            referenced.update(b.name for b in store.load(number).bundles)
        except (FileNotFoundError, StoreError):
            continue
    bundles = [
        name
        for name, age in store.names(BUNDLES).items()
        # Unreferenced and old: young ones may belong to a publish that is about to create its generation.
        if not name.startswith(".") and name not in referenced and age > ttl_s
    ]
    try:
        temporaries += store.abandoned(ttl_s)
    except StoreUnavailable:
        raise
    except (OSError, StoreError) as exc:  # e.g. a store without ListMultipartUploads: the rest still runs
        log.warning("warmstart | gc       | %s: abandoned uploads not listed (%s)", store.location, exc)
    return GarbagePlan(tuple(gen_name(n) for n in remove_gens), tuple(sorted(bundles)), tuple(temporaries))
