"""`warmstart export`: one or several keys' newest verified generation, out of the volume or S3, for an image.

What a GPU worker published is exported on any machine: nothing here needs a GPU or vLLM. A key
is named (`--key`), or found the way a boot of this environment would find it: among the keys the
store holds, those whose recorded factors have this environment's model (and revision, if pinned),
flags and vLLM variables, on the GPU named (`--gpu`, since the exporting machine may have none).
The factors come from each key's manifest on the volume or its `key.json` in the S3 store.

A key's newest generation is exported when every bundle it lists reads back with the size and
SHA-256 its index records; otherwise the next older one. Bundles and the index are copied byte for
byte (their checksums are the restore's checks in the image), into the volume's layout
(`store.image` describes it), so an export of the S3 store in front of a volume equals an export of
that volume. The boot that restores it checks everything again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import log
from .backend import BUNDLES, GENERATIONS, BundleStore
from .bundle import Generation, StoreError, StoreUnavailable, gen_name
from .history import now_iso
from .image import EXPORT_FILE, KEYS_DIR, MANIFEST, STAGED_DIR

EXPORT_FORMAT = 1


class ExportError(StoreError):
    """Nothing (or not everything asked for) could be exported: the message says what and why."""


@dataclass(frozen=True)
class StoredKey:
    """A key a store holds, as its manifest (volume) or key.json (S3) describes it."""

    name: str
    factors: Mapping[str, Any]
    tier: str  # "volume" or "s3"
    last_used: str = ""


@dataclass(frozen=True)
class Wanted:
    """What this environment would boot, less what only its hardware and vLLM decide: the model (and
    revision, if pinned), the flags as vLLM parses them, and the vLLM variables for a hardware kind."""

    model: str
    revision: str | None
    args: Mapping[str, Any]
    vllm_env: Callable[[str], Mapping[str, str]]  # hardware kind -> the key's vllm_env for it


def gpu_matches(hardware: Mapping[str, Any], gpu: str) -> bool:
    """`--gpu` against a key's hardware: `cpu`, or a part of the GPU's name or the key's slug
    (`H100`, `RTX 5090`, `h100-80gb-hbm3-sm90`), case and spaces aside."""

    def norm(text: str) -> str:
        return "".join(text.lower().split())

    if norm(gpu) == "cpu":
        return hardware.get("kind") == "cpu"
    if hardware.get("kind") != "gpu":
        return False
    name = norm(str(hardware.get("name", "")))
    return norm(gpu) in name or norm(gpu).removeprefix("nvidia") in name


def matches(factors: Mapping[str, Any], wanted: Wanted, gpu: str) -> int | None:
    """Would a boot of `wanted` on `gpu` have this key's factors (hardware and vLLM builds aside)? 0: the
    same vLLM variables; 1: those and more, which the image itself sets (vLLM's image sets
    VLLM_USAGE_SOURCE, which vLLM hashes) and the exporting machine cannot know; None: no."""
    hardware = factors.get("hardware")
    if not isinstance(hardware, Mapping) or not gpu_matches(hardware, gpu):
        return None
    if factors.get("model") != wanted.model:
        return None
    if wanted.revision and factors.get("revision") != wanted.revision:
        return None
    if (factors.get("args") or {}) != dict(wanted.args):
        return None
    recorded = dict(factors.get("vllm_env") or {})
    mine = dict(wanted.vllm_env(str(hardware.get("kind"))))
    if recorded == mine:
        return 0
    return 1 if all(recorded.get(k) == v for k, v in mine.items()) else None


def choose_keys(
    stored: Iterable[StoredKey], *, names: Sequence[str] = (), wanted: Wanted | None = None, gpus: Sequence[str] = ()
) -> tuple[dict[str, StoredKey], list[str]]:
    """The keys to export (name -> where it is: the first tier that holds it, volume before S3),
    and what could not be found. By name; or, with `wanted`, per GPU the matching key, one with exactly
    these vLLM variables before one with more, then the most recently used (others that match too,
    e.g. of another vLLM, are named in a note)."""
    by_name: dict[str, StoredKey] = {}
    for key in stored:
        by_name.setdefault(key.name, key)
    chosen: dict[str, StoredKey] = {}
    missing: list[str] = []
    for name in names:
        if name in by_name:
            chosen[name] = by_name[name]
        else:
            missing.append(f"no key {name} in the store(s)")
    if wanted is not None:
        for gpu in gpus:
            fits = {k.name: matches(k.factors, wanted, gpu) for k in by_name.values()}
            found = sorted((k for k in by_name.values() if fits[k.name] is not None), key=lambda k: k.last_used)
            found = sorted(reversed(found), key=lambda k: fits[k.name] or 0)  # exact first, then the newest
            if not found:
                missing.append(f"no key of {wanted.model} with these flags on {gpu!r} in the store(s)")
                continue
            chosen[found[0].name] = found[0]
            for other in found[1:]:
                log.info("export", "%s also matches %r (older): not exported", other.name, gpu)
    return chosen, missing


# --------------------------------------------------------------------------- copying one key


@dataclass(frozen=True)
class ExportedKey:
    key: str
    tier: str
    location: str
    generation: int
    files: int
    bytes: int  # the files' bytes
    bundle_bytes: int  # what the key adds to the image
    problems: tuple[str, ...] = ()  # newer generations that did not verify

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "from": self.tier,
            "location": self.location,
            "generation": self.generation,
            "files": self.files,
            "bytes": self.bytes,
            "bundle_bytes": self.bundle_bytes,
            "problems": list(self.problems),
        }


def _copy_verified(store: BundleStore, gen: Generation, bundles: Path) -> int:
    """Copy every bundle of `gen` into `bundles`, each checked against its index as it streams."""
    total = 0
    for ref in gen.bundles:
        digest = hashlib.sha256()
        size = 0
        tmp = bundles / f".tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as out:
                for chunk in store.bundle_chunks(ref):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            if size != ref.size or digest.hexdigest() != ref.sha256:
                raise StoreError(f"bundle {ref.name} does not match its index ({size} of {ref.size} bytes)", ref.name)
            os.replace(tmp, bundles / ref.name)
        finally:
            tmp.unlink(missing_ok=True)
        total += size
    return total


def export_key(store: BundleStore, key: str, factors: Mapping[str, Any], out: Path) -> ExportedKey:
    """Write `key`'s newest generation that verifies, and its bundles and manifest, under `out/keys/key`
    (replacing what an earlier export left there). Raises ExportError when none verifies."""
    problems: list[str] = []
    target = out / KEYS_DIR / key
    staging = out / KEYS_DIR / f".{key}.exporting-{os.getpid()}"
    try:
        numbers = store.generation_numbers()
    except (StoreError, OSError) as exc:
        raise ExportError(f"{key}: the {store.kind} store {store.location} cannot be listed: {exc}") from exc
    for number in reversed(numbers):
        shutil.rmtree(staging, ignore_errors=True)
        (staging / STAGED_DIR / BUNDLES).mkdir(parents=True)
        (staging / STAGED_DIR / GENERATIONS).mkdir()
        try:
            index = store.read(f"{GENERATIONS}/{gen_name(number)}")
            gen = Generation.from_json(json.loads(index))
            bundle_bytes = _copy_verified(store, gen, staging / STAGED_DIR / BUNDLES)
        except FileNotFoundError:
            continue
        except StoreUnavailable as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ExportError(f"{key}: the {store.kind} store {store.location} is unavailable: {exc}") from exc
        except (StoreError, OSError, ValueError) as exc:
            problems.append(f"generation {number}: {exc}")
            log.warning("export", "%s: generation %d skipped: %s", key, number, exc)
            continue
        (staging / STAGED_DIR / GENERATIONS / gen_name(number)).write_bytes(index)  # byte for byte
        manifest = {"key": key, "factors": dict(factors)}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        return ExportedKey(
            key, store.kind, store.location, number, len(gen.files), gen.bytes, bundle_bytes, tuple(problems)
        )
    shutil.rmtree(staging, ignore_errors=True)
    why = "; ".join(problems) or "it has no generation"
    raise ExportError(f"{key}: nothing to export from the {store.kind} store {store.location}: {why}")


# --------------------------------------------------------------------------- the export


@dataclass(frozen=True)
class ExportResult:
    path: Path
    keys: tuple[ExportedKey, ...]
    problems: tuple[str, ...] = field(default=())

    @property
    def bundle_bytes(self) -> int:
        return sum(k.bundle_bytes for k in self.keys)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "keys": [k.to_json() for k in self.keys],
            "bundle_bytes": self.bundle_bytes,
            "problems": list(self.problems),
        }


def export(chosen: Mapping[str, StoredKey], open_store: Callable[[StoredKey], BundleStore], out: Path) -> ExportResult:
    """Export each chosen key into `out`: a folder (created, or an earlier export that keys are added
    to), or a `.tar` file of that folder. Raises ExportError if a key could not be exported."""
    as_tar = out.suffix == ".tar"
    folder = out.with_name(f".{out.name}.exporting-{os.getpid()}") if as_tar else out
    if not as_tar and out.exists() and _foreign(out):
        raise ExportError(f"{out} exists and holds something else than an export: choose another path")
    (folder / KEYS_DIR).mkdir(parents=True, exist_ok=True)
    done: list[ExportedKey] = []
    try:
        for name, where in sorted(chosen.items()):
            exported = export_key(open_store(where), name, where.factors, folder)
            log.info(
                "export",
                "%s: generation %d, %d files (%.1f MB in bundles) from the %s store %s",
                name,
                exported.generation,
                exported.files,
                exported.bundle_bytes / 1e6,
                exported.tier,
                exported.location,
            )
            done.append(exported)
        record = _read_record(folder)
        record["format"] = EXPORT_FORMAT
        record["keys"] = {**record.get("keys", {}), **{k.key: {**k.to_json(), "exported": now_iso()} for k in done}}
        (folder / EXPORT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        if as_tar:
            write_tar(folder, out)
    finally:
        if as_tar:
            shutil.rmtree(folder, ignore_errors=True)
    return ExportResult(out, tuple(done))


def _foreign(folder: Path) -> list[str]:
    """What in `folder` no export wrote: an export adds keys to an earlier one, or fills the repo's
    image-caches/ (its README stays), and never mixes with anything else."""
    own = {KEYS_DIR, EXPORT_FILE, "README.md"}
    return [e.name for e in folder.iterdir() if e.name not in own and not e.name.startswith(".")]


def _read_record(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / EXPORT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_tar(folder: Path, out: Path) -> None:
    """The folder as a plain tar whose members start at its top (`keys/...`, `export.json`): the
    Dockerfile's ADD unpacks it into the image's caches. Bundles are zstd already: no compression."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(folder.rglob("*")):
                tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- where keys are


def stored_keys(keys_dir: Path | None, s3: Any | None) -> list[StoredKey]:
    """Every key with recorded factors on the volume (`keys_dir`) and in the S3 store (`s3`: any key's
    store under the URL), the volume's first."""
    from .siblings import s3_siblings, volume_siblings

    found = [
        StoredKey(s.key, s.factors, "volume", s.last_used)
        for s in (volume_siblings(keys_dir, "") if keys_dir is not None else [])
        if s.generations > 0
    ]
    if s3 is not None:
        found += [StoredKey(s.key, s.factors, "s3", s.last_used) for s in s3_siblings(s3, "", "") if s.generations > 0]
    return found


def store_opener(keys_dir: Path | None, s3: Any | None) -> Callable[[StoredKey], BundleStore]:
    """How to open a key's store where `stored_keys` found it."""
    from .siblings import sibling_store
    from .volume import StagedStore

    def open_store(where: StoredKey) -> BundleStore:
        if where.tier == "volume" and keys_dir is not None:
            return StagedStore(keys_dir / where.name / STAGED_DIR)
        if where.tier == "s3" and s3 is not None:
            return sibling_store(s3, where.name)
        raise ExportError(f"no {where.tier} store to read {where.name} from")

    return open_store
