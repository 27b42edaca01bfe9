"""The image tier: keys' caches baked into the worker's image by `warmstart export`, read-only.

A network volume ties an endpoint to one datacenter and an S3 store costs a bucket and a
cross-region read per boot; an image is cached on Runpod's hosts wherever it runs. An export
holds, per key, one verified generation and its bundles in the volume's own layout:

    <image caches>/export.json                    what was exported, from where, when
    <image caches>/keys/<key>/manifest.json       the key and its factors (siblings read them)
    <image caches>/keys/<key>/staged/generations/g00000007.json
    <image caches>/keys/<key>/staged/bundles/<sha256 prefix>-<id>.tar.zst

`ImageStore` is that `staged/` folder as a `BundleStore` that can only be read: a restore from
it is the staged restore itself, so every bundle's SHA-256 and size, every tar header and every
member is checked as on any tier, and a corrupt bundle sends the boot to the next older
generation or the next tier. Nothing is ever written to it: a publish never targets it (the
boot publishes to the volume and S3 only), and the reader registration a restore writes is
skipped (nothing collects an image's bundles, so there is nothing to protect them from).
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import log
from .backend import BUNDLES, GENERATIONS, READERS, BundleStore, BundleWriter, Lease
from .bundle import BundleRef, Generation, StoreError, file_ranges, gen_name, parse_gen_name

EXPORT_FILE = "export.json"  # at the top of an export: what it holds, from where
KEYS_DIR = "keys"
STAGED_DIR = "staged"
MANIFEST = "manifest.json"


class ReadOnly(StoreError):
    """A write asked of the image tier: a bug, never a state of the store."""


class _NoLease(Lease):
    """The image tier's lease: never held, so no publish can start on it."""

    def try_acquire(self) -> bool:
        return False

    def release(self) -> None:
        return None


@dataclass(frozen=True)
class ImageStore(BundleStore):
    """One key's baked generation: `<image caches>/keys/<key>/staged`, read-only."""

    root: Path
    kind = "image"  # a Tier: a class attribute, not a dataclass field

    @property
    def location(self) -> str:
        return str(self.root)

    def create(self) -> None:
        raise ReadOnly(f"the image tier {self.root} is read-only: nothing is published to it")

    def names(self, folder: str) -> dict[str, float]:
        try:
            return dict.fromkeys(os.listdir(self.root / folder), 0.0)
        except FileNotFoundError:
            return {}
        except OSError as exc:  # a baked folder that cannot be listed: the image is broken, say so
            raise StoreError(f"cannot list {self.root / folder}: {exc.strerror or exc}") from exc

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def write(self, rel: str, data: bytes) -> None:
        if rel.startswith(f"{READERS}/"):
            return  # a reader registration protects bundles from a collector; nothing collects an image
        raise ReadOnly(f"the image tier {self.root} is read-only: cannot write {rel}")

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def remove(self, rel: str) -> None:
        if rel.startswith(f"{READERS}/"):
            return  # the registration `write` skipped
        raise ReadOnly(f"the image tier {self.root} is read-only: cannot remove {rel}")

    def create_generation(self, number: int, data: bytes) -> bool:
        raise ReadOnly(f"the image tier {self.root} is read-only: nothing is published to it")

    def bundle_chunks(self, ref: BundleRef) -> Iterator[bytes]:
        path = self.root / BUNDLES / ref.name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise StoreError(f"bundle {ref.name} is missing from the image", ref.name) from None
        if size != ref.size:  # only the index's bytes are read: a longer file would pass unseen
            raise StoreError(f"bundle {ref.name} is truncated or corrupt: {size} bytes, index: {ref.size}", ref.name)
        return file_ranges(path, ref.size)

    def bundle_writer(self) -> BundleWriter:
        raise ReadOnly(f"the image tier {self.root} is read-only: nothing is published to it")

    def abandoned(self, ttl_s: float) -> list[str]:
        return []

    def lease(self, holder: str, ttl_s: float) -> Lease:
        return _NoLease()


def image_store(caches: Path | None, key: str) -> ImageStore | None:
    """The image tier for `key`, if the image's caches hold a generation of it (else None: the key
    falls through to the volume and S3, as without an image, and a warning says why: caches that
    are a .tar, a missing folder, or the keys the image holds and how each differs)."""
    store = _generation_store(caches, key)
    if store is None and caches is not None and (why := image_miss(caches, key)) is not None:
        log.warning("image", "%s", why)
    return store


_KEY_PARTS = ("model", "revision", "hardware", "vLLM", "flags or vLLM variables")  # key.py's dirname, in order


def _why_not(held: str, key: str) -> str:
    """How a key the image holds differs from this boot's, read from the two names (key.py's
    `model--revision--hardware--vllm-version--digest`)."""
    theirs, ours = held.rsplit("--", 4), key.rsplit("--", 4)
    if len(theirs) != 5 or len(ours) != 5:
        return "another key"
    pairs = zip(_KEY_PARTS[:4], theirs, ours, strict=False)  # the digest last: left out
    differs = [f"{label} {a} (this boot: {b})" for label, a, b in pairs if a != b]
    if not differs:
        return "same model, revision, hardware and vLLM: its flags or vLLM variables differ (`warmstart explain`)"
    return "differs in " + ", ".join(differs)


def held_keys(caches: Path) -> list[str]:
    """The keys with a generation in an export, as a folder or as the .tar `warmstart export` writes."""
    if caches.is_file():
        try:
            with tarfile.open(caches) as tar:
                names = tar.getnames()
        except (OSError, tarfile.TarError):
            return []
        parts = [n.removeprefix("./").split("/") for n in names]
        found = {
            p[1] for p in parts if len(p) == 5 and p[0] == KEYS_DIR and p[3] == GENERATIONS and parse_gen_name(p[4])
        }
        return sorted(found)
    try:
        names = sorted(os.listdir(caches / KEYS_DIR))
    except OSError:
        return []
    return [n for n in names if _generation_store(caches, n) is not None]


def _tar_generations(names: list[str]) -> list[tuple[str, int]]:
    """(key, generation number) of each generation index among a tar's member names."""
    out = []
    for name in names:
        p = name.removeprefix("./").split("/")
        if len(p) == 5 and (p[0], p[2], p[3]) == (KEYS_DIR, STAGED_DIR, GENERATIONS):
            if (number := parse_gen_name(p[4])) is not None:
                out.append((p[1], number))
    return out


def scan_tar(path: Path) -> tuple[tuple[ImageKey, ...], tuple[str, ...]]:
    """`scan_image` of the .tar `warmstart export` writes (what `warmstart ls --image x.tar` shows)."""
    try:
        with tarfile.open(path) as tar:
            members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
            newest: dict[str, int] = {}
            for key, number in _tar_generations(list(members)):
                newest[key] = max(number, newest.get(key, 0))
            keys = []
            for key, number in sorted(newest.items()):

                def read(name: str) -> Any:
                    handle = tar.extractfile(members[name]) if name in members else None
                    return json.loads(handle.read()) if handle is not None else None

                base = f"{KEYS_DIR}/{key}"
                manifest = read(f"{base}/{MANIFEST}")
                gen = Generation.from_json(read(f"{base}/{STAGED_DIR}/{GENERATIONS}/{gen_name(number)}"))
                bundles = sum(m.size for n, m in members.items() if n.startswith(f"{base}/{STAGED_DIR}/{BUNDLES}/"))
                factors = manifest.get("factors") if isinstance(manifest, dict) else None
                keys.append(ImageKey(key, factors or {}, number, len(gen.files), gen.bytes, bundles))
    except (OSError, tarfile.TarError, ValueError, StoreError) as exc:
        return (), (f"{path}: not a readable export .tar ({exc})",)
    note = (
        f"{path} is a .tar: a boot reads the image's caches unpacked (the Dockerfile's ADD unpacks it), "
        "with WARMSTART_IMAGE_CACHES naming that folder"
    )
    return tuple(keys), (note,)


def image_miss(caches: Path, key: str) -> str | None:
    """Why the image's caches give this boot's key nothing, in one line; None for caches that hold
    no key at all (a plain build bakes only image-caches/README.md: nothing to say)."""
    if caches.is_file():
        held = held_keys(caches)
        inside = f" (it holds {len(held)} key(s): {', '.join(held[:5])})" if held else ""
        return (
            f"WARMSTART_IMAGE_CACHES={caches} is a file{inside}: it must be the folder that the export unpacks "
            "to (the Dockerfile's ADD of a .tar does that); the image's caches are not used"
        )
    if not caches.is_dir():
        return f"WARMSTART_IMAGE_CACHES={caches}: no such folder; the image's caches are not used"
    held = held_keys(caches)
    if not held:
        return None
    shown = "; ".join(f"{name}: {_why_not(name, key)}" for name in held[:5])
    more = f" (and {len(held) - 5} more)" if len(held) > 5 else ""
    return f"the image's caches at {caches} hold no generation of this boot's key {key}; they hold {shown}{more}"


def _generation_store(caches: Path | None, key: str) -> ImageStore | None:
    if caches is None:
        return None
    root = caches / KEYS_DIR / key / STAGED_DIR
    try:
        names = os.listdir(root / GENERATIONS)
    except OSError:
        return None
    return ImageStore(root) if any(parse_gen_name(n) is not None for n in names) else None


# --------------------------------------------------------------------------- what an image holds


@dataclass(frozen=True)
class ImageKey:
    """One key baked into the image: its newest generation's size, and its factors (for siblings)."""

    name: str
    factors: dict[str, Any]
    generation: int | None
    files: int
    bytes: int  # the files' bytes, as restored
    bundle_bytes: int  # what the key adds to the image

    def to_json(self) -> dict[str, Any]:
        hardware = self.factors.get("hardware") or {}
        engine = self.factors.get("engine") or {}
        return {
            "key": self.name,
            "model": self.factors.get("model"),
            "revision": self.factors.get("revision"),
            "hardware": hardware.get("name") if isinstance(hardware, dict) else None,
            "vllm": engine.get("vllm") if isinstance(engine, dict) else None,
            "generation": self.generation,
            "files": self.files,
            "bytes": self.bytes,
            "bundle_bytes": self.bundle_bytes,
        }


def scan_image(caches: Path) -> tuple[tuple[ImageKey, ...], tuple[str, ...]]:
    """Every key in the image's caches, and warnings about the ones that cannot be read. Reads the
    indexes only: the bundles are checked when a boot restores them."""
    if caches.is_file():
        return scan_tar(caches)
    keys: list[ImageKey] = []
    warnings: list[str] = []
    try:
        names = sorted(os.listdir(caches / KEYS_DIR))
    except FileNotFoundError:
        return (), ()
    except OSError as exc:
        return (), (f"{caches / KEYS_DIR}: {exc.strerror or exc}",)
    for name in names:
        store = _generation_store(caches, name)
        if store is None:
            continue
        try:
            manifest = json.loads((caches / KEYS_DIR / name / MANIFEST).read_text())
        except (OSError, ValueError):
            manifest = {}
        factors = manifest.get("factors") if isinstance(manifest, dict) else None
        try:
            gen, problems = store.latest()
        except StoreError as exc:
            gen, problems = None, [str(exc)]
        warnings += [f"image key {name}: {p}" for p in problems]
        bundle_bytes = 0
        for entry in os.scandir(store.root / BUNDLES) if (store.root / BUNDLES).is_dir() else ():
            bundle_bytes += entry.stat().st_size if entry.is_file() else 0
        keys.append(
            ImageKey(
                name,
                factors if isinstance(factors, dict) else {},
                gen.number if gen else None,
                len(gen.files) if gen else 0,
                gen.bytes if gen else 0,
                bundle_bytes,
            )
        )
    return tuple(keys), tuple(warnings)
