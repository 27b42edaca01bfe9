"""Restore: a key's newest intact generation onto local disk, in a few large sequential reads.

Writing compilers' thousands of small files straight onto a network volume is slow to
read (a round trip per open and stat) and unsafe when several workers boot cold at once.
In staged mode a store holds, per key, immutable *bundles* (tar, in zstd frames) and *generations*
(JSON indexes naming the bundles and every file in them); the format is `store.bundle`.
On the volume (`store.volume`):

    <key_dir>/staged/
        bundles/<sha256 prefix>-<id>.tar.zst  (.tar: plain) written as .tmp-*, verified, then renamed
        generations/g00000007.json          a generation; exists only once complete
        readers/<reader>.json               a restore in progress (protects its bundles)
        publish.lease                       who may publish now, until when

An S3 prefix holds the same names (`store.s3`); the algorithms (this module, `store.publish`,
`store.bundlegc`) are written once against `store.backend.BundleStore` and run on both.

A boot restores the newest complete generation, checking each bundle's SHA-256 while it
streams and writing its files meanwhile (`store.extract`), into a fresh local directory that
then replaces the key's local cache (`store.swap`). It registers as a reader first, so that no
collector removes the bundles it reads. A corrupt or truncated bundle is reported and the next
older generation tried.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .. import log
from . import cachelock
from .backend import GENERATIONS, READERS, BundleStore, Tier, step
from .bundle import Generation, StoreError, StoreUnavailable, gen_name, now, per_layer
from .deadline import Deadline
from .extract import extract_bundle
from .swap import clear_leftovers, replace_cache, staging_dir


@dataclass(frozen=True)
class RestoreResult:
    generation: int | None
    files: int
    bytes: int
    seconds: float
    per_layer: Mapping[str, tuple[int, int]]  # layer -> (files, bytes)
    problems: tuple[str, ...] = ()  # corrupt generations or bundles that were skipped
    bad_bundles: tuple[str, ...] = ()  # never to be referenced again by a publish
    source: Tier | Literal[""] = ""  # the store it came from ("": none, a result made by hand)
    unavailable: bool = False  # the store could not be reached: nothing is known about it
    canary: Mapping[str, Any] | None = None  # the restored generation's canary record (canary.py), if any
    bundles: tuple[str, ...] = ()  # the restored generation's bundles

    @property
    def restored(self) -> bool:
        return self.generation is not None


def _register_reader(store: BundleStore, reader: str, gen: Generation, ttl_s: float) -> str:
    """Atomically (a half-written registration would protect nothing from the collector)."""
    rel = f"{READERS}/{reader}.json"
    payload = {"generation": gen.number, "bundles": [b.name for b in gen.bundles], "ttl_s": ttl_s}
    payload["expires"] = now() + ttl_s  # for people and old collectors: its age on the store's clock decides
    store.write(rel, json.dumps(payload, sort_keys=True).encode())
    return rel


def restore(
    store: BundleStore, dest: Path, *, reader: str, ttl_s: float = 1800.0, guard: Deadline | None = None
) -> RestoreResult:
    """Replace `dest` with the newest generation that restores intact (or leave it empty). With a
    `guard`, `dest` is written only under its `committing()`: never once its deadline passed.
    Only under the cache's exclusive lock (`store.cachelock`): while another worker holds it, the
    cache is that worker's and is left as it is. A local disk that cannot take the restore (full,
    out of inodes) is a problem of the result, never an exception: the boot starts cold."""
    start = time.monotonic()
    if cachelock.held_exclusive(dest):  # restore_tiers took it, and keeps it for the worker's life
        return _restore(store, dest, reader=reader, ttl_s=ttl_s, guard=guard, start=start)
    try:
        if not cachelock.try_exclusive(dest):
            problem = f"the local cache {dest} is in use by another worker on this host: left as it is"
            return RestoreResult(None, 0, 0, time.monotonic() - start, {}, (problem,), (), store.kind)
    except OSError as exc:
        return _local_failure(store, dest, exc, start)
    try:
        return _restore(store, dest, reader=reader, ttl_s=ttl_s, guard=guard, start=start)
    finally:
        cachelock.release(dest)  # taken for this restore alone


def _restore(
    store: BundleStore, dest: Path, *, reader: str, ttl_s: float, guard: Deadline | None, start: float
) -> RestoreResult:
    problems: list[str] = []
    bad: list[str] = []
    # Per store and per process: a tier's restore left behind by its deadline never touches the next tier's.
    staging = staging_dir(dest, store.kind)
    try:
        clear_leftovers(dest)
        shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        return _local_failure(store, dest, exc, start)
    unavailable = False
    unregistered = False
    try:
        numbers = store.generation_numbers()
    except (StoreError, OSError) as exc:  # nothing can be known about a store that cannot be listed
        numbers, unavailable = [], True
        problems.append(str(exc))
    distrusted = store.distrusted_numbers() if numbers else set()
    for number in reversed(numbers):
        if number in distrusted:
            problems.append(f"generation {number}: distrusted (its canary differed after a restore): skipped")
            continue
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
                log.warning("restore", "cannot register as a reader (%s): restoring unprotected", exc)
                unregistered = True
        local_error = False
        try:
            step("restore:registered")
            if not store.exists(f"{GENERATIONS}/{gen_name(number)}"):
                continue  # removed between listing and registering: take the next
            try:
                staging.mkdir(parents=True)
            except OSError as exc:  # the local disk, not the store: no older generation fits either
                problems.append(f"the local cache {dest}: {exc.strerror or exc}")
                local_error = True
                break
            for ref in gen.bundles:
                extract_bundle(store.bundle_chunks(ref), ref, gen, staging)
            step("restore:extracted")
        except StoreUnavailable as exc:
            problems.append(f"generation {number}: {exc}")
            shutil.rmtree(staging, ignore_errors=True)
            unavailable = True
            break
        except (StoreError, OSError, ValueError) as exc:  # ValueError: a name no file system takes
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
            if local_error:
                shutil.rmtree(staging, ignore_errors=True)
        try:
            replace_cache(dest, staging, guard)
        except StoreUnavailable:
            raise  # the deadline passed: the caller goes on without this restore
        except OSError as exc:
            problems.append(f"the local cache {dest}: {exc.strerror or exc}")
            break
        files = [(p, f.size) for p, f in gen.files.items()]
        seconds = time.monotonic() - start
        return RestoreResult(
            number,
            len(files),
            gen.bytes,
            seconds,
            per_layer(files),
            tuple(problems),
            tuple(bad),
            store.kind,
            canary=gen.canary,
            bundles=tuple(b.name for b in gen.bundles),
        )
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        replace_cache(dest, staging, guard)  # nothing restorable: start cold, from an empty directory
    except StoreUnavailable:
        raise
    except OSError as exc:  # the old cache stays where it is; vLLM writes what it can
        shutil.rmtree(staging, ignore_errors=True)
        problems.append(f"the local cache {dest}: {exc.strerror or exc}")
    return RestoreResult(None, 0, 0, time.monotonic() - start, {}, tuple(problems), tuple(bad), store.kind, unavailable)


def _local_failure(store: BundleStore, dest: Path, exc: OSError, start: float) -> RestoreResult:
    problem = f"the local cache {dest}: {exc.strerror or exc}"
    return RestoreResult(None, 0, 0, time.monotonic() - start, {}, (problem,), (), store.kind)
