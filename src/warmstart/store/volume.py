"""The staged store as a folder on the network volume: the key's `staged/` directory.

    <key_dir>/staged/
        bundles/<sha256 prefix>-<id>.tar.zst  (.tar: plain) written as .tmp-*, fsynced, verified, renamed
        generations/g00000007.json          a generation; created by os.link, so never overwritten
        readers/<reader>.json               a restore in progress (protects its bundles)
        publish.lease                       who may publish now, until when (created exclusively)

The algorithms over any store are `store.restore`, `store.publish` and `store.bundlegc`;
this module is only how a folder lists, reads, writes and creates those names safely.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..limits import LEASE_TTL_S
from .backend import (
    BUNDLES,
    GENERATIONS,
    LEASE,
    READERS,
    BundleStore,
    BundleWriter,
    Compression,
    Lease,
    lease_expired,
    lease_payload,
    step,
    volume_now,
)
from .bundle import CHUNK, BundleRef, StoreError, StoreUnavailable, bundle_name, file_chunks, file_ranges, gen_name, now
from .history import write_json_atomic


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StagedStore(BundleStore):
    """The staged part of one key's directory on the volume."""

    root: Path
    compression: Compression = "zstd"  # new bundles: zstd frames or a plain tar
    kind = "volume"  # a Tier: a class attribute, not a dataclass field

    @property
    def location(self) -> str:
        return str(self.root)

    @property
    def bundles(self) -> Path:
        return self.root / BUNDLES

    @property
    def generations_dir(self) -> Path:
        return self.root / GENERATIONS

    @property
    def readers(self) -> Path:
        return self.root / READERS

    @property
    def lease_path(self) -> Path:
        return self.root / LEASE

    def create(self) -> None:
        for path in (self.bundles, self.generations_dir, self.readers):
            path.mkdir(parents=True, exist_ok=True)

    def names(self, folder: str) -> dict[str, float]:
        t = now()
        out = {}
        try:
            entries = list(os.scandir(self.root / folder))
        except FileNotFoundError:
            return {}  # nothing published there yet
        except OSError as exc:  # EIO, EACCES...: not an empty folder, nothing is known about it
            raise StoreUnavailable(f"{self.root / folder} could not be listed: {exc.strerror or exc}") from exc
        for entry in entries:
            try:
                out[entry.name] = t - entry.stat().st_mtime
            except OSError:
                continue
        return out

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def write(self, rel: str, data: bytes) -> None:
        write_json_atomic(self.root / rel, json.loads(data))

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def remove(self, rel: str) -> None:
        try:
            (self.root / rel).unlink()
        except FileNotFoundError:
            pass

    def create_generation(self, number: int, data: bytes) -> bool:
        tmp = self.generations_dir / f".tmp-{uuid.uuid4().hex}.json"
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            step("publish:generation_tmp_written")
            os.link(tmp, self.generations_dir / gen_name(number))
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, FileExistsError):
                return False  # that number is someone else's
            raise
        step("publish:generation_linked")
        os.unlink(tmp)
        _fsync_dir(self.generations_dir)
        return True

    def bundle_chunks(self, ref: BundleRef) -> Iterator[bytes]:
        path = self.bundles / ref.name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise StoreError(f"bundle {ref.name} is missing", ref.name) from None
        if size != ref.size:  # only the index's bytes are read: a longer file would pass unseen
            raise StoreError(f"bundle {ref.name} is truncated or corrupt: {size} bytes, index: {ref.size}", ref.name)
        return file_ranges(path, ref.size)

    def bundle_writer(self) -> BundleWriter:
        return _FolderBundleWriter(self)

    def abandoned(self, ttl_s: float) -> list[str]:
        offset = self.clock_offset()
        return [
            f"{folder}/{name}"
            for folder in (BUNDLES, GENERATIONS)
            for name, age in self.names(folder).items()
            if name.startswith(".tmp-") and age + offset > ttl_s
        ]

    def clock_offset(self) -> float:
        t = now()
        volume = volume_now(self.root)
        return 0.0 if volume is None else volume - (t + now()) / 2

    def lease(self, holder: str, ttl_s: float) -> Lease:
        return PublishLease(self, holder, ttl_s=ttl_s)


class _FolderBundleWriter(BundleWriter):
    """bundles/.tmp-*, fsynced, read back and hashed again, then renamed to its final name."""

    def __init__(self, store: StagedStore) -> None:
        self.store = store
        self.tmp = store.bundles / f".tmp-{uuid.uuid4().hex}.tar"
        self.sink: BinaryIO = open(self.tmp, "wb", buffering=CHUNK)

    def commit(self, size: int, sha256: str, files: int, *, compressed: bool = False) -> BundleRef:
        self.sink.flush()
        os.fsync(self.sink.fileno())
        self.sink.close()
        step("publish:bundle_tmp_written")
        check = hashlib.sha256()
        read = 0
        for chunk in file_chunks(self.tmp):
            check.update(chunk)
            read += len(chunk)
        if read != size or check.hexdigest() != sha256:
            raise StoreError(f"bundle verification failed after writing ({read} of {size} bytes read back)")
        name = bundle_name(sha256, uuid.uuid4().hex, compressed=compressed)
        os.rename(self.tmp, self.store.bundles / name)
        step("publish:bundle_renamed")
        return BundleRef(name, sha256, size, files)

    def abort(self) -> None:
        try:
            self.sink.close()  # flushes what is buffered: fails again on a full volume
        except OSError:
            pass
        try:
            self.tmp.unlink()
        except OSError:
            pass


def _identity(path: Path) -> tuple[int, int, int, bytes] | None:
    """The lease file as it is now (inode, size, mtime, bytes): a take-over or a renewal changes it."""
    try:
        st = os.stat(path)
        return (st.st_ino, st.st_size, st.st_mtime_ns, path.read_bytes())
    except OSError:
        return None


@dataclass
class PublishLease(Lease):
    """Who may publish. A file created exclusively; a holder that died loses it at expiry."""

    store: StagedStore
    holder: str
    ttl_s: float = LEASE_TTL_S
    held: bool = False

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.store.lease_path.read_text())
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def _stale(self, data: dict[str, Any] | None) -> bool:
        if data is None:  # unreadable: stale once old enough to not be mid-write
            try:
                return now() - self.store.lease_path.stat().st_mtime > 5.0
            except OSError:
                return True
        return lease_expired(data, self._age())

    def _age(self) -> float | None:
        """How long ago the lease file was written or renewed, on the volume's clock: its mtime
        against that of a file created now (None where nothing can be created: a read-only volume)."""
        try:
            written = self.store.lease_path.stat().st_mtime
        except OSError:
            return None
        t = volume_now(self.store.root)
        return None if t is None else t - written

    def renew(self) -> None:
        if self.held and (self._read() or {}).get("holder") == self.holder:
            os.utime(self.store.lease_path)  # the volume's now (an NFS server sets its own time)

    def is_live(self) -> bool:
        """Someone holds the lease now: it exists and has neither expired nor lost its process."""
        if not self.store.lease_path.exists():
            return False
        return not self._stale(self._read())

    def try_acquire(self) -> bool:
        self.store.root.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(lease_payload(self.holder, self.ttl_s))
        for _ in range(2):
            try:
                fd = os.open(self.store.lease_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                judged = _identity(self.store.lease_path)
                if not self._stale(self._read()):
                    return False
                # Take a stale lease over: only one renamer wins the old file. The rename moves
                # whatever lease is there now: if another worker took it over since it was judged
                # (another file, or renewed), it goes back, and that worker keeps it.
                grave = self.store.root / f".lease-stale-{self.holder}-{uuid.uuid4().hex[:8]}"
                try:
                    os.rename(self.store.lease_path, grave)
                except FileNotFoundError:
                    continue
                if judged is None or _identity(grave) != judged:
                    try:
                        os.link(grave, self.store.lease_path)  # never over a lease made meanwhile
                    except FileExistsError:
                        pass
                    os.unlink(grave)
                    return False
                os.unlink(grave)
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            self.held = True
            return True
        return False

    def current_holder(self) -> str | None:
        return str((self._read() or {}).get("holder", "")) or None

    def release(self) -> None:
        if not self.held:
            return
        data = self._read()
        if data is not None and data.get("holder") == self.holder:
            try:
                self.store.lease_path.unlink()
            except OSError:
                pass
        self.held = False
