"""A deadline on one tier's restore or publish: how long a store may take, whatever it does.

Each S3 request is bounded (2 s to connect, 30 s to read, three attempts, a cut body fetched
again three times), yet a store that stalls every response still costs about 90 s per request,
and a restore or a publish makes many; a hung volume (a network file system that stopped
answering) blocks a read for as long as it likes. So a whole tier's operation runs on a thread of
its own (`within`) and the caller waits for it at most the deadline, then goes on: the next tier
or a cold start after a restore, the previous generation after a publish. The thread left behind
works through `bounded(store, deadline)`, a view of the store that refuses every request once the
deadline passed (`DeadlinePassed`, a `StoreUnavailable`: no bundle is blamed), so it stops at its
next request; giving back what it holds (its lease, its reader registration) is never refused.
A restore's only local writes (replacing the local cache, or emptying it to start cold) happen
under `Deadline.committing`, which the caller's `expire` excludes: nothing of a late restore ever
lands in a cache that the boot already uses.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, TypeVar

from ..errors import DeadlinePassed
from .backend import GENERATIONS, READERS, BundleStore, BundleWriter, Lease
from .bundle import BundleRef, Generation

T = TypeVar("T")


class Deadline:
    """One operation's time limit, shared by the caller that waits and the thread that works.
    `doing` is the request in flight, for the warning that says where the store stalled."""

    def __init__(self, seconds: float, setting: str, what: str = "the operation") -> None:
        self.seconds = seconds
        self.setting = setting  # the variable that sets it, named in the warning
        self.what = what
        self.doing = "starting"
        self._lock = threading.Lock()
        self._state = "running"  # running | committed | expired

    @property
    def expired(self) -> bool:
        return self._state == "expired"

    @property
    def reason(self) -> str:
        return f"{self.what} took longer than {self.seconds:g} s ({self.setting}), stuck {self.doing}"

    def check(self, doing: str) -> None:
        """Before a request: refuse it once the deadline passed, else remember it as in flight."""
        if self._state == "expired":
            raise DeadlinePassed(self.reason)
        self.doing = doing

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """The block that makes the operation's result visible locally; never after the deadline,
        and the deadline cannot pass while it runs (`expire` waits for it)."""
        with self._lock:
            if self._state == "expired":
                raise DeadlinePassed(self.reason)
            self._state = "committed"
            yield

    def expire(self) -> bool:
        """Mark the deadline passed, unless the operation committed already (False then: its
        result is being made visible, wait for it)."""
        with self._lock:
            if self._state == "committed":
                return False
            self._state = "expired"
            return True


def within(deadline: Deadline | None, work: Callable[[], T], name: str) -> T | None:
    """`work()` on a thread of its own; its result, or None when the deadline passed first (the
    thread is left behind, to stop at its next request). Its exception is raised here. Without a
    deadline, `work()` runs on this thread."""
    if deadline is None:
        return work()
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as exc:  # handed to the caller (or dropped once it went on)
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"warmstart-{name}", daemon=True).start()
    if not done.wait(deadline.seconds) and deadline.expire():
        return None
    done.wait()  # done, or committing: local work, it ends soon
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def bounded(store: BundleStore, deadline: Deadline | None) -> BundleStore:
    """`store` as seen by an operation under `deadline` (itself without one)."""
    return store if deadline is None else _Bounded(store, deadline)


class _Bounded(BundleStore):
    """A store whose every request first checks the deadline (a lease is always given back)."""

    def __init__(self, store: BundleStore, deadline: Deadline) -> None:
        self.store = store
        self.deadline = deadline
        self.kind = store.kind
        self.compression = store.compression

    @property
    def location(self) -> str:
        return self.store.location

    def create(self) -> None:
        self.deadline.check("creating the store's folders")
        self.store.create()

    def names(self, folder: str) -> dict[str, float]:
        self.deadline.check(f"listing {folder}/")
        return self.store.names(folder)

    def read(self, rel: str) -> bytes:
        self.deadline.check(f"reading {rel}")
        return self.store.read(rel)

    def write(self, rel: str, data: bytes) -> None:
        self.deadline.check(f"writing {rel}")
        self.store.write(rel, data)

    def exists(self, rel: str) -> bool:
        self.deadline.check(f"looking for {rel}")
        return self.store.exists(rel)

    def remove(self, rel: str) -> None:
        if not rel.startswith(f"{READERS}/"):  # a reader's registration may always go: it only frees
            self.deadline.check(f"removing {rel}")
        self.store.remove(rel)

    def generation_numbers(self) -> list[int]:
        self.deadline.check(f"listing {GENERATIONS}/")
        return self.store.generation_numbers()

    def load(self, number: int) -> Generation:
        # The store's own (a view of it may filter what a generation lists: store/seed.py).
        self.deadline.check(f"reading generation {number}")
        return self.store.load(number)

    def create_generation(self, number: int, data: bytes) -> bool:
        self.deadline.check(f"creating generation {number}")
        return self.store.create_generation(number, data)

    def bundle_chunks(self, ref: BundleRef) -> Iterator[bytes]:
        self.deadline.check(f"fetching bundle {ref.name}")
        return self._checked(self.store.bundle_chunks(ref), ref)

    def _checked(self, chunks: Iterator[bytes], ref: BundleRef) -> Iterator[bytes]:
        try:
            for chunk in chunks:
                self.deadline.check(f"fetching bundle {ref.name}")
                yield chunk
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # S3: cancels the ranged GETs not yet started

    def bundle_writer(self) -> BundleWriter:
        self.deadline.check("writing a bundle")
        return _BoundedWriter(self.store.bundle_writer(), self.deadline)

    def abandoned(self, ttl_s: float) -> list[str]:
        self.deadline.check("listing abandoned uploads")
        return self.store.abandoned(ttl_s)

    def lease(self, holder: str, ttl_s: float) -> Lease:
        return _BoundedLease(self.store.lease(holder, ttl_s), self.deadline)

    def clock_offset(self) -> float:
        self.deadline.check("reading the store's clock")
        return self.store.clock_offset()


class _BoundedWriter(BundleWriter):
    def __init__(self, writer: BundleWriter, deadline: Deadline) -> None:
        self.writer = writer
        self.deadline = deadline
        self.sink: BinaryIO = writer.sink

    def commit(self, size: int, sha256: str, files: int, *, compressed: bool = False) -> BundleRef:
        self.deadline.check("uploading a bundle")
        return self.writer.commit(size, sha256, files, compressed=compressed)

    def abort(self) -> None:
        self.writer.abort()


class _BoundedLease(Lease):
    """Taking the lease checks the deadline; renewing and giving it back never do (a thread left
    behind still gives back what it holds)."""

    def __init__(self, lease: Lease, deadline: Deadline) -> None:
        self.inner = lease
        self.deadline = deadline

    @property  # type: ignore[override]
    def held(self) -> bool:
        return self.inner.held

    @held.setter
    def held(self, value: bool) -> None:
        self.inner.held = value

    def try_acquire(self) -> bool:
        self.deadline.check("taking the publish lease")
        return self.inner.try_acquire()

    def release(self) -> None:
        self.inner.release()

    def renew(self) -> None:
        self.inner.renew()

    def current_holder(self) -> str | None:
        return self.inner.current_holder()
