"""Models in S3-compatible storage: `MODEL_NAME=s3://BUCKET/PREFIX`, listed once, pinned, read to local disk.

A worker with no volume would otherwise download the checkpoint from the Hub on every cold start.
Here the prefix is listed once (ListObjectsV2: names, sizes, ETags); that listing *is* the revision
(`s3-<hash>`), so a changed weight object is a new revision and a new cache key, at the cost of one
listing and no read. The objects are then read with parallel ranged GETs, each pinned to the
listed ETag (`If-Match`: an object replaced mid-read fails instead of mixing two versions), into a
private folder that is renamed into place only when every file is whole (and, where the prefix
carries `warmstart fetch --to`'s manifest, matches its SHA-256). A failure leaves nothing half-written
and is a configuration error (exit 2) before vLLM starts: never a half-loaded model.

vLLM reads such a prefix itself with `--load-format runai_streamer` (vllm/config/model.py
`maybe_pull_model_tokenizer_for_runai`: `ObjectStorageModel(url=model)` pulls `*.json`, `*.model`,
`*.py` into `get_cache_dir()/model_streamer/<sha256(url)[:8]>` and streams the safetensors); the
streamer (runai-model-streamer 0.17.1, libstreamers3.so) reads `AWS_ENDPOINT_URL`,
`RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING`, `AWS_EC2_METADATA_DISABLED`, `AWS_REGION` and the
standard credential variables: `streamer_env` maps warmstart's S3 settings onto those names.

Which read a boot uses is the user's: the staged read by default; vLLM's streamer when LOAD_FORMAT (or
`--load-format` in VLLM_EXTRA_ARGS or the config file) is one of STREAMER_FORMATS, as worker-vllm users
write it. The listing, the revision, the key and the manifest's check are the same either way; the
streamer's read has no local copy, no SHA-256 check and gives vLLM the S3 credentials
(docs/deploying.md says when each is the better choice).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import log
from .errors import ModelError
from .model import ResolvedModel
from .s3url import S3Url, parse_s3_url

MANIFEST = "warmstart-model.json"  # written last by `warmstart fetch --to`; never part of the revision
MANIFEST_FORMAT = 1
WEIGHT_SUFFIXES = (".safetensors",)
CONFIG_FILES = ("config.json", "params.json")
PART_BYTES = 16 * 1024 * 1024  # one ranged GET: large enough for throughput, small enough to retry
READ_WORKERS = 16
# The load formats with which vLLM reads an s3:// model itself (vllm/model_executor/model_loader/__init__.py:
# "runai_streamer" -> RunaiModelStreamerLoader, "runai_streamer_sharded" -> ShardedStateLoader); with any
# other, vLLM pulls the config files (config/model.py maybe_pull_model_tokenizer_for_runai) and then cannot
# load weights from the URL, so warmstart reads them to local disk instead.
STREAMER_FORMATS = ("runai_streamer", "runai_streamer_sharded")
# What the streamer's S3 client authenticates with (the AWS SDK's default chain). Withheld from vLLM
# like every credential (engine/process.py reaches_vllm), passed only when vLLM itself reads the store.
STREAMER_CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_DEFAULT_REGION",
    "AWS_CA_BUNDLE",
)


@dataclass(frozen=True)
class S3Object:
    name: str  # relative to the prefix, '/'-separated
    size: int
    etag: str  # as the store lists it, quotes stripped


@dataclass(frozen=True)
class S3Listing:
    """One listing of a model's prefix: the objects a boot reads, and the manifest if there is one."""

    url: S3Url
    objects: tuple[S3Object, ...]
    has_manifest: bool = False

    @property
    def revision(self) -> str:
        """`s3-<hash>` of every object's name, size and ETag: a changed object is a new revision."""
        digest = hashlib.sha256()
        for obj in self.objects:
            digest.update(f"{obj.name}\0{obj.size}\0{obj.etag}\n".encode())
        return "s3-" + digest.hexdigest()[:12]

    @property
    def bytes(self) -> int:
        return sum(o.size for o in self.objects)


@dataclass(frozen=True)
class ReadStats:
    files: int
    bytes: int
    seconds: float
    reused: bool  # the revision was already whole on local disk: nothing was read

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def _etag(raw: str | None) -> str:
    return (raw or "").strip('"')


def list_model(client: Any, url: S3Url) -> S3Listing:
    """List the prefix once (paginated). Raises ModelError for an empty or unreachable prefix."""
    from .store.bundle import StoreError, StoreUnavailable
    from .store.s3client import call

    base = f"{url.prefix}/" if url.prefix else ""
    objects: list[S3Object] = []
    manifest = False
    token: str | None = None
    try:
        while True:
            page = call(
                client,
                url.bucket,
                "list_objects_v2",
                url=url.url,
                Prefix=base,
                **({"ContinuationToken": token} if token else {}),
            )
            for item in page.get("Contents", []):
                name = item["Key"][len(base) :]
                if not name or name.endswith("/"):
                    continue  # "folder" markers some stores (and consoles) create
                if name == MANIFEST:
                    manifest = True
                    continue
                objects.append(S3Object(name, int(item["Size"]), _etag(item.get("ETag"))))
            if not page.get("IsTruncated"):
                break
            token = page.get("NextContinuationToken")
    except (StoreUnavailable, StoreError) as exc:
        raise ModelError(f"MODEL_NAME={url.url}: the weights' store is unreachable: {exc}") from exc
    except FileNotFoundError as exc:
        raise ModelError(f"MODEL_NAME={url.url}: no such bucket or prefix") from exc
    return S3Listing(url, tuple(sorted(objects, key=lambda o: o.name)), manifest)


def read_manifest(client: Any, url: S3Url) -> dict[str, Any]:
    """The manifest `warmstart fetch --to` wrote beside the files. Raises ModelError if unreadable."""
    from .store.bundle import StoreError, StoreUnavailable
    from .store.s3client import call

    try:
        data = call(client, url.bucket, "get_object", url=url.url, read=True, Key=url.key(MANIFEST))["Data"]
        manifest = json.loads(data)
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("files"), dict):
            raise ValueError(f"not a format-{MANIFEST_FORMAT} manifest")
        return manifest
    except (StoreUnavailable, StoreError, FileNotFoundError, ValueError) as exc:
        raise ModelError(f"MODEL_NAME={url.url}: {MANIFEST} is unreadable: {exc}") from exc


def listing_problems(listing: S3Listing, manifest: Mapping[str, Any] | None) -> list[str]:
    """What makes this listing unservable: no config, no safetensors, or a manifest it disagrees with."""
    names = {o.name: o for o in listing.objects}
    problems: list[str] = []
    if not any(n in names for n in CONFIG_FILES):
        problems.append("no config.json")
    if not any(n.endswith(WEIGHT_SUFFIXES) for n in names):
        problems.append("no *.safetensors (the streamer and warmstart read safetensors only)")
    if manifest is not None:
        files: Mapping[str, Any] = manifest["files"]
        for name in sorted(set(files) | set(names)):
            want, got = files.get(name), names.get(name)
            if want is None:
                problems.append(f"{name} is listed but not in {MANIFEST}")
            elif got is None:
                problems.append(f"{name} is in {MANIFEST} but not listed")
            elif int(want["size"]) != got.size:
                problems.append(f"{name}: {got.size} bytes listed, {want['size']} in {MANIFEST}")
            elif want.get("etag") and _etag(want["etag"]) != got.etag:
                problems.append(f"{name}: ETag {got.etag} listed, {_etag(want['etag'])} in {MANIFEST}")
    return problems


def model_dir(local_cache: Path, url: S3Url) -> Path:
    """Where a prefix's revisions are read to: one stable folder per prefix, a subfolder per revision."""
    slug = "--".join(p for p in (url.bucket, *url.prefix.split("/")) if p)
    return local_cache / "models" / f"s3--{slug}"


def read_model(
    client: Any,
    listing: S3Listing,
    dest: Path,
    manifest: Mapping[str, Any] | None = None,
    *,
    workers: int = READ_WORKERS,
    part_bytes: int = PART_BYTES,
) -> ReadStats:
    """Read every listed object into `dest` with ranged GETs, `workers` at a time, whole or not at all.

    The ranges of every file form one queue, so the GETs of the next file are under way while this
    one's last bytes are written and hashed (writing and hashing a 275 MB shard take 0.84 s on the 2-core
    machine: per file, time the link stood idle). Each GET carries `If-Match` with the listed ETag. With a
    manifest, each file's SHA-256 is checked as its bytes go by (ranges come back in order). The
    files land in a private `.partial` folder renamed to `dest` at the end; on any failure it is removed.
    """
    from .store.bundle import StoreError, StoreUnavailable
    from .store.s3client import in_order

    if dest.is_dir():
        return ReadStats(len(listing.objects), 0, 0.0, True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.partial-*"):  # a killed boot's leftovers
        shutil.rmtree(stale, ignore_errors=True)
    partial = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    start = time.monotonic()
    files = manifest["files"] if manifest is not None else {}
    readers = {obj.name: _range_reader(client, listing.url, obj) for obj in listing.objects}
    spans = {
        obj.name: [(a, min(a + part_bytes, obj.size) - 1) for a in range(0, obj.size, part_bytes)]
        for obj in listing.objects
    }
    queue = [(obj.name, span) for obj in listing.objects for span in spans[obj.name]]
    parts = in_order(lambda item: readers[item[0]](item[1]), queue, workers) if queue else iter(())
    try:
        for obj in listing.objects:
            target = partial / obj.name
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            with open(target, "wb") as out:
                for _ in spans[obj.name]:
                    data = next(parts)
                    out.write(data)
                    digest.update(data)
            want = (files.get(obj.name) or {}).get("sha256")
            if want and digest.hexdigest() != want:
                raise ModelError(
                    f"MODEL_NAME={listing.url.url}: {obj.name} read with SHA-256 {digest.hexdigest()[:12]}..., "
                    f"{MANIFEST} says {want[:12]}...: the object is not what was uploaded"
                )
        os.replace(partial, dest)
    except FileNotFoundError as exc:
        raise ModelError(
            f"MODEL_NAME={listing.url.url}: {exc.args[0] if exc.args else 'an object'} vanished while it was read"
        ) from exc
    except (StoreUnavailable, StoreError) as exc:
        raise ModelError(f"MODEL_NAME={listing.url.url}: reading the weights failed: {exc}") from exc
    finally:
        close = getattr(parts, "close", None)
        if close is not None:
            close()  # cancels the GETs still queued and waits for those under way
        shutil.rmtree(partial, ignore_errors=True)
    return ReadStats(len(listing.objects), listing.bytes, time.monotonic() - start, False)


def _range_reader(client: Any, url: S3Url, obj: S3Object) -> Callable[[tuple[int, int]], bytes]:
    from .store.bundle import StoreError
    from .store.s3client import call, precondition_failed

    def fetch(span: tuple[int, int]) -> bytes:
        kwargs: dict[str, Any] = {"Key": url.key(obj.name), "Range": f"bytes={span[0]}-{span[1]}"}
        if obj.etag:
            kwargs["IfMatch"] = f'"{obj.etag}"'
        try:
            data = call(client, url.bucket, "get_object", url=url.url, read=True, **kwargs)["Data"]
        except StoreError as exc:
            if precondition_failed(exc):
                raise ModelError(
                    f"MODEL_NAME={url.url}: {obj.name} changed while it was read (its ETag is no longer {obj.etag})"
                ) from exc
            raise
        if len(data) != span[1] - span[0] + 1:
            raise StoreError(f"{obj.name}: {len(data)} bytes for the range {span[0]}-{span[1]}")
        return data

    return fetch


def streamer_env(endpoint_url: str | None, region: str | None) -> dict[str, str]:
    """The variables Run:ai's streamer reads for warmstart's S3 settings (credentials stay the AWS_* ones).

    An S3-compatible endpoint (Runpod's volume S3 API, MinIO) is addressed by path: the streamer's
    default is virtual-host addressing (`bucket.host`), which such endpoints do not serve.
    """
    env = {"AWS_EC2_METADATA_DISABLED": "true"}  # runai_model_streamer/s3_utils: its default too
    if endpoint_url:
        env["AWS_ENDPOINT_URL"] = endpoint_url
        env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] = "0"
    if region:
        env["AWS_REGION"] = region
    return env


def streams(load_format: str | None) -> bool:
    """Does vLLM read an s3:// model itself with this `--load-format`?"""
    return (load_format or "").lower() in STREAMER_FORMATS


def streamer_dir(url: str, environ: Mapping[str, str]) -> Path:
    """Where vLLM puts an s3:// model's config and tokenizer files in the environment it runs with:
    `VLLM_ASSETS_CACHE/model_streamer/<sha256(url)[:8]>` (transformers_utils/runai_utils.py
    ObjectStorageModel; envs.py: VLLM_ASSETS_CACHE defaults to `$XDG_CACHE_HOME or ~/.cache` + vllm/assets).
    It becomes vLLM's model path, which vLLM hashes: stable for one URL and one home."""
    assets = environ.get("VLLM_ASSETS_CACHE")
    if not assets:
        home = environ.get("HOME") or str(Path.home())
        assets = os.path.join(environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "vllm", "assets")
    return Path(os.path.expanduser(assets)) / "model_streamer" / hashlib.sha256(url.encode()).hexdigest()[:8]


def streamer_credentials(environ: Mapping[str, str]) -> dict[str, str]:
    """The credential variables vLLM gets when its streamer reads the model (STREAMER_CREDENTIALS that are set)."""
    return {name: environ[name] for name in STREAMER_CREDENTIALS if environ.get(name)}


def parse_model_url(name: str) -> S3Url:
    try:
        return parse_s3_url(name)
    except ValueError as exc:
        raise ModelError(f"MODEL_NAME={name!r}: {exc}") from exc


@dataclass(frozen=True)
class S3Read:
    """A planned read of a listed model into `dest`: run while the boot restores its caches, joined
    before vLLM starts (boot.py)."""

    client: Any = field(repr=False)
    listing: S3Listing
    manifest: Mapping[str, Any] | None
    dest: Path

    def run(self) -> ReadStats:
        stats = read_model(self.client, self.listing, self.dest, self.manifest)
        log_read(self.listing.url, self.listing, stats)
        return stats


class BackgroundRead:
    """An S3Read on a thread of its own: started as the boot begins, joined before vLLM starts."""

    def __init__(self, read: S3Read) -> None:
        self._stats: ReadStats | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(read,), name="s3-weights", daemon=True)

    @classmethod
    def start(cls, read: S3Read) -> BackgroundRead:
        self = cls(read)
        self._thread.start()
        return self

    def _run(self, read: S3Read) -> None:
        try:
            self._stats = read.run()
        except BaseException as exc:  # raised in the joining thread
            self._error = exc

    def join(self) -> ReadStats:
        """The read's figures, or its error raised here. Each request is bounded (s3client's timeouts
        and retries), so this ends."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._stats is not None
        return self._stats


def plan_s3(
    name: str,
    local_cache: Path,
    *,
    endpoint_url: str | None,
    region: str | None,
    client: Any = None,
    streamed_to: Path | None = None,
) -> tuple[ResolvedModel, S3Read | None]:
    """List `name` once and check it (against its manifest where there is one): the model pinned to
    the listing's revision, and the read still to run. Raises ModelError (exit 2) before vLLM starts.
    `streamed_to` (vLLM's streamer reads the weights, `streamer_dir`): no read; the model's path is
    where vLLM puts its config files."""
    start = time.monotonic()
    url = parse_model_url(name)
    if client is None:
        from .store.s3client import make_client

        client = make_client(endpoint_url, region)
    listing = list_model(client, url)
    manifest = read_manifest(client, url) if listing.has_manifest else None
    if problems := listing_problems(listing, manifest):
        what = f"the listing and {MANIFEST} disagree" if manifest is not None else "not a model"
        raise ModelError(f"MODEL_NAME={url.url}: {what}: " + "; ".join(problems[:5]))
    dest = streamed_to or model_dir(local_cache, url) / listing.revision
    model = ResolvedModel(
        name,
        None,
        listing.revision,
        dest,
        "s3",
        len(listing.objects),
        listing.bytes,
        # The streamer reads every byte from the store on every boot; the staged read only once per disk.
        downloaded_bytes=listing.bytes if streamed_to is not None or not dest.is_dir() else 0,
        seconds=time.monotonic() - start,
    )
    return model, (S3Read(client, listing, manifest, dest) if streamed_to is None else None)


def resolve_s3(
    name: str, local_cache: Path, *, endpoint_url: str | None, region: str | None, client: Any = None
) -> ResolvedModel:
    """`plan_s3`, then the read at once (`warmstart fetch`, the tests): the model whole on local disk."""
    model, read = plan_s3(name, local_cache, endpoint_url=endpoint_url, region=region, client=client)
    assert read is not None
    stats = read.run()
    return replace(model, downloaded_bytes=stats.bytes, seconds=model.seconds + stats.seconds)


def log_read(url: S3Url, listing: S3Listing, stats: ReadStats) -> None:
    if stats.reused:
        log.info("model", "%s @ %s: already on local disk", url.url, listing.revision)
    else:
        log.info(
            "model",
            "%s @ %s: read %d files, %.1f MB in %.2f s (%.0f MB/s)",
            url.url,
            listing.revision,
            stats.files,
            stats.bytes / 1e6,
            stats.seconds,
            stats.mb_per_s,
        )
