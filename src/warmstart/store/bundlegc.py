"""Garbage collection of a key's staged store: old generations, unreferenced bundles, temporaries.

Removed only when no registered reader can still be restoring them, generation first, bundles
after, so the store is consistent after every step; a step that fails does not stop the others
(except that no bundle goes while a generation that may reference it could not be removed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import log
from .backend import BUNDLES, GENERATIONS, READERS, BundleStore
from .bundle import StoreError, StoreUnavailable, gen_name, now

KEEP_GENERATIONS = 2


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


def registration_live(data: dict[str, Any] | None, age_s: float | None) -> bool:
    """A reader registration protects its generation for its `ttl_s`, its age read on the store's
    clock (never against the reader's own clock); one written before `ttl_s` was recorded, or
    whose age is unknown, until its `expires`."""
    if data is None:
        return False
    try:
        ttl = data.get("ttl_s")
        if age_s is not None and isinstance(ttl, (int, float)):
            return age_s <= float(ttl)
        return float(data["expires"]) >= now()
    except (ValueError, KeyError, TypeError):
        return False


def collect_garbage(store: BundleStore, *, ttl_s: float, keep: int = KEEP_GENERATIONS) -> GarbagePlan:
    """Plan removals: generations beyond the newest `keep` that no live reader uses, bundles no
    remaining generation or reader references, temporaries older than `ttl_s`. Every age is read
    on the store's clock: a collector whose clock runs a day ahead never takes a bundle that a
    publish is about to index, or a reader's registration, for an old one."""
    live_generations: set[int] = set()
    live_bundles: set[str] = set()
    temporaries: list[str] = []
    registrations = store.reader_registrations()
    offset = store.clock_offset()
    for name, (data, age) in registrations.items():
        if registration_live(data, age + offset):
            try:
                assert data is not None
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
        if not name.startswith(".") and name not in referenced and age + offset > ttl_s
    ]
    try:
        temporaries += store.abandoned(ttl_s)
    except StoreUnavailable:
        raise
    except (OSError, StoreError) as exc:  # e.g. a store without ListMultipartUploads: the rest still runs
        log.warning("gc", "%s: abandoned uploads not listed (%s)", store.location, exc)
    return GarbagePlan(tuple(gen_name(n) for n in remove_gens), tuple(sorted(bundles)), tuple(temporaries))
