"""The S3 tier: a key's staged store under an S3 prefix, shared by every datacenter.

A network volume lives in one datacenter; an S3-compatible store (AWS, R2, or Runpod's
own S3 API in front of another datacenter's volume) is reachable from all of them. It
holds the same names as the volume's staged folder, under `<prefix>/keys/<key>/staged/`,
so the layout stays readable and, on Runpod, `s3://VOLUME_ID/warmstart` *is* that volume's
`/runpod-volume/warmstart`.

How the store's limits shape this (Runpod's S3 API: PUT below 500 MB, parts up to 500 MB,
no DeleteObjects, no presigned URLs, listing slow beyond 10k objects):
- a bundle is one object: a single PUT up to `multipart_threshold`, else a multipart upload
  in `part_size` parts, uploaded in parallel from a local spool file; a failed upload is
  aborted, one left by a killed worker is aborted by the garbage collector after the TTL;
- few objects per key (bundles, two generations, reader registrations, the lease), removed
  one DeleteObject at a time;
- a restore fetches each bundle with parallel ranged GETs, yielded in order to the same
  hashing tar reader the volume uses: the SHA-256 in the generation is checked on restore;
- generations are never overwritten. Where the store honours `If-None-Match: *` on PUT
  (AWS since 2024, R2, MinIO, moto), a generation and the lease are created with it; the
  store is probed once (a second conditional PUT of an existing probe object must fail
  with 412). Where it does not, the lease is taken by write-then-read-back after a settle
  delay, and a generation is written only under the lease and read back. Runpod's S3 API
  documents neither conditional header (its compatibility table lists PutObject without
  them), so on Runpod the probe decides, and the lease path is the one to expect.

boto3 is the client (`store.s3client`: its timeouts, retries and what its failures mean).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from .. import log
from ..s3url import S3Url, parse_s3_url
from .backend import GENERATIONS, LEASE, BundleStore, BundleWriter, Compression, Lease, lease_expired, lease_payload
from .bundle import CHUNK, BundleRef, StoreError, StoreUnavailable, bundle_name, gen_name
from .s3client import (
    GET_WORKERS,
    PUT_WORKERS,
    call,
    content_md5,
    in_order,
    make_client,
    precondition_failed,
)

MIB = 1024 * 1024
PART_SIZE = 64 * MIB  # Runpod: parts up to 500 MB; AWS: at least 5 MiB
MULTIPART_THRESHOLD = 256 * MIB  # Runpod: a single PUT must stay below 500 MB
RANGE_SIZE = 8 * MIB
LEASE_SETTLE_S = 1.0  # read-after-write lease: how long a writer waits before reading back
PROBE = ".warmstart-conditional-probe"


class S3Store(BundleStore):
    """One key's staged store under `<url>/keys/<key>/staged/`."""

    kind = "s3"  # a Tier

    def __init__(
        self,
        client: Any,
        url: S3Url,
        key: str,
        *,
        spool_dir: Path | None = None,
        conditional: bool | None = None,
        part_size: int = PART_SIZE,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        range_size: int = RANGE_SIZE,
        get_workers: int = GET_WORKERS,
        lease_settle_s: float = LEASE_SETTLE_S,
        compression: Compression = "zstd",
    ) -> None:
        self.client = client
        self.url = url
        self.bucket = url.bucket
        self.root = url.key(f"keys/{key}/staged")
        self.spool_dir = spool_dir
        self._conditional = conditional  # None: probe on first need
        self.part_size = part_size
        self.multipart_threshold = multipart_threshold
        self.range_size = range_size
        self.get_workers = get_workers
        self.lease_settle_s = lease_settle_s
        self.compression = compression
        self._lock = threading.Lock()
        self._offset: float | None = None  # the store's clock minus this machine's

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.root}"

    def _key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def call(self, operation: str, **kwargs: Any) -> Any:
        """One S3 request; botocore's failures become FileNotFoundError, StoreUnavailable or StoreError.
        `read=True`: the body is read as well (retried when cut), its bytes in `Data`. Each answer's
        `Date` tells how far the store's clock is from this one (`clock_offset`)."""
        response = call(self.client, self.bucket, operation, url=self.url.url, **kwargs)
        date = _store_date(response)
        if date is not None:
            self._offset = date + 0.5 - time.time()  # `Date` has whole seconds: the middle of its second
        return response

    def clock_offset(self) -> float:
        """From the latest answer's `Date` (whole seconds: good to a second, against TTLs of minutes)."""
        if self._offset is None:
            try:
                self.call("list_objects_v2", Prefix=self._key(GENERATIONS) + "/", MaxKeys=1)
            except (StoreError, FileNotFoundError):
                return 0.0
        return self._offset or 0.0

    # ------------------------------------------------------------------ BundleStore

    def create(self) -> None:
        return None  # prefixes need no folders

    def names(self, folder: str) -> dict[str, float]:
        prefix = self._key(folder) + "/"
        out: dict[str, float] = {}
        token: str | None = None
        t = time.time()
        while True:
            kwargs: dict[str, Any] = {"Prefix": prefix, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            try:
                page = self.call("list_objects_v2", **kwargs)
            except FileNotFoundError:
                return out
            for obj in page.get("Contents", []):
                name = obj["Key"][len(prefix) :]
                if name:
                    out[name] = t - obj["LastModified"].timestamp()
            if not page.get("IsTruncated"):
                return out
            following = page.get("NextContinuationToken")
            if not following or following == token:  # a broken store's page: asking again loops for ever
                raise StoreUnavailable(
                    f"{self.location}: a listing of {folder}/ says it is truncated but gives no new continuation token"
                )
            token = following

    def read(self, rel: str) -> bytes:
        return self.call("get_object", Key=self._key(rel), read=True)["Data"]

    def write(self, rel: str, data: bytes) -> None:
        self.call("put_object", Key=self._key(rel), Body=data, ContentMD5=content_md5(data))

    def exists(self, rel: str) -> bool:
        try:
            self.call("head_object", Key=self._key(rel))
        except FileNotFoundError:
            return False
        return True

    def remove(self, rel: str) -> None:
        if rel.startswith(".uploads/"):  # an abandoned multipart upload: .uploads/<id>/<rel>
            _, upload_id, key_rel = rel.split("/", 2)
            try:
                self.call("abort_multipart_upload", Key=self._key(key_rel), UploadId=upload_id)
            except FileNotFoundError:
                pass
            return
        try:
            self.call("delete_object", Key=self._key(rel))
        except FileNotFoundError:
            pass

    def conditional_writes(self) -> bool:
        """Does the store honour `If-None-Match: *` on PUT? Probed once: a conditional PUT over
        an existing object must fail with 412. A store that ignores the header, or rejects it
        as not implemented, gets the read-after-write lease instead."""
        with self._lock:
            if self._conditional is None:
                probe = self.url.key(PROBE)
                self.call("put_object", Key=probe, Body=b"probe")
                try:
                    self.call("put_object", Key=probe, Body=b"probe", IfNoneMatch="*")
                    self._conditional = False  # the header was ignored
                except StoreUnavailable:
                    raise  # nothing learnt: probe again next time
                except StoreError as exc:
                    self._conditional = precondition_failed(exc)
                log.info(
                    "s3",
                    "%s: %s",
                    self.url.url,
                    "conditional writes (If-None-Match) honoured"
                    if self._conditional
                    else "no conditional writes: lease with read-after-write verification",
                )
            return self._conditional

    def _put_if_absent(self, rel: str, data: bytes) -> bool:
        try:
            self.call("put_object", Key=self._key(rel), Body=data, ContentMD5=content_md5(data), IfNoneMatch="*")
        except StoreError as exc:
            if precondition_failed(exc):
                return False
            raise
        return True

    def create_generation(self, number: int, data: bytes) -> bool:
        rel = f"{GENERATIONS}/{gen_name(number)}"
        if self.conditional_writes():
            if not self._put_if_absent(rel, data):
                return False
        else:
            # Only the lease holder gets here; the check and the read-back catch a publisher
            # that (wrongly) believed it held the lease too.
            if self.exists(rel):
                return False
            self.write(rel, data)
        try:
            return self.read(rel) == data  # read-after-write: ours, not a racer's
        except FileNotFoundError:
            return False

    def bundle_chunks(self, ref: BundleRef) -> Iterator[bytes]:
        return self._ranged(self._key(f"bundles/{ref.name}"), ref)

    def _ranged(self, key: str, ref: BundleRef) -> Iterator[bytes]:
        """Parallel ranged GETs (`get_workers` at a time), yielded in order."""
        size = ref.size
        ranges = [(start, min(start + self.range_size, size) - 1) for start in range(0, size, self.range_size)]

        def fetch(span: tuple[int, int]) -> bytes:
            try:
                data = self.call("get_object", Key=key, Range=f"bytes={span[0]}-{span[1]}", read=True)["Data"]
            except FileNotFoundError:
                raise StoreError(f"bundle {ref.name} is missing", ref.name) from None
            except StoreUnavailable:
                raise
            except StoreError as exc:  # InvalidRange: the object is shorter than its index says
                raise StoreError(f"bundle {ref.name}: {exc}", ref.name) from exc
            if len(data) != span[1] - span[0] + 1:
                raise StoreError(f"bundle {ref.name}: a range returned {len(data)} bytes", ref.name)
            return data

        if not ranges:
            return iter(())
        return in_order(fetch, ranges, self.get_workers)

    def bundle_writer(self) -> BundleWriter:
        return _S3BundleWriter(self)

    def abandoned(self, ttl_s: float) -> list[str]:
        out = []
        page = self.call("list_multipart_uploads", Prefix=self.root + "/")
        t = time.time() + self.clock_offset()  # the store's now: Initiated is the store's time
        for upload in page.get("Uploads", []):
            if t - upload["Initiated"].timestamp() > ttl_s:
                out.append(f".uploads/{upload['UploadId']}/{upload['Key'][len(self.root) + 1 :]}")
        return out

    def lease(self, holder: str, ttl_s: float) -> Lease:
        return S3Lease(self, holder, ttl_s)


class _S3BundleWriter(BundleWriter):
    """Tar bytes spool to local disk (hashed on the way); commit uploads them under the final
    name: one PUT, or a multipart upload with parallel parts that is aborted on failure."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        self.raw = tempfile.TemporaryFile(dir=store.spool_dir, prefix="warmstart-bundle-")
        self.sink: BinaryIO = open(self.raw.fileno(), "wb", buffering=CHUNK, closefd=False)

    def commit(self, size: int, sha256: str, files: int, *, compressed: bool = False) -> BundleRef:
        self.sink.flush()
        name = bundle_name(sha256, uuid.uuid4().hex, compressed=compressed)
        rel = f"bundles/{name}"
        key = self.store._key(rel)
        fd = self.raw.fileno()
        if size <= self.store.multipart_threshold:
            data = os.pread(fd, size, 0)
            self.store.call("put_object", Key=key, Body=data, ContentMD5=content_md5(data), Metadata={"sha256": sha256})
        else:
            self._multipart(key, fd, size, sha256)
        head = self.store.call("head_object", Key=key)
        if int(head.get("ContentLength", -1)) != size:
            raise StoreError(f"bundle verification failed after upload ({head.get('ContentLength')} of {size} bytes)")
        self.abort()  # the spool file
        return BundleRef(name, sha256, size, files)

    def _multipart(self, key: str, fd: int, size: int, sha256: str) -> None:
        store = self.store
        upload_id = store.call("create_multipart_upload", Key=key, Metadata={"sha256": sha256})["UploadId"]
        spans = [
            (n + 1, start, min(store.part_size, size - start))
            for n, start in enumerate(range(0, size, store.part_size))
        ]

        def part(span: tuple[int, int, int]) -> dict[str, Any]:
            number, start, length = span
            data = os.pread(fd, length, start)
            response = store.call(
                "upload_part", Key=key, UploadId=upload_id, PartNumber=number, Body=data, ContentMD5=content_md5(data)
            )
            return {"PartNumber": number, "ETag": response["ETag"]}

        try:
            with ThreadPoolExecutor(max_workers=PUT_WORKERS, thread_name_prefix="s3-put") as pool:
                parts = list(pool.map(part, spans))
            store.call("complete_multipart_upload", Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            try:
                store.call("abort_multipart_upload", Key=key, UploadId=upload_id)
            except (StoreError, OSError) as exc:  # the garbage collector aborts it after the TTL
                log.warning("s3", "could not abort an upload (%s): left to garbage collection", exc)
            raise

    def abort(self) -> None:
        try:
            self.sink.close()  # flushes what is buffered: fails again on a full spool disk
        except OSError:
            pass
        self.raw.close()


class S3Lease(Lease):
    """The publish lease as an object, with the volume's JSON: conditional create where the
    store honours If-None-Match (take-over of an expired one with If-Match), else
    write, wait `lease_settle_s`, read back: the last writer wins and every other one sees it."""

    def __init__(self, store: S3Store, holder: str, ttl_s: float) -> None:
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s
        self.held = False
        self._age: float | None = None

    def _read(self) -> tuple[dict[str, Any] | None, str | None, bool]:
        """(content, etag, exists). The lease's age on the store's clock is kept for `_stale`."""
        try:
            response = self.store.call("get_object", Key=self.store._key(LEASE), read=True)
        except FileNotFoundError:
            return None, None, False
        self._age = _age_on_store_clock(response)
        try:
            data = json.loads(response["Data"])
        except ValueError:
            data = None
        return (data if isinstance(data, dict) else None), response.get("ETag"), True

    def _stale(self, data: dict[str, Any] | None) -> bool:
        return data is None or lease_expired(data, self._age)

    def renew(self) -> None:
        if not self.held:
            return
        data, etag, _ = self._read()
        if (data or {}).get("holder") != self.holder:
            return
        payload = json.dumps(lease_payload(self.holder, self.ttl_s)).encode()
        conditional = {"IfMatch": etag} if self.store.conditional_writes() and etag else {}
        self.store.call("put_object", Key=self.store._key(LEASE), Body=payload, **conditional)

    def try_acquire(self) -> bool:
        payload = json.dumps(lease_payload(self.holder, self.ttl_s)).encode()
        key = self.store._key(LEASE)
        if self.store.conditional_writes():
            if self.store._put_if_absent(LEASE, payload):
                self.held = True
                return True
            data, etag, exists = self._read()
            if exists and not self._stale(data):
                return False
            try:  # take over an expired lease: only one writer matches its ETag
                if exists:
                    self.store.call("put_object", Key=key, Body=payload, IfMatch=etag)
                elif not self.store._put_if_absent(LEASE, payload):
                    return False
            except StoreError as exc:
                if precondition_failed(exc):
                    return False
                raise
            self.held = True
            return True
        data, _, exists = self._read()
        if exists and not self._stale(data) and (data or {}).get("holder") != self.holder:
            return False
        self.store.write(LEASE, payload)
        time.sleep(self.store.lease_settle_s)
        data, _, _ = self._read()
        self.held = (data or {}).get("holder") == self.holder
        return self.held

    def current_holder(self) -> str | None:
        data, _, _ = self._read()
        return str((data or {}).get("holder", "")) or None

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        data, _, _ = self._read()
        if data is not None and data.get("holder") == self.holder:
            self.store.remove(LEASE)


def _store_date(response: Any) -> float | None:
    """The response's `Date`: now on the store's clock (None where it has none)."""
    from email.utils import parsedate_to_datetime

    try:
        return parsedate_to_datetime(response["ResponseMetadata"]["HTTPHeaders"]["date"]).timestamp()
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _age_on_store_clock(response: dict[str, Any]) -> float | None:
    """Now (the response's Date) minus LastModified: both the store's clock, whatever this one says."""
    date = _store_date(response)
    try:
        return None if date is None else date - response["LastModified"].timestamp()
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def open_store(
    url: str,
    endpoint_url: str | None,
    region: str | None,
    key: str,
    *,
    spool_dir: Path,
    compression: Compression = "zstd",
) -> S3Store:
    """The S3 tier for one key, from the settings (no request is made yet)."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    client = make_client(endpoint_url, region or None)
    return S3Store(client, parse_s3_url(url), key, spool_dir=spool_dir, compression=compression)
