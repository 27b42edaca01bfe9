"""The image's commands: `warmstart export` (keys' caches out of the volume or S3, to bake into an image) and
what `warmstart ls` shows of the caches an image carries (store/export.py, store/image.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import log

if TYPE_CHECKING:  # the CLI's parser imports this module: what a command needs, it imports when it runs
    from .settings import Settings
    from .store.export import StoredKey, Wanted


def add_image_parsers(
    sub: Any, with_volume: Callable[[argparse.ArgumentParser], argparse.ArgumentParser], *, ls: argparse.ArgumentParser
) -> None:
    """`warmstart export`'s arguments, and `warmstart ls --image` (cli.build_parser)."""
    ls.add_argument("--image", metavar="DIR", help="caches baked into an image (default: $WARMSTART_IMAGE_CACHES)")
    p = with_volume(
        sub.add_parser("export", help="keys' newest verified caches out of the volume or S3, to bake into an image")
    )
    p.add_argument("out", metavar="OUT", help="a folder (new, or an earlier export to add to) or a .tar file")
    p.add_argument("--key", action="append", metavar="KEY", help="a key directory name (repeatable)")
    p.add_argument(
        "--gpu",
        action="append",
        metavar="NAME",
        help="instead of --key: the key this environment (MODEL_NAME, flags) boots on this GPU, e.g. H100 or "
        "'RTX 5090', or cpu (repeatable: an endpoint that allows several GPU types)",
    )
    p.add_argument(
        "--from",
        dest="source",
        choices=("volume", "s3"),
        help="where to read (default: the volume, then WARMSTART_S3_URL's store)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_export)


def size_words(n: float) -> str:
    """Bytes for people, as `warmstart ls`, `gc` and `export` write them."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def image_caches(args: argparse.Namespace) -> Path | None:
    """The image's baked caches: --image, else $WARMSTART_IMAGE_CACHES (set in the image); None if absent."""
    from .settings import read_one

    raw = getattr(args, "image", None) or read_one(args.environ, "WARMSTART_IMAGE_CACHES")
    return Path(raw) if raw and Path(raw).exists() else None  # a folder, or an export's .tar (read as it is)


def image_block(caches: Path | None) -> dict[str, Any] | None:
    """What `warmstart ls --json` says of the image's caches (None: the image carries none)."""
    from .store.image import scan_image

    if caches is None:
        return None
    keys, warnings = scan_image(caches)
    return {
        "path": str(caches),
        "keys": [k.to_json() for k in keys],
        "bundle_bytes": sum(k.bundle_bytes for k in keys),
        "warnings": list(warnings),
    }


def print_image(image: dict[str, Any] | None) -> None:
    """`warmstart ls`'s lines on the image's caches (none where it carries none)."""
    if image is None:
        return
    print(f"Baked into the image at {image['path']} (read-only; {size_words(image['bundle_bytes'])}):")
    for k in image["keys"]:
        print(f"  {k['key']}")
        print(
            f"      {k['model']}@{(k['revision'] or '?')[:12]}  {k['hardware']}  vLLM {k['vllm']}  "
            f"generation {k['generation']}, {k['files']} files ({size_words(k['bytes'])}), "
            f"bundles {size_words(k['bundle_bytes'])}"
        )
    for w in image["warnings"]:
        print(f"warning: {w}")


def ls_image_only(args: argparse.Namespace) -> dict[str, Any] | bool | None:
    """What the image carries, for `warmstart ls` (None: nothing); True when that is all there is to list,
    and listed already: in an image started without a volume."""
    image = image_block(image_caches(args))
    if image is None or args.volume or volume_root(args).is_dir():
        return image
    if args.json:
        print(json.dumps({"volume": None, "image": image}, indent=2))
    else:
        print_image(image)
    return True


def cmd_export(args: argparse.Namespace) -> int:
    """Write keys' newest verified generations out of the volume or S3, for an image (store/export.py)."""
    from .settings import SettingsError, from_env
    from .store.export import ExportError, choose_keys, export, store_opener, stored_keys

    if not args.key and not args.gpu:
        raise SettingsError(["name the keys (--key KEY) or the GPUs the caches are for (--gpu NAME, or --gpu cpu)"])
    # --key names the keys itself: the model is not needed then, but Settings demands one.
    env = args.environ if not args.key or args.environ.get("MODEL_NAME") else {**args.environ, "MODEL_NAME": "by/key"}
    settings = from_env(env, volume=args.volume)
    root = settings.volume
    keys_dir = root / "warmstart" / "keys" if args.source != "s3" and root.is_dir() else None
    s3 = None
    if args.source != "volume" and settings.s3_url:
        from .store.s3 import open_store

        spool = settings.local_cache_dir / "spool"
        s3 = open_store(settings.s3_url, settings.s3_endpoint_url, settings.s3_region, "-", spool_dir=spool)
    if keys_dir is None and s3 is None:
        where = {"s3": "WARMSTART_S3_URL is not set", "volume": f"no volume at {root}"}.get(args.source, "")
        raise SettingsError([where or f"no volume at {root} and no WARMSTART_S3_URL: nothing to export from"])
    wanted = None if args.key else wanted_from(settings)
    stored = stored_keys(keys_dir, s3)
    chosen, missing = choose_keys(stored, names=args.key or (), wanted=wanted, gpus=args.gpu or ())
    if missing:
        near = [near_keys(stored, wanted, gpu) for gpu in args.gpu or () if wanted is not None]
        raise SettingsError([f"{m}: nothing exported" for m in missing] + [line for lines in near for line in lines])
    try:
        result = export(chosen, store_opener(keys_dir, s3), Path(args.out))
    except ExportError as exc:
        log.error("export", "%s", exc)
        return 2  # cli.EXIT_CONFIG
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(f"exported {len(result.keys)} key(s) to {result.path}: {size_words(result.bundle_bytes)} of bundles")
    return 0


def near_keys(stored: Iterable[StoredKey], wanted: Wanted, gpu: str, limit: int = 3) -> list[str]:
    """For a `--gpu` that matched no key: the nearest stored keys and what differs from this
    environment's (as `warmstart explain` says it), fewest differences first; [] when one matches."""
    from .explain import describe_differences, factor_differences
    from .store.export import gpu_matches, matches

    if any(matches(k.factors, wanted, gpu) is not None for k in stored):
        return []
    scored = []
    for k in stored:
        hardware = k.factors.get("hardware") if isinstance(k.factors.get("hardware"), dict) else {}
        theirs = {"model": k.factors.get("model"), "args": k.factors.get("args") or {}}
        own = {"model": wanted.model, "args": dict(wanted.args)}
        if wanted.revision:
            theirs["revision"], own["revision"] = k.factors.get("revision"), wanted.revision
        # A key of the same kind with more vLLM variables matches (the image sets some): only those it lacks differ.
        mine = dict(wanted.vllm_env(str(hardware.get("kind"))))
        recorded = dict(k.factors.get("vllm_env") or {})
        theirs["vllm_env"] = {n: recorded.get(n) for n in mine}
        own["vllm_env"] = mine
        differs = factor_differences(theirs, own)
        if not gpu_matches(hardware, gpu):
            differs = {"GPU": [hardware.get("name") or hardware.get("kind"), gpu], **differs}
        scored.append((len(differs), k.last_used, k.name, k.tier, differs))
    scored.sort(key=lambda s: s[1], reverse=True)
    scored.sort(key=lambda s: s[0])  # stable: among equals, the most recently used first
    if not scored:
        return [f"--gpu {gpu}: the store(s) hold no key at all"]
    return [
        f"--gpu {gpu}: nearest key {name} ({tier}): {describe_differences(differs)}"
        for _, _, name, tier, differs in scored[:limit]
    ]


def wanted_from(settings: Settings) -> Wanted:
    """What a boot of these settings would key, less the hardware and vLLM builds the export cannot probe:
    the vLLM variables warmstart derives per hardware kind (plan.derive_engine_env) come from the kind
    each stored key records; the concurrency fit is the plan's (it reads the settings only)."""
    from .engine.concurrency import fit_concurrency
    from .hardware import Hardware
    from .key import key_args, key_vllm_env
    from .plan import derive_engine_env
    from .store.export import Wanted

    def vllm_env(kind: str) -> dict[str, str]:
        return key_vllm_env({**dict(settings.vllm_env), **derive_engine_env(Hardware(kind, "", "", 1), settings)})

    return Wanted(settings.model_name, settings.model_revision, key_args(settings, fit_concurrency(settings)), vllm_env)


def volume_root(args: argparse.Namespace) -> Path:
    """The volume `warmstart ls` would list: --volume, $RUNPOD_VOLUME_PATH or $BASE_PATH (cli._layout's order)."""
    from .settings import volume_root as root

    return root(args.environ, args.volume)
