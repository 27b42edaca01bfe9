"""The staged tiers of one boot: restore from the nearest that has a generation, publish to each.

A boot restores from up to three tiers, nearest first: the key's generation baked into the image
(read-only, `store.image`), the key's store on the volume (the next worker in this datacenter reads
it) and the S3 store (shared by every datacenter); it publishes to the last two. Restore walks them in order and
stops at the first intact generation; every tier's problems are kept, and the bundles a tier served
broken are never referenced by this boot's publish to that tier. Publish writes to each tier what
its generation lacks. Both log one line per tier and return frozen results.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import log
from . import cachelock
from .backend import READERS, BundleStore, Lease, Tier
from .bundle import StoreError
from .deadline import Deadline, bounded, within
from .image import ImageStore
from .publish import PublishResult, publish
from .restore import RestoreResult, restore
from .volume import StagedStore


@dataclass(frozen=True)
class TierRestore:
    """What restoring from the tiers gave: the result of the tier it came from (or the last tried)."""

    result: RestoreResult | None = None
    problems: tuple[str, ...] = ()  # every tier's, prefixed with the tier
    bad_bundles: Mapping[Tier, tuple[str, ...]] = field(default_factory=dict)  # never to be referenced again

    @property
    def restored(self) -> bool:
        return self.result is not None and self.result.restored


RESTORE_DEADLINE = "WARMSTART_RESTORE_DEADLINE_S"
PUBLISH_DEADLINE = "WARMSTART_PUBLISH_DEADLINE_S"
RELEASE_DEADLINE_S = 10.0  # giving a lease back at exit: it expires by itself anyway


def restore_tiers(
    tiers: Sequence[BundleStore],
    dest: Path,
    *,
    reader: str,
    ttl_s: float,
    deadline_s: float | None = None,
    otherwise: str = "starting cold",
) -> TierRestore:
    """Replace `dest` with the newest intact generation of the nearest tier that has one, each
    tier's restore (list, register, fetch, extract) within `deadline_s` (store/deadline.py). One
    restored from S3 reaches the volume with the volume's publish: it lacks a generation, so that
    publish writes all of it. `otherwise`: what the boot does when no tier has one, for the log."""
    if not _may_replace(dest, deadline_s):
        problem = f"the local cache {dest} is in use by another worker on this host: restore skipped, using it as it is"
        log.warning("restore", "%s", problem)
        return TierRestore(None, (problem,), {})
    try:
        return _restore_tiers(tiers, dest, reader=reader, ttl_s=ttl_s, deadline_s=deadline_s, otherwise=otherwise)
    finally:
        cachelock.share(dest)  # in use while this worker serves: another worker's restore leaves it alone


def _may_replace(dest: Path, wait_s: float | None) -> bool:
    """The cache's exclusive lock, or (another worker restores or serves from it) False once that
    worker's restore, if one runs, is done (waiting up to `wait_s`), holding it shared."""
    try:
        if cachelock.try_exclusive(dest):
            return True
    except OSError:
        return True  # no lock file on a full disk: the restore says so, per tier
    cachelock.share(dest, wait_s or 0.0)
    return False


def _restore_tiers(
    tiers: Sequence[BundleStore], dest: Path, *, reader: str, ttl_s: float, deadline_s: float | None, otherwise: str
) -> TierRestore:
    problems: list[str] = []
    bad: dict[str, tuple[str, ...]] = {}
    result = None
    for tier in tiers:
        result = restore_within(tier, dest, reader=reader, ttl_s=ttl_s, deadline_s=deadline_s)
        problems += [f"{tier.kind}: {p}" for p in result.problems]
        bad[tier.kind] = result.bad_bundles
        if result.unavailable:
            log.warning(
                "restore",
                "%s store unavailable, going on without it: %s [%s]",
                tier.kind,
                "; ".join(result.problems),
                tier.location,
            )
        else:
            for problem in result.problems:
                log.warning("restore", "skipped in the %s store: %s", tier.kind, problem)
        if result.restored:
            log.info(
                "restore",
                "generation %d: %d files (%.1f MB) in %.2f s from the %s store %s",
                result.generation,
                result.files,
                result.bytes / 1e6,
                result.seconds,
                tier.kind,
                tier.location,
            )
            break
        last = tier is tiers[-1]
        if result.problems:
            log.info(
                "restore",
                "nothing could be restored from the %s store %s (%d problem(s) above)%s",
                tier.kind,
                tier.location,
                len(result.problems),
                f": {otherwise}" if last else "",
            )
        else:
            log.info(
                "restore",
                "no generation to restore in the %s store %s%s",
                tier.kind,
                tier.location,
                f": {otherwise}" if last else "",
            )
    return TierRestore(result, tuple(problems), bad)


def restore_within(
    tier: BundleStore, dest: Path, *, reader: str, ttl_s: float, deadline_s: float | None
) -> RestoreResult:
    """One tier's restore; past `deadline_s` the tier is unavailable, `dest` is left empty (the
    restore left behind can no longer write it) and no bundle is blamed."""
    deadline = Deadline(deadline_s, RESTORE_DEADLINE, "the restore") if deadline_s else None
    result = within(
        deadline, lambda: restore(bounded(tier, deadline), dest, reader=reader, ttl_s=ttl_s, guard=deadline), "restore"
    )
    if result is not None:
        return result
    assert deadline is not None
    if cachelock.held_exclusive(dest):  # never another worker's cache
        shutil.rmtree(dest, ignore_errors=True)
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
    return RestoreResult(None, 0, 0, deadline.seconds, {}, (deadline.reason,), (), tier.kind, unavailable=True)


@dataclass(frozen=True)
class TierPublish:
    """One publish result per tier, in the tiers' order (nearest first)."""

    kinds: tuple[Tier, ...] = ()  # one tier of each kind at most
    results: tuple[PublishResult, ...] = ()

    def items(self) -> tuple[tuple[str, PublishResult], ...]:
        return tuple(zip(self.kinds, self.results, strict=True))

    def of(self, kind: Tier) -> PublishResult | None:
        """The result of the tier of `kind`, if this boot published to one."""
        return dict(self.items()).get(kind)

    @property
    def first(self) -> PublishResult | None:
        """The nearest tier's: the volume's, or with no volume the S3 store's."""
        return self.results[0] if self.results else None


def publish_tiers(
    tiers: Sequence[BundleStore],
    local: Path,
    *,
    publisher: str,
    lease_wait_s: float,
    lease_ttl_s: float,
    distrust: Mapping[str, tuple[str, ...]] | None = None,
    blocked: str | None = None,
    deadline_s: float | None = None,
    canary: Mapping[str, Any] | None = None,
) -> TierPublish:
    """Publish what `local` holds that each tier's generation lacks, the volume first, each tier's
    publish (its garbage collection included) within `deadline_s`. `blocked`: why the volume may
    not be written (said once already, in the volume line)."""
    results = tuple(
        publish_tier(
            tier,
            local,
            publisher=publisher,
            lease_wait_s=lease_wait_s,
            lease_ttl_s=lease_ttl_s,
            distrust=(distrust or {}).get(tier.kind, ()),
            blocked=blocked,
            deadline_s=deadline_s,
            canary=canary,
        )
        for tier in tiers
    )
    return TierPublish(tuple(tier.kind for tier in tiers), results)


def publish_tier(
    tier: BundleStore,
    local: Path,
    *,
    publisher: str,
    lease_wait_s: float,
    lease_ttl_s: float,
    distrust: tuple[str, ...] = (),
    blocked: str | None = None,
    deadline_s: float | None = None,
    canary: Mapping[str, Any] | None = None,
) -> PublishResult:
    if isinstance(tier, ImageStore):  # read-only: a boot never aims a publish at it
        result = PublishResult("skipped", detail="the image tier is read-only: nothing published")
        log.info("publish", "%s skipped: %s", tier.kind, result.detail)
        return result
    if isinstance(tier, StagedStore):
        if blocked is not None:
            result = PublishResult("skipped", detail=f"{blocked}: nothing published")
            log.info("publish", "%s skipped: %s", tier.kind, result.detail)
            return result
        key_dir = tier.root.parent
        if not key_dir.is_dir():
            # The volume went away after the boot began (unmounted, or the key's directory was
            # removed): publishing would recreate the tree on whatever is at that path now.
            result = PublishResult(
                "skipped",
                detail=f"the key's directory {key_dir} is gone (volume unmounted or removed): nothing published",
            )
            log.warning("publish", "%s: %s", tier.kind, result.detail)
            return result
    log.info("publish", "publishing new cache files to the %s store %s", tier.kind, tier.location)
    deadline = Deadline(deadline_s, PUBLISH_DEADLINE, "the publish") if deadline_s else None
    store = bounded(tier, deadline)
    result = within(
        deadline,
        lambda: publish(
            store,
            local,
            publisher=publisher,
            lease_wait_s=lease_wait_s,
            lease_ttl_s=lease_ttl_s,
            distrust=distrust,
            canary=canary,
        ),
        "publish",
    )
    if result is None:
        assert deadline is not None
        detail = f"publish abandoned: {deadline.reason}; the previous generation is intact"
        result = PublishResult("failed", seconds=deadline.seconds, detail=detail)
    if result.status == "published":
        log.info(
            "publish",
            "%s generation %d: %d files (%.1f MB) in %.2f s (%s)",
            tier.kind,
            result.generation,
            result.files,
            result.bytes / 1e6,
            result.seconds,
            result.detail,
        )
    elif result.status == "failed":
        log.warning("publish", "%s: %s", tier.kind, result.detail)
    else:
        log.info("publish", "%s %s: %s", tier.kind, result.status, result.detail)
    return result


def distrust_generation(
    tiers: Sequence[BundleStore], restored: RestoreResult, reason: str, *, by: str
) -> tuple[str, ...]:
    """Mark the restored generation distrusted on the tier it came from (a copy another boot
    published to a nearer tier has its own number there; the worker that restores it runs the
    canary against it in turn). Returns one line saying what was done; an image cannot be marked
    (read-only): this worker skips it by rebooting cold, and the line says so."""
    lines = []
    for tier in tiers:
        if tier.kind != restored.source:
            continue
        if isinstance(tier, ImageStore):
            lines.append(
                f"image generation {restored.generation} cannot be marked (the image is read-only): "
                "skipped by this worker; other workers of this image will catch it again"
            )
            continue
        assert restored.generation is not None
        try:
            tier.distrust(restored.generation, reason, by)
            lines.append(f"{tier.kind} generation {restored.generation} marked distrusted")
        except (OSError, StoreError) as exc:
            lines.append(f"{tier.kind} generation {restored.generation} could not be marked distrusted: {exc}")
    for line in lines:
        log.warning("canary", "%s", line)
    return tuple(lines)


def release_leases(tiers: Sequence[BundleStore], *, holder: str, ttl_s: float) -> None:
    """Give back `holder`'s publish lease in every tier where it still holds it, and remove its
    reader registration. For an exit while a publish or a restore runs in another thread: the
    process ends before that thread's own `finally` gives them back. A lease held by another
    holder is left alone (release checks the holder). Each tier's bounded: at exit a stalled store
    costs `RELEASE_DEADLINE_S`, then what is left expires by itself."""
    for tier in tiers:
        lease = tier.lease(holder, ttl_s)
        lease.held = True  # release() acts only on a lease it believes held, and re-reads the holder

        def give_back(tier: BundleStore = tier, lease: Lease = lease) -> None:
            lease.release()
            tier.remove(f"{READERS}/{holder}.json")

        deadline = Deadline(RELEASE_DEADLINE_S, "release", "giving the lease back")
        try:
            within(deadline, give_back, "release")
        except Exception as exc:  # an exit path: a store's failure is a warning, never a crash
            log.warning("publish", "could not release the %s lease (it expires by itself): %s", tier.kind, exc)
            continue
        if deadline.expired:
            log.warning(
                "publish",
                "could not release the %s lease (it expires by itself): no answer in %g s",
                tier.kind,
                RELEASE_DEADLINE_S,
            )
