"""Seeding: restore a sibling key's shareable layers into a key that has no generation of its own,
then tell what the boot did with them.

The restore is `store.restore.restore` itself, run on a view of the sibling's store whose
generations list only the shareable layers' files (`layer_view`): the same streaming, checksums,
reader registration (the sibling's bundles are not collected meanwhile) and fallback to an older
generation. Every restored file gets its entry's mtime as both mtime and atime, so a file whose
atime moved by the time vLLM serves was read (the probe says whether this filesystem updates
access times at all: a `noatime` mount does not, and then reads are `None`, unknown). Inductor
opens an entry under fxgraph/ or aotautograd/ only when its key matched (codecache.py
FxGraphCache._lookup_graph, autograd_cache.py AOTAutogradCache): such reads are the layer's hits.

What the report makes of it (the seeded layers' details, the verdict, `staged.seeded`) is report/seeded.py.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from .. import log
from ..tree import scan_tree
from .backend import BundleStore
from .bundle import Generation, StoreError, layer_of
from .image import KEYS_DIR, STAGED_DIR, ImageStore
from .restore import RestoreResult
from .siblings import SeedPlan, SeedSource, sibling_store
from .tiers import restore_within
from .volume import StagedStore

# Files a library opens only when its own key matched and the entry is used as it is: reading one
# is a hit. In the other seeded layers any read is (Triton reads a kernel's group file only under
# the directory its key names, runtime/cache.py FileCacheManager.get_group; DeepJIT reads a cubin
# only from a committed entry of its digest, cache/disk.hpp DiskCache::entry).
HIT_ENTRIES: Mapping[str, Callable[[str], bool]] = {
    # torch/_inductor/codecache.py FxGraphCache._get_tmp_dir: os.path.join(cache_dir(), "fxgraph");
    # torch/_functorch/_aot_autograd/autograd_cache.py AOTAutogradCache._get_tmp_dir: "aotautograd".
    # Output code is named by its own source's hash and read whenever that source is generated.
    "inductor": lambda rel: rel.startswith(("inductor/fxgraph/", "inductor/aotautograd/")),
    # flashinfer/jit/core.py: ninja reads build.ninja and .ninja_log even when it then rebuilds; a
    # module's .so is loaded (mmap'd) as it is only when ninja left it (a rebuilt one is rewritten).
    "flashinfer": lambda rel: rel.endswith(".so"),
}


def layer_view(store: BundleStore, layers: tuple[str, ...]) -> BundleStore:
    """The sibling's store, whose generations list only `layers`' files (and the bundles holding
    them): a shallow copy with its own `load`. Every other method is the store's own, so the staged
    restore runs on it unchanged, whatever else it asks of a store."""
    keep = frozenset(layers)
    load = store.load

    def load_layers(number: int) -> Generation:
        gen = load(number)
        files = {p: f for p, f in gen.files.items() if layer_of(p) in keep}
        used = {f.bundle for f in files.values()}
        return replace(gen, bundles=tuple(b for b in gen.bundles if b.name in used), files=files)

    view = copy.copy(store)
    object.__setattr__(view, "load", load_layers)  # the folder store is a frozen dataclass
    return view


@dataclass(frozen=True)
class SeedResult:
    """What seeding gave: the source used (None: none restored), its restore, and the files."""

    source: SeedSource | None
    result: RestoreResult | None
    files: Mapping[str, tuple[int, int]]  # path under the cache base -> (size, mtime_ns) as restored
    atimes: bool  # whether this filesystem updates access times (reads can be told)
    problems: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    note: str = ""  # why nothing was seeded


def atimes_updated(directory: Path) -> bool:
    """Does reading a file here move its atime past its mtime (relatime, strictatime), or not (noatime)?"""
    probe = directory / f".warmstart-atime-{os.getpid()}"
    try:
        probe.write_bytes(b"x")
        os.utime(probe, ns=(10**18, 10**18))
        with open(probe, "rb") as handle:
            handle.read()
        st = probe.stat()
        return st.st_atime_ns != st.st_mtime_ns
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


def sibling_opener(
    staged_root: Path | None, s3: BundleStore | None, image_caches: Path | None = None
) -> Callable[[SeedSource], BundleStore]:
    """How to open a source's store: in the image (read-only), beside this key's on the volume, or
    under the same S3 URL."""

    def open_store(source: SeedSource) -> BundleStore:
        if source.tier == "image" and image_caches is not None:
            return ImageStore(image_caches / KEYS_DIR / source.key / STAGED_DIR)
        if source.tier == "volume" and staged_root is not None:
            return StagedStore(staged_root.parent.parent / source.key / staged_root.name)
        if source.tier == "s3" and s3 is not None:
            return sibling_store(s3, source.key)
        raise StoreError(f"no {source.tier} store to read {source.key} from")

    return open_store


def seed_from(
    plan: SeedPlan,
    dest: Path,
    open_store: Callable[[SeedSource], BundleStore],
    *,
    reader: str,
    ttl_s: float,
    deadline_s: float | None = None,
) -> SeedResult:
    """Restore the shareable layers of the first source that restores intact into `dest` (empty:
    nothing of this key's own was restored), each within `deadline_s` as a tier's restore is
    (store/tiers.py `restore_within`). Logs one line."""
    problems: list[str] = []
    empty: list[str] = []
    for source in plan.sources:
        try:
            store = layer_view(open_store(source), plan.layers)
            result = restore_within(store, dest, reader=reader, ttl_s=ttl_s, deadline_s=deadline_s)
        except Exception as exc:  # a sibling that cannot be opened is skipped, never fatal
            problems.append(f"{source.key}: {exc}")
            continue
        problems += [f"{source.key}: {p}" for p in result.problems]
        if result.restored and not result.files:
            empty.append(source.key)
        if not result.restored or not result.files:
            continue
        files = scan_tree(dest).files
        atimes = atimes_updated(dest)
        log.info(
            "seed",
            "no generation of its own: %d files (%.1f MB; %s) from sibling %s (%s store, generation %d) in %.2f s",
            result.files,
            result.bytes / 1e6,
            ", ".join(f"{layer} {n}" for layer, (n, _) in sorted(result.per_layer.items())),
            source.key,
            source.tier,
            result.generation,
            result.seconds,
        )
        return SeedResult(source, result, files, atimes, tuple(problems), plan.layers)
    reason = (
        "; ".join([*problems, *([f"no file of the seeded layers in {', '.join(empty)}"] if empty else [])])
        or plan.note
        or "no sibling's generation restored"
    )
    log.info("seed", "nothing to seed from: %s", reason)
    return SeedResult(None, None, {}, False, tuple(problems), plan.layers, reason)


@dataclass(frozen=True)
class SeedUse:
    """One seeded layer at the moment vLLM served: how many of its files were read."""

    files: int
    bytes: int
    read: int | None  # None: the filesystem keeps no access times
    hits: int | None  # reads of HIT_ENTRIES (None where the layer has none, or reads are unknown)
    rewritten: int
    gone: int


def seed_use(seed: SeedResult | None, base: Path) -> dict[str, SeedUse]:
    """Per seeded layer, what the boot read of it (taken when vLLM serves, before a publish reads it all)."""
    if seed is None or not seed.files:
        return {}
    counts: dict[str, list[int]] = {}
    for rel, (size, mtime_ns) in seed.files.items():
        layer = layer_of(rel)
        if layer is None:
            continue
        c = counts.setdefault(layer, [0, 0, 0, 0, 0, 0])  # files bytes read hits rewritten gone
        c[0] += 1
        c[1] += size
        try:
            st = os.stat(base / rel)
        except OSError:
            c[5] += 1
            continue
        if st.st_mtime_ns != mtime_ns:
            c[4] += 1
        elif st.st_atime_ns != st.st_mtime_ns:  # restore set both to the entry's mtime
            c[2] += 1
            c[3] += layer in HIT_ENTRIES and HIT_ENTRIES[layer](rel)
    return {
        layer: SeedUse(
            c[0],
            c[1],
            c[2] if seed.atimes else None,
            c[3] if seed.atimes and layer in HIT_ENTRIES else None,
            c[4],
            c[5],
        )
        for layer, c in counts.items()
    }
