"""The trash: a key taken off the volume in one rename, checked again, then deleted or given back.

`warmstart gc` never deletes a key where a boot could find it half-deleted: the key directory is
renamed into `warmstart/trash/` in one `rename()`, so it is either wholly present or gone. Then
the in-use checks run again: a boot that started between the plan and the rename (its marker is
outside the key directory, so the rename cannot hide it) gets its key renamed back. Only then is
the trashed copy deleted. Where the rename back fails (the boot made a fresh directory for the
key meanwhile), what the fresh one lacks is moved into it (bundles before the generations that
name them) and the rest is kept under `warmstart/trash/kept-*`: a failed rename back never deletes.
What a gc killed midway left in the trash, the next gc deletes (`empty_trash`).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from .layout import VolumeLayout
from .markers import read_boot_markers
from .scan import KeyInfo, scan_key

LATE = "a boot, publish or restore of this key started while gc ran"
KEPT_PREFIX = "kept-"  # in the trash: what could not be moved back into a key; never emptied by gc


def empty_trash(trash: Path) -> None:
    """Delete what earlier gcs, killed midway, left in the trash (never the kept-* entries)."""
    try:
        names = os.listdir(trash)
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith(KEPT_PREFIX):
            shutil.rmtree(trash / name, ignore_errors=True)


def remove_key(layout: VolumeLayout, key: KeyInfo, trash: Path, step: Callable[[str], None]) -> bool | str:
    """Rename the key aside, re-check that nobody started using it, then delete it. True when
    deleted; else why it stays (False: someone else removed it already)."""
    source = layout.keys_dir / key.name
    trash.mkdir(parents=True, exist_ok=True)
    target = trash / f"{key.name}.{uuid.uuid4().hex[:8]}"
    try:
        os.rename(source, target)
    except FileNotFoundError:
        return False  # someone else removed it
    step(f"recheck {key.name}")
    booting = {m.key for m in read_boot_markers(layout) if m.live()}
    again = scan_key(target, booting, [], time.time(), name=key.name)
    if again.in_use:
        try:
            os.rename(target, source)
        except OSError:
            # The boot already made a fresh directory for the key: give it back what it lacks.
            if not _merge_back(target, source):
                kept = trash / f"{KEPT_PREFIX}{target.name}"
                os.rename(target, kept)
                return f"{LATE}; what its fresh directory already had is kept in {kept}"
        return LATE
    step(f"delete {key.name}")
    shutil.rmtree(target, ignore_errors=True)
    return True


def _merge_back(old: Path, new: Path) -> bool:
    """Move into `new` every entry of `old` that `new` lacks, directories merged the same way, in
    name order (a staged store's bundles/ before the generations/ that name them). True when `old`
    was emptied (and removed); what is in both stays in `old`."""
    for entry in sorted(os.listdir(old)):
        src, dst = old / entry, new / entry
        if not os.path.lexists(dst):
            os.rename(src, dst)
        elif src.is_dir() and not src.is_symlink() and dst.is_dir() and not dst.is_symlink():
            _merge_back(src, dst)
    try:
        old.rmdir()
    except OSError:
        return False
    return True
