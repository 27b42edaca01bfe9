"""Where a key's staged caches live: the interface the staged algorithms are written against.

`store.restore`, `store.publish` and `store.bundlegc` are written once against it;
what differs between a folder on the network volume and an S3 prefix is only how a name
is listed, read, written, created without clobbering, and removed. Names are relative to
the key's staged root and keep the volume's layout in every store:

    generations/g00000007.json    created last, never overwritten
    bundles/<sha prefix>-<id>.tar.zst  immutable (.tar: plain, from before compression or with it off)
    readers/<reader>.json         a restore in progress (protects its bundles)
    publish.lease                 who may publish now, until when
    distrusted/g00000007.json     a generation whose canary differed (canary.py): never restored or built on
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal

from .. import log
from ..settings import step_hooks
from .bundle import BundleRef, Generation, StoreError, StoreUnavailable, gen_name

Tier = Literal["image", "volume", "s3"]  # a staged store's kind: where a restore came from, in logs and reports
Compression = Literal["zstd", "none"]  # how a store's new bundles are written (`store.zst`)

GENERATIONS = "generations"
BUNDLES = "bundles"
READERS = "readers"
LEASE = "publish.lease"
DISTRUSTED = "distrusted"


def step(name: str) -> None:
    """A named point of a publish or restore, for tests that must prove where a kill landed.

    Inert unless WARMSTART_TEST_STEPS=1: then each step is logged (`warmstart | step | NAME`),
    and the step named by WARMSTART_TEST_PAUSE_AT waits there until the file named by
    WARMSTART_TEST_RESUME exists, so a test can kill, unmount or race at exactly that point.
    """
    hooks = step_hooks()
    if hooks is None:
        return
    log.info("step", "%s", name)
    if hooks.pause_at == name:
        while not hooks.resume.exists():
            time.sleep(0.05)


def worker_id() -> str:
    """This process, as a reader, publisher or lease holder names itself on a store."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def machine_id() -> str:
    """This kernel and pid namespace: where a pid names one process. Containers sharing a
    hostname (host networking) or a machine have other pid namespaces; another machine has
    another boot id."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "?"
    return f"{boot}/{namespace}"


def volume_now(directory: Path) -> float | None:
    """Now on the volume's clock: the mtime of a file created in `directory` this moment (a
    network file system's server sets it; a local disk's is this machine's clock). None where
    nothing can be created there (a read-only volume, a missing directory)."""
    clock = directory / f".clock-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.close(os.open(clock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError:
        return None
    try:
        return os.stat(clock).st_mtime
    except OSError:
        return None
    finally:
        try:
            os.unlink(clock)
        except OSError:
            pass


def lease_payload(holder: str, ttl_s: float) -> dict[str, Any]:
    """What a lease holds, in every store: who, where (machine and pid namespace), for how long.
    `expires` is the writer's clock, for people and for readers of old leases only: liveness is
    judged on the store's clock (`lease_expired`)."""
    return {
        "holder": holder,
        "host": socket.gethostname(),
        "machine": machine_id(),
        "pid": os.getpid(),
        "ttl_s": ttl_s,
        "expires": time.time() + ttl_s,
    }


def process_gone(data: dict[str, Any]) -> bool:
    """The writer's process is known to be gone: it ran in this pid namespace of this machine,
    and its pid runs no more. Anywhere else nothing is known (a shared hostname proves nothing)."""
    if data.get("machine") != machine_id():
        return False
    try:
        os.kill(int(data.get("pid", 0)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, TypeError, OverflowError):
        return False
    return False


def lease_expired(data: dict[str, Any], age_s: float | None = None) -> bool:
    """A lease not written or renewed for its TTL, `age_s` measured on the store's clock (a
    volume file's mtime against the volume's now, S3's LastModified against its Date), or
    whose process is known to be gone. Without an age (or a TTL: an old lease), the writer's
    `expires`, on this machine's clock."""
    if process_gone(data):
        return True
    ttl = data.get("ttl_s")
    if age_s is not None and isinstance(ttl, (int, float)):
        return age_s > float(ttl)
    try:
        return float(data.get("expires", 0)) < time.time()
    except (TypeError, ValueError):
        return True


class Lease(ABC):
    """Who may publish: one holder at a time, lost at expiry by a holder that died."""

    held: bool = False

    @abstractmethod
    def try_acquire(self) -> bool: ...

    @abstractmethod
    def release(self) -> None: ...

    def current_holder(self) -> str | None:
        """Who holds the lease now, for the log line of a worker that waits for it (None: unknown)."""
        return None

    def renew(self) -> None:
        """Held: write the lease again, so that its age on the store's clock starts anew."""
        return None

    @contextlib.contextmanager
    def renewed(self, every_s: float) -> Iterator[None]:
        """Renew the lease every `every_s` on a thread while the block runs (a long upload)."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(every_s):
                try:
                    self.renew()
                except (OSError, StoreError) as exc:
                    log.warning("publish", "could not renew the lease: %s", exc)

        thread = threading.Thread(target=run, name="lease-renewal", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def acquire(self, wait_s: float, poll_s: float = 1.0) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            if self.try_acquire():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


class BundleWriter(ABC):
    """A bundle being written: tar bytes (or zstd frames of them, `compressed`) go to `sink`;
    `commit` makes it visible under its final name (after the store verified it), `abort`
    leaves nothing behind but what the garbage collector removes."""

    sink: BinaryIO

    @abstractmethod
    def commit(self, size: int, sha256: str, files: int, *, compressed: bool = False) -> BundleRef: ...

    @abstractmethod
    def abort(self) -> None: ...


class BundleStore(ABC):
    """One key's staged store. Subclasses: `volume.StagedStore` (a folder), `s3.S3Store`."""

    kind: Tier  # each subclass's
    compression: Compression = "zstd"  # how this store's new bundles are written

    @property
    @abstractmethod
    def location(self) -> str:
        """Where it is, for people: a path or an s3:// URL."""

    @abstractmethod
    def create(self) -> None:
        """Make whatever must exist before a publish writes (folders); nothing for S3."""

    @abstractmethod
    def names(self, folder: str) -> dict[str, float]:
        """Entry name -> age in seconds on this machine's clock (`clock_offset` corrects it), for
        every entry in `folder` (temporaries included)."""

    @abstractmethod
    def read(self, rel: str) -> bytes:
        """A small object's bytes. FileNotFoundError when it is not there."""

    @abstractmethod
    def write(self, rel: str, data: bytes) -> None:
        """Write a small object whole (a reader registration): readers see old or new, never half."""

    @abstractmethod
    def exists(self, rel: str) -> bool: ...

    @abstractmethod
    def remove(self, rel: str) -> None:
        """Remove one entry (or abandoned temporary); gone already is fine."""

    @abstractmethod
    def create_generation(self, number: int, data: bytes) -> bool:
        """Make generations/g<number>.json hold `data`, unless that number exists: False then.
        Never overwrites another publisher's generation."""

    @abstractmethod
    def bundle_chunks(self, ref: BundleRef) -> Iterator[bytes]:
        """The bundle's bytes, in order. Raises StoreError(bundle=ref.name) if it is missing."""

    @abstractmethod
    def bundle_writer(self) -> BundleWriter: ...

    @abstractmethod
    def abandoned(self, ttl_s: float) -> list[str]:
        """Temporaries older than `ttl_s` that a killed publisher left (names for `remove`)."""

    @abstractmethod
    def lease(self, holder: str, ttl_s: float) -> Lease: ...

    def clock_offset(self) -> float:
        """How far the store's clock is ahead of this machine's (0 where unknown). `names()` ages
        are this machine's now minus the store's times: adding this puts them on the store's clock,
        so that a collector whose clock is off never takes a young object for an old one."""
        return 0.0

    # ------------------------------------------------------------------ shared on top

    def generation_numbers(self) -> list[int]:
        from .bundle import parse_gen_name

        numbers = [parse_gen_name(name) for name in self.names(GENERATIONS)]
        return sorted(n for n in numbers if n is not None)

    def load(self, number: int) -> Generation:
        name = gen_name(number)
        try:
            data = json.loads(self.read(f"{GENERATIONS}/{name}"))
        except FileNotFoundError:
            raise
        except OSError as exc:  # EIO, EACCES: nothing is known about it, it may be the newest
            raise StoreUnavailable(f"{name}: could not be read ({exc.strerror or exc})") from exc
        except ValueError as exc:
            raise StoreError(f"{name}: unreadable ({exc})") from exc
        try:
            return Generation.from_json(data)
        except StoreError as exc:  # which generation is skipped, and why
            raise StoreError(f"{name}: {exc}") from exc

    def distrusted_numbers(self) -> set[int]:
        """Generations marked distrusted (a canary differed after restoring them): never restored
        again, never the base of a publish; garbage collection takes them as any old generation."""
        from .bundle import parse_gen_name

        try:
            numbers = {parse_gen_name(name) for name in self.names(DISTRUSTED)}
        except (OSError, StoreError):
            return set()
        return {n for n in numbers if n is not None}

    def distrust(self, number: int, reason: str, by: str) -> None:
        """Mark generation `number` distrusted, with why and by whom (for `warmstart ls` and people)."""
        payload = {"generation": number, "reason": reason, "by": by, "at": time.time()}
        self.write(f"{DISTRUSTED}/{gen_name(number)}", json.dumps(payload, sort_keys=True).encode())

    def latest(self) -> tuple[Generation | None, list[str]]:
        """The newest generation whose index reads, and warnings about newer ones that did not (malformed:
        skipped for good). One that could not be read now (EIO, the store unreachable) raises
        StoreUnavailable: what it holds is unknown."""
        warnings = []
        distrusted = self.distrusted_numbers()
        for number in reversed(self.generation_numbers()):
            if number in distrusted:
                continue
            try:
                return self.load(number), warnings
            except FileNotFoundError:
                continue
            except StoreUnavailable:
                raise  # a newer generation may hold more: building on an older one would drop its files
            except StoreError as exc:
                warnings.append(str(exc))
        return None, warnings

    def reader_registrations(self) -> dict[str, tuple[dict[str, Any] | None, float]]:
        """Reader registrations: name -> (its content, None where unreadable; its age as `names`)."""
        out: dict[str, tuple[dict[str, Any] | None, float]] = {}
        for name, age in self.names(READERS).items():
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                data = json.loads(self.read(f"{READERS}/{name}"))
                out[name] = (data if isinstance(data, dict) else None, age)
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                out[name] = (None, age)
        return out
