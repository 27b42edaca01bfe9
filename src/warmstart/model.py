"""Model resolution: MODEL_NAME (+ MODEL_REVISION) -> one pinned snapshot directory.

The Hub is the slow, flaky part of a boot (a vLLM left to ask an unreachable Hub was
measured stalling 110 s and dying with the model on disk), so resolution reads the HF
cache on the volume by itself first, with no huggingface_hub import and no network:
`refs/<revision>` -> commit -> `snapshots/<commit>/`. Only a snapshot that is missing or
incomplete is downloaded, through huggingface_hub, with progress in the log.

vLLM is then given a *path* (plus `--served-model-name`), never the hub id: with
HF_HUB_OFFLINE vLLM rewrites an id to the snapshot path before hashing (engine/arg_utils.py,
"HF_HUB_OFFLINE is True, replace model_id"). And the path is not the snapshot's own, which
depends on where the snapshot lives (the volume's HF cache, or a copy baked into the image),
but a fixed link to it, `<WARMSTART_LOCAL_CACHE>/models/<org>--<name>/<commit>`: vLLM hashes
`ModelConfig.model` as the string it was given (config/model.py `compute_hash`; no realpath on
the way, `get_model_path` returns an existing path unchanged), so one model keeps one compile
hash wherever its files are.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import log
from .errors import ModelError

HUB_ENDPOINT = "https://huggingface.co"  # huggingface_hub's default, when HF_ENDPOINT is unset

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class SnapshotCheck:
    """What is on disk for one snapshot, and what is missing from it."""

    path: Path
    files: int
    bytes: int
    missing: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.missing and self.files > 0


@dataclass(frozen=True)
class ResolvedModel:
    """A model pinned to one revision on disk."""

    name: str  # what the user asked for (MODEL_NAME)
    repo_id: str | None  # None for a local directory
    revision: str  # the commit, or "local-<hash>" for a directory
    path: Path
    source: Literal["hf-cache", "downloaded", "local-dir", "s3"]
    files: int
    bytes: int
    downloaded_bytes: int = 0
    seconds: float = 0.0


def repo_dir(hub_cache: Path, repo_id: str) -> Path:
    return hub_cache / ("models--" + repo_id.replace("/", "--"))


def cached_repo_dir(hub_cache: Path, repo_id: str) -> Path:
    """The repo's folder in `hub_cache` as it is stored: the Hub's casing first, then lower-cased.

    Runpod's cached models and pre-filled volumes store a repo under a lower-cased folder
    (`models--qwen--qwen2.5-...`) while users write MODEL_NAME in the Hub's casing; worker-vllm
    looks for both (its fa42ecd). Falls back to the exact folder when neither exists.
    """
    exact = repo_dir(hub_cache, repo_id)
    if exact.is_dir():
        return exact
    lower = repo_dir(hub_cache, repo_id.lower())
    return lower if lower.is_dir() else exact


_LFS_BLOB = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class HashCheck:
    """A snapshot's files against the SHA-256 the Hub recorded for them (LFS files only)."""

    checked: tuple[str, ...]  # files whose blob is named by its SHA-256 (the Hub's LFS oid)
    differ: tuple[str, ...]  # of those, the ones whose bytes hash to another value
    unchecked: int  # files with no recorded SHA-256 (git blobs are named by their SHA-1) or no blob


def check_snapshot_hashes(path: Path) -> HashCheck:
    """Hash every file of a Hub snapshot whose blob is named by a SHA-256: huggingface_hub names an
    LFS file's blob by its SHA-256 (file_download.py: `blob_path = os.path.join(storage_folder, "blobs",
    etag)`, the etag of an LFS file being the Hub's `X-Linked-Etag`, its SHA-256), so a
    weight altered in place under the same revision no longer hashes to its own name. For the canary
    (canary.py): a cold boot whose answer differs from the record, with the weights to blame or not."""
    checked: list[str] = []
    differ: list[str] = []
    unchecked = 0
    for entry in sorted(path.rglob("*")):
        rel = entry.relative_to(path).as_posix()
        if not entry.is_file():
            continue
        blob = entry.resolve()
        if not entry.is_symlink() or not _LFS_BLOB.match(blob.name):
            unchecked += 1
            continue
        digest = hashlib.sha256()
        with open(blob, "rb") as handle:
            while chunk := handle.read(8 * 1024 * 1024):
                digest.update(chunk)
        checked.append(rel)
        if digest.hexdigest() != blob.name:
            differ.append(rel)
    return HashCheck(tuple(checked), tuple(differ), unchecked)


def check_snapshot(path: Path) -> SnapshotCheck:
    """Decide from the files alone whether a snapshot can be served without the Hub.

    The HF cache records no list of a repo's files, so completeness is judged by what
    a loader needs: config.json, every symlink resolving to a blob, and every weight
    shard that an index names (or at least one weight file when there is no index).
    """
    if not path.is_dir():
        return SnapshotCheck(path, 0, 0, ("snapshot directory",))
    missing: list[str] = []
    files = 0
    size = 0
    names: set[str] = set()
    for entry in sorted(path.rglob("*")):
        rel = entry.relative_to(path).as_posix()
        if entry.is_symlink() and not entry.exists():
            missing.append(f"{rel} (dangling link: its blob is missing)")
            continue
        if entry.is_file():
            files += 1
            size += entry.stat().st_size
            names.add(rel)
    if "config.json" not in names and "params.json" not in names:
        missing.append("config.json")
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index_name in names:
            try:
                weight_map = json.loads((path / index_name).read_text())["weight_map"]
            except (OSError, ValueError, KeyError) as exc:
                missing.append(f"{index_name} (unreadable: {exc})")
                continue
            for shard in sorted(set(weight_map.values())):
                if shard not in names:
                    missing.append(shard)
            break
    else:
        weights = [n for n in names if n.endswith((".safetensors", ".bin", ".pt", ".gguf"))]
        if not weights:
            missing.append("weights (*.safetensors)")
    return SnapshotCheck(path, files, size, tuple(missing))


def resolve_commit(hub_cache: Path, repo_id: str, revision: str | None) -> str | None:
    """The commit a revision points to in the local cache, or None if unknown here.

    `refs/<revision>` when present. A cache written without refs (some pre-filled volumes hold
    only `snapshots/`) gives, for the default revision, its only snapshot; with several, the most
    recently written one, and the log says which was taken and why.
    """
    rev = revision or "main"
    if _COMMIT.match(rev):
        return rev
    folder = cached_repo_dir(hub_cache, repo_id)
    try:
        commit = (folder / "refs" / rev).read_text().strip()
    except OSError:
        commit = ""
    if _COMMIT.match(commit):
        return commit
    if revision not in (None, "main") or (folder / "refs" / rev).exists():
        return None
    try:
        snapshots = [d for d in (folder / "snapshots").iterdir() if d.is_dir() and _COMMIT.match(d.name)]
    except OSError:
        return None
    if not snapshots:
        return None
    if len(snapshots) > 1:
        snapshots.sort(key=lambda d: (d.stat().st_mtime, d.name))
        log.warning(
            "model",
            "%s: no refs/%s in %s and %d snapshots; taking the most recently written, %s "
            "(set MODEL_REVISION to a commit to choose)",
            repo_id,
            rev,
            folder,
            len(snapshots),
            snapshots[-1].name[:12],
        )
    return snapshots[-1].name


def local_revision(path: Path) -> str:
    """A stable revision for a local directory: names, sizes and config.json's bytes."""
    digest = hashlib.sha256()
    for entry in sorted(path.rglob("*")):
        if entry.is_file():
            digest.update(f"{entry.relative_to(path).as_posix()}\0{entry.stat().st_size}\0".encode())
    config = path / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    return "local-" + digest.hexdigest()[:12]


def resolve(
    name: str,
    revision: str | None,
    hub_cache: Path,
    *,
    token: str | None = None,
    no_download_reason: str | None = None,
    read_only_caches: tuple[Path, ...] = (),
    stall_s: float = 20.0,
    hub_endpoint: str | None = None,
) -> ResolvedModel:
    """Pin `name` to a complete snapshot, downloading only if no cache can serve it.

    `hub_cache` (the volume's) is looked at first and is where downloads go;
    `read_only_caches` (a model baked into the image) are looked at next. With
    `no_download_reason` set, a missing snapshot is an error that gives that reason.
    """
    start = time.monotonic()
    if name.startswith("/"):
        path = Path(name)
        check = check_snapshot(path)
        if not check.complete:
            raise ModelError(
                f"MODEL_NAME={name}: local model directory is not usable: missing {', '.join(check.missing)}"
            )
        return ResolvedModel(
            name,
            None,
            local_revision(path),
            path,
            "local-dir",
            check.files,
            check.bytes,
            seconds=time.monotonic() - start,
        )

    reason = ""
    for cache in (hub_cache, *read_only_caches):
        commit = resolve_commit(cache, name, revision)
        if commit is None:
            reason = reason or f"revision {revision or 'main'!r} is not in the cache at {hub_cache}"
            continue
        check = check_snapshot(cached_repo_dir(cache, name) / "snapshots" / commit)
        if check.complete:
            return ResolvedModel(
                name,
                name,
                commit,
                check.path,
                "hf-cache",
                check.files,
                check.bytes,
                seconds=time.monotonic() - start,
            )
        reason = reason or f"snapshot {commit[:12]} is incomplete (missing {', '.join(check.missing[:5])})"

    if no_download_reason is not None:
        raise ModelError(f"{name}: {reason}, and downloading is disabled ({no_download_reason})")
    log.info("model", "%s: %s; downloading from the Hub", name, reason)
    path = download(name, revision, hub_cache, token=token, stall_s=stall_s, hub_endpoint=hub_endpoint)
    check = check_snapshot(path)
    if not check.complete:
        raise ModelError(f"{name}: downloaded snapshot is still incomplete: missing {', '.join(check.missing)}")
    commit = path.name
    return ResolvedModel(
        name,
        name,
        commit,
        path,
        "downloaded",
        check.files,
        check.bytes,
        downloaded_bytes=check.bytes,
        seconds=time.monotonic() - start,
    )


class DownloadProgress:
    """Log a download's progress from the bytes landing in the repo's blobs folder.

    huggingface_hub's own bars count files (its `tqdm_class` is not given to each file), so a
    20 GB model in 4 shards would show "0/4" for minutes; the blobs folder, `.incomplete`
    files included, grows byte by byte whatever the transfer backend.
    """

    def __init__(self, repo_id: str, blobs: Path, interval_s: float = 5.0) -> None:
        self.repo_id = repo_id
        self.blobs = blobs
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="download-progress", daemon=True)
        self.start_bytes = self.size()

    def size(self) -> int:
        total = 0
        try:
            for entry in os.scandir(self.blobs):
                try:
                    total += entry.stat().st_size
                except OSError:
                    continue
        except OSError:
            pass
        return total

    def report(self) -> None:
        log.info("model", "download %s: %.1f MB so far", self.repo_id, (self.size() - self.start_bytes) / 1e6)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.report()

    def __enter__(self) -> DownloadProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.report()


def download(
    repo_id: str,
    revision: str | None,
    hub_cache: Path,
    *,
    token: str | None,
    stall_s: float = 20.0,
    hub_endpoint: str | None = None,
) -> Path:
    """snapshot_download into the volume's hub cache, logging progress every few seconds.

    Bounded by warmstart, not by huggingface_hub: its metadata calls (`repo_info`,
    `list_repo_tree`) go out with `timeout=None` on a client made with `timeout=None`
    (huggingface_hub 2.4 utils/_http.py, hf_api.py), and HF_HUB_ETAG_TIMEOUT /
    HF_HUB_DOWNLOAD_TIMEOUT cover only the file requests. Against a Hub that accepts and never
    answers, `warmstart fetch` was measured still waiting after 300 s. So the download runs
    on a thread, and if `stall_s` pass with no byte landing in the blobs folder it fails here
    with one line; the abandoned thread dies with the process, which ends on this error.
    """
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise ModelError(f"huggingface_hub is needed to download {repo_id}: {exc}") from exc

    paths: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            paths.append(snapshot_download(repo_id, revision=revision, cache_dir=str(hub_cache), token=token))
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    with DownloadProgress(repo_id, repo_dir(hub_cache, repo_id) / "blobs") as progress:
        thread = threading.Thread(target=run, name="hub-download", daemon=True)
        thread.start()
        size, changed = progress.size(), time.monotonic()
        while thread.is_alive():
            thread.join(timeout=min(1.0, stall_s / 4))
            if (now := progress.size()) != size:
                size, changed = now, time.monotonic()
            elif thread.is_alive() and time.monotonic() - changed > stall_s:
                raise ModelError(
                    f"{repo_id}: download failed: the Hub at {hub_endpoint or HUB_ENDPOINT} sent nothing "
                    f"for {stall_s:.0f} s "
                    "(WARMSTART_HUB_TIMEOUT_S); is it reachable from this worker?"
                )
    if errors:
        exc = errors[0]
        raise ModelError(f"{repo_id}: download failed: {type(exc).__name__}: {exc}") from exc
    return Path(paths[0])


def vllm_model_path(model: ResolvedModel, local_cache: Path) -> Path:
    """The path vLLM is given for `model`: the same on every boot of the same model and commit.

    A hub model gets a link under the local cache (see `link_model`), whichever HF cache holds
    the snapshot. A local directory is named by the user and is its own stable path.
    """
    if model.repo_id is None:
        return model.path
    return local_cache / "models" / model.repo_id.replace("/", "--") / model.revision


def link_model(link: Path, target: Path) -> bool:
    """Point `link` at `target` (atomically: a temporary link renamed over it). True if it changed.

    Nothing is done when `link` is `target` itself (a local directory) or already points there.
    """
    if link == target:
        return False
    try:
        if link.is_symlink() and os.readlink(link) == str(target):
            return False
    except OSError:
        pass
    link.parent.mkdir(parents=True, exist_ok=True)
    temporary = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)
    os.symlink(target, temporary, target_is_directory=True)
    os.replace(temporary, link)
    return True
