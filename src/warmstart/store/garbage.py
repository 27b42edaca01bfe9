"""Garbage collection of a key's staged store: old generations, unreferenced bundles, temporaries.

Removed only when no registered reader can still be restoring them, generation first, bundles
after, so the store is consistent after every step; a step that fails does not stop the others
(except that no bundle goes while a generation that may reference it could not be removed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .backend import BUNDLES, GENERATIONS, READERS, BundleStore
from .bundle import StoreError, StoreUnavailable, gen_name, now

log = logging.getLogger("warmstart")

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
