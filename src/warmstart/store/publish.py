"""Publish: after vLLM serves, write back what the store's newest generation lacks, under the lease.

The worker that holds the publish lease writes a bundle of the files the current generation
lacks and a generation that lists the old bundles plus the new one (the union); others wait for
the lease and then publish only what is still missing, usually nothing. Generations are
created without overwriting (`os.link` on the volume, a conditional or verified PUT on S3),
so even two publishers that both believe they hold the lease cannot clobber each other. The
store's format and layout: `store.restore`. After a publish, the store's old generations and
unreferenced bundles are collected (`store.bundlegc`), generation first, bundles after, so the
store is consistent after every step.

Like huggingface_hub's cache manager, each operation is a scan, then a plan, then an
`execute()`: a dry run is free.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from .. import log
from ..limits import LEASE_TTL_S
from ..tree import scan_tree
from .backend import BundleStore, step
from .bundle import (
    BundleRef,
    FileEntry,
    Generation,
    StoreError,
    StoreUnavailable,
    is_temporary,
    layer_of,
    now,
    per_layer,
    safe_relpath,
)
from .bundlegc import collect_garbage
from .extract import extract_bundle
from .pack import Packed, file_sha256, open_for_writing, pack_bundle
from .swap import process_token

MAX_BUNDLES = 8  # more deltas than this and the next publish writes one full bundle


@dataclass(frozen=True)
class PublishPlan:
    """What a publish would write: local files the current generation lacks or holds other bytes
    of, on top of it; or, `full`, a fresh generation of every local file plus `carry`, the base's
    files this worker lacks (a compaction writes the union, not only what is local)."""

    base: Generation | None
    files: Mapping[str, tuple[int, int]]  # path -> (size, mtime_ns), relative to the local cache base
    full: bool  # a fresh generation that does not reference the base's bundles
    reason: str
    carry: Mapping[str, FileEntry] = field(default_factory=dict)  # full: the base's files to repack
    distrusted: frozenset[str] = frozenset()  # bundles whose files are never carried

    @property
    def empty(self) -> bool:
        return not self.files and not self.carry

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.files.values()) + sum(f.size for f in self.carry.values())


def plan_publish(store: BundleStore, local: Path, *, distrust: Iterable[str] = ()) -> PublishPlan:
    """Compare the local cache with the newest generation in the store. A file is new when the
    generation lacks its path or holds other bytes there (size or mtime differ from the entry:
    restore sets both, so a restored file that nobody rewrote is never new)."""
    base, _ = store.latest()
    scan = scan_tree(local)
    local_files = {p: v for p, v in scan.files.items() if layer_of(p) is not None and not is_temporary(p)}
    odd = [p for p in local_files if not safe_relpath(p)]
    if odd:  # the index is JSON (UTF-8): such a name would make the generation unloadable for every worker
        log.warning(
            "publish",
            "%d cache file(s) left out: the name is not valid UTF-8 (%r)",
            len(odd),
            os.fsencode(odd[0]),
        )
        local_files = {p: v for p, v in local_files.items() if p not in set(odd)}
    distrusted = frozenset(distrust)
    if base is None:
        return PublishPlan(None, local_files, True, f"no generation in the {store.kind} store yet")
    # A path that is a file here and a directory in the store (or the other way round) keeps its newer
    # form: a copy restored before another worker changed it must not undo that change.
    older = older_forms(local_files, base.files)  # once: inside the comprehension it ran per file (quadratic)
    local_files = {p: v for p, v in local_files.items() if p not in older}
    carry = without_conflicts(
        {
            p: f
            for p, f in base.files.items()
            if p not in local_files and f.bundle not in distrusted and not is_temporary(p)  # one published before
        },
        local_files,
    )
    if distrusted & {b.name for b in base.bundles}:
        reason = "the newest generation holds a corrupt bundle: writing it anew"
        return PublishPlan(base, local_files, True, reason, carry, distrusted)
    if len(base.bundles) >= MAX_BUNDLES:
        reason = f"compacting {len(base.bundles)} bundles into one"
        return PublishPlan(base, local_files, True, reason, carry, distrusted)
    missing = {p: v for p, v in local_files.items() if p not in base.files}
    changed = {p: v for p, v in local_files.items() if p in base.files and _other_bytes(local / p, v, base.files[p])}
    reason = f"{len(missing)} files the generation {base.number} lacks" + (
        f", {len(changed)} it holds other bytes of" if changed else ""
    )
    return PublishPlan(base, missing | changed, False, reason)


def _other_bytes(path: Path, stat: tuple[int, int], entry: FileEntry) -> bool:
    """Does the local file hold other bytes than the generation's entry? Same size and mtime: no
    (restore sets both); another size: yes; another mtime only: its digest decides (a worker that
    compiled the same kernel cold has the same bytes, a rewritten autotune result other ones)."""
    if stat == (entry.size, entry.mtime_ns):
        return False
    if stat[0] != entry.size or not entry.sha256:
        return True
    return file_sha256(path) != entry.sha256


PublishStatus = Literal["published", "nothing_new", "skipped", "failed"]


@dataclass(frozen=True)
class PublishResult:
    status: PublishStatus
    generation: int | None = None
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    detail: str = ""
    per_layer: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()  # local files not published: still being written (new next time)


def _write_bundle(
    store: BundleStore, local: Path, files: Iterable[str], roots: Mapping[str, Path]
) -> tuple[BundleRef | None, Packed]:
    """Pack the files into one bundle through the store's writer, which verifies and names it;
    no bundle (None) when not one file held still."""
    writer = store.bundle_writer()
    try:
        packed = pack_bundle(
            local,
            files,
            writer.sink,
            writing=open_for_writing(local) - frozenset(roots),  # a carried copy is not the file held open here
            roots=roots,
            compress=store.compression == "zstd",
        )
        if not packed.files:
            writer.abort()
            return None, packed
        return writer.commit(packed.size, packed.sha256, len(packed.files), compressed=packed.compressed), packed
    except BaseException:
        writer.abort()
        raise


def _fetch_carry(store: BundleStore, plan: PublishPlan, carry: Mapping[str, FileEntry], into: Path) -> dict[str, Path]:
    """Extract the base's files `carry` names into `into` (for a compaction's union). A bundle that
    cannot be read fails the publish (the previous generation stays): dropping its files would make
    the union forget them; a bundle a restore found corrupt is distrusted and never carried."""
    assert plan.base is not None
    out: dict[str, Path] = {}
    for ref in plan.base.bundles:
        wanted = {p: f for p, f in carry.items() if f.bundle == ref.name}
        if not wanted:
            continue
        try:
            extract_bundle(store.bundle_chunks(ref), ref, replace(plan.base, files=wanted), into)
        except StoreUnavailable:
            raise
        except StoreError as exc:
            # Not a bundle a restore found corrupt (those are distrusted, never carried): a read that
            # failed now (a cut body, a short range) must not drop its files from the union for good.
            raise StoreError(f"compaction could not read {len(wanted)} files to carry: {exc}") from exc
        out.update(dict.fromkeys(wanted, into))
    return out


def _lost_in_compaction(plan: PublishPlan, packed: Mapping[str, object]) -> dict[str, FileEntry]:
    """A compaction's base files that did not make it into the packed bundle: a local file open for
    writing here or gone since the scan, or a carried copy that went missing before it was packed.
    They keep their base version (carried again after packing)."""
    if not plan.full or plan.base is None:
        return {}
    lost = {
        p: f
        for p, f in plan.base.files.items()
        if p not in packed and f.bundle not in plan.distrusted and not is_temporary(p)
    }
    return without_conflicts(lost, packed)


def _on_top_of(
    newest: Generation, new_entries: Mapping[str, FileEntry]
) -> tuple[dict[str, FileEntry], tuple[BundleRef, ...]]:
    """A generation published since the plan: its union, with this publish's files where it lacks
    them (its own version of a path wins: it was published first; of a file and a directory, the newer)."""
    stale = older_forms({p: (e.size, e.mtime_ns) for p, e in new_entries.items()}, newest.files)
    new_entries = {p: e for p, e in new_entries.items() if p not in stale}
    entries = without_conflicts(newest.files, new_entries)
    for rel, entry in new_entries.items():
        entries.setdefault(rel, entry)
    return entries, newest.bundles


def _next_number(store: BundleStore, base: Generation | None) -> int:
    """One above every generation name in the store, loadable or not: a malformed or unreadable
    newest one takes its number for good, and building on the newest loadable one's would collide."""
    try:
        numbers = store.generation_numbers()
    except (OSError, StoreError):
        numbers = []
    return max([base.number if base else 0, *numbers]) + 1


def without_conflicts(entries: Mapping[str, FileEntry], newer: Iterable[str]) -> dict[str, FileEntry]:
    """The older entries a newer set of paths leaves standing: a path that was a file and is now a
    directory (or the other way round) keeps only its newer form, so that the union restores."""
    newer = set(newer)
    newer_dirs = {parent for p in newer for parent in _parents(p)}
    return {
        p: f
        for p, f in entries.items()
        if p in newer or (p not in newer_dirs and not any(parent in newer for parent in _parents(p)))
    }


def older_forms(local: Mapping[str, tuple[int, int]], stored: Mapping[str, FileEntry]) -> set[str]:
    """Local paths (size, mtime_ns) whose other form in the store, the same path as a directory or a
    parent of it as a file, was written later. A restored file keeps its generation's recorded mtime, so
    a stale copy is older than what replaced it; a form written here since is newer and stays."""
    stored_dirs: dict[str, int] = {}
    for rel, entry in stored.items():
        for parent in _parents(rel):
            stored_dirs[parent] = max(stored_dirs.get(parent, 0), entry.mtime_ns)
    older = set()
    for rel, (_, mtime_ns) in local.items():
        if rel in stored_dirs and stored_dirs[rel] > mtime_ns:  # a file here, a newer directory there
            older.add(rel)
        elif any(parent in stored and stored[parent].mtime_ns > mtime_ns for parent in _parents(rel)):
            older.add(rel)  # under a directory here, where the store holds a newer file
    return older


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def execute_publish(
    store: BundleStore,
    local: Path,
    plan: PublishPlan,
    *,
    publisher: str,
    canary: Mapping[str, Any] | None = None,
) -> PublishResult:
    """Write the plan: one bundle, then a generation created in place (never overwriting one).
    `canary`: this boot's canary record (canary.py); None keeps the base generation's."""
    start = time.monotonic()
    if plan.empty:
        return PublishResult(
            "nothing_new",
            plan.base.number if plan.base else None,
            detail=f"the {store.kind} store's generation already holds every local file",
        )
    store.create()
    # Beside the cache, named by this process's token (pid and a random part): two workers sharing a
    # local cache in two containers are both pid 1, and a pid alone let one publish remove the
    # other's carried copies midway (found by the 200-round soak at round 115: a cold worker's
    # S3 compaction, while its cache-sharing sibling published to the volume, forgot 394 paths).
    carried = local.with_name(f"{local.name}.compacting-{process_token()}")
    shutil.rmtree(carried, ignore_errors=True)
    refs: list[BundleRef] = []
    try:
        roots = _fetch_carry(store, plan, plan.carry, carried) if plan.carry else {}
        step("publish:carried")
        # Files may have changed since the plan's scan: what is packed is what held still meanwhile.
        ref, packed = _write_bundle(store, local, [*plan.files, *roots], roots)
        files = dict(packed.files)
        refs += [ref] if ref is not None else []
        lost = _lost_in_compaction(plan, files)
        if lost:  # carried after packing: a base file open for writing here, or gone since the scan
            more = _fetch_carry(store, plan, lost, carried / "after")
            extra, extra_packed = _write_bundle(store, local, list(more), more)
            if len(extra_packed.files) != len(lost):  # never a union that forgets what its base held
                unpacked = sorted(set(lost) - set(extra_packed.files))
                raise StoreError(f"compaction could not pack {len(unpacked)} base files, e.g. {unpacked[0]}")
            if extra is not None:
                refs.append(extra)
                entries_extra = {p: (*v, extra.name) for p, v in extra_packed.files.items()}
            else:
                entries_extra = {}
        else:
            entries_extra = {}
    finally:
        shutil.rmtree(carried, ignore_errors=True)
    if not refs:
        return PublishResult(
            "nothing_new",
            plan.base.number if plan.base else None,
            detail=f"{len(packed.unstable)} files still being written: left for the next publish",
            left_out=packed.unstable,
        )
    base = plan.base
    new_entries = {rel: FileEntry(size, mtime_ns, refs[0].name, sha) for rel, (size, mtime_ns, sha) in files.items()}
    new_entries |= {rel: FileEntry(size, mtime, name, sha) for rel, (size, mtime, sha, name) in entries_extra.items()}
    entries = {} if plan.full or base is None else without_conflicts(base.files, new_entries)
    bundles = () if plan.full or base is None else base.bundles
    entries.update(new_entries)
    number = _next_number(store, base)
    if number > (base.number if base else 0) + 1 and (newest := store.latest()[0]) is not None:
        if base is None or newest.number > base.number:  # published since the plan: build on theirs
            entries, bundles = _on_top_of(newest, new_entries)
    if canary is None and base is not None:
        canary = base.canary
    for _ in range(5):
        gen = Generation(number, (*bundles, *refs), entries, now(), publisher, canary)
        data = json.dumps(gen.to_json(), sort_keys=True).encode()
        if not store.create_generation(number, data):
            # Someone published this number meanwhile: build on theirs, keep our bundles.
            newest, _ = store.latest()
            if newest is None:
                raise StoreError("a generation appeared and vanished during publish") from None
            entries, bundles = _on_top_of(newest, new_entries)
            number = _next_number(store, newest)
            continue
        return PublishResult(
            "published",
            number,
            len(new_entries),
            sum(r.size for r in refs),
            time.monotonic() - start,
            plan.reason,
            per_layer((p, e.size) for p, e in new_entries.items()),
            left_out=tuple(p for p in packed.unstable if p not in new_entries),
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
    canary: Mapping[str, Any] | None = None,
) -> PublishResult:
    """Take the lease (waiting up to `lease_wait_s`), publish what is missing, collect garbage."""
    start = time.monotonic()
    lease = store.lease(publisher, lease_ttl_s)
    step("publish:start")
    try:
        got = lease.try_acquire()
        if not got:
            log.info(
                "publish",
                "the publish lease is held by %s: waiting up to %.0f s, then publishing only what its generation lacks",
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
        with lease.renewed(lease_ttl_s / 3):  # an upload longer than the TTL keeps the lease
            step("publish:lease_held")
            plan = plan_publish(store, local, distrust=distrust)
            result = execute_publish(store, local, plan, publisher=publisher, canary=canary)
            try:
                collect_garbage(store, ttl_s=lease_ttl_s).execute(store)
            except (OSError, StoreError) as exc:
                log.warning("publish", "garbage collection failed: %s", exc)
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
            log.warning("publish", "could not release the lease (it expires by itself): %s", exc)
