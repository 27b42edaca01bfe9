"""`warmstart fetch --to s3://BUCKET/PREFIX`: a pinned Hub snapshot copied as real files, with a manifest.

The HF cache's snapshot is a folder of links into `blobs/`; S3 has no links, so each file is
uploaded as the bytes it points to. Each file's SHA-256 is computed on the way and, where the blob
is named by one (the Hub names an LFS file's blob by its SHA-256, its ETag), checked against it: a
corrupt cache is refused, not published. `warmstart-model.json` (s3model.MANIFEST) records each
file's size, SHA-256 and the store's ETag; it is removed first and written last, so a reader never
sees a manifest that vouches for files still being replaced, and objects of an older upload that
the snapshot lacks are deleted before it (a boot would refuse a listing the manifest disagrees with).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ModelError
from .model import ResolvedModel
from .s3model import MANIFEST, MANIFEST_FORMAT
from .s3url import S3Url, parse_s3_url

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
PART_BYTES = 256 * 1024 * 1024  # Runpod's volume S3 API takes parts up to 500 MB
CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Uploaded:
    url: str
    files: int
    bytes: int
    seconds: float
    removed: tuple[str, ...]  # older objects under the prefix the snapshot lacks

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "files": self.files,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "removed": list(self.removed),
        }


def snapshot_files(snapshot: Path) -> list[tuple[str, Path]]:
    """(name, real file) for each file of the snapshot, links resolved; the manifest's name is refused."""
    files = []
    for entry in sorted(snapshot.rglob("*")):
        if entry.is_file():  # follows the link into blobs/
            name = entry.relative_to(snapshot).as_posix()
            if name == MANIFEST:
                raise ModelError(f"{snapshot}: holds a file named {MANIFEST}, the name warmstart's manifest takes")
            files.append((name, entry.resolve()))
    return files


def file_sha256(name: str, path: Path) -> str:
    """The file's SHA-256, checked against its blob's name where the Hub named it by one."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    sha = digest.hexdigest()
    if _SHA256.match(path.name) and path.parent.name == "blobs" and sha != path.name:
        raise ModelError(f"{name}: its blob {path.name[:12]}... hashes to {sha[:12]}...: the HF cache is corrupt")
    return sha


def upload_snapshot(client: Any, url: S3Url, snapshot: Path, source: dict[str, Any]) -> Uploaded:
    """Copy `snapshot` under `url` as real files, then the manifest. Raises ModelError."""
    from boto3.s3.transfer import TransferConfig

    from .store.bundle import StoreError, StoreUnavailable
    from .store.s3client import call

    start = time.monotonic()
    files = snapshot_files(snapshot)
    entries: dict[str, dict[str, Any]] = {}
    config = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=4)
    try:
        call(client, url.bucket, "delete_object", url=url.url, Key=url.key(MANIFEST))
        before = _listed(client, url)
        for name, path in files:
            sha = file_sha256(name, path)
            try:
                client.upload_file(str(path), url.bucket, url.key(name), Config=config)
            except Exception as exc:  # boto3's S3UploadFailedError wraps the ClientError
                raise StoreUnavailable(f"uploading {name} failed: {exc}") from exc
            head = call(client, url.bucket, "head_object", url=url.url, Key=url.key(name))
            entries[name] = {"size": path.stat().st_size, "sha256": sha, "etag": head["ETag"].strip('"')}
        removed = tuple(sorted(set(before) - set(entries)))
        for name in removed:
            call(client, url.bucket, "delete_object", url=url.url, Key=url.key(name))
        manifest = {"format": MANIFEST_FORMAT, "source": source, "files": entries}
        body = json.dumps(manifest, indent=1, sort_keys=True).encode()
        call(client, url.bucket, "put_object", url=url.url, Key=url.key(MANIFEST), Body=body)
    except (StoreUnavailable, StoreError, FileNotFoundError) as exc:
        raise ModelError(f"--to {url.url}: {exc}") from exc
    size = sum(e["size"] for e in entries.values())
    return Uploaded(url.url, len(entries), size, time.monotonic() - start, removed)


def _listed(client: Any, url: S3Url) -> list[str]:
    from .store.s3client import call

    base = f"{url.prefix}/" if url.prefix else ""
    names, token = [], None
    while True:
        page = call(
            client,
            url.bucket,
            "list_objects_v2",
            url=url.url,
            Prefix=base,
            **({"ContinuationToken": token} if token else {}),
        )
        names += [n for o in page.get("Contents", []) if (n := o["Key"][len(base) :]) and n != MANIFEST]
        if not page.get("IsTruncated"):
            return names
        token = page.get("NextContinuationToken")


def upload_model(model: ResolvedModel, to: str, endpoint_url: str | None, region: str | None) -> dict[str, Any]:
    """`warmstart fetch --to URL`: the snapshot `model` was pinned to, copied under URL (JSON for its output)."""
    from .store.s3client import make_client

    try:
        url = parse_s3_url(to)
    except ValueError as exc:
        raise ModelError(f"--to {to!r}: {exc}") from exc
    if not url.prefix:
        raise ModelError(f"--to {to!r}: name the model's prefix, s3://BUCKET/PREFIX")
    if model.repo_id is None:
        raise ModelError(f"--to {to!r}: MODEL_NAME must be a Hub repo id (its pinned snapshot is copied)")
    source = {"repo_id": model.repo_id, "revision": model.revision}
    return upload_snapshot(make_client(endpoint_url, region), url, model.path, source).to_json()
