"""vLLM's boot log lines in every CUDA release from 0.27.1 to 0.33.0: which wording each release prints.

0.27.1 is the vLLM of runpod-workers/worker-vllm today, so where users who move to warmstart come
from; 0.33.0 is logformats.py's CUDA table. Every entry is a string of that release's own source,
in the file named beside it, read from the release's wheel on PyPI (`pip download vllm==X
--no-deps`); tests/test_releases.py checks each table against each release's wheel.

What changed between them (an entry's `since`/`until` say where):
- 0.33.0 moved the API server's "non-default args" line to entrypoints/common/startup.py.
- 0.32.0 put the `%s` tag (`[backbone] `, an encoder's name) before every compile line; older
  releases print the same words without it (the patterns match both alike).
- 0.32.0 added "Starting torch.compile"; 0.33.0 the FlashInfer autotune cache lines.
- 0.30.0 joined "GPU KV cache size" and "Maximum concurrency" into one line.
- 0.29.0 added the JIT kernel warm-up lines and moved "Starting vLLM server on" to the launchers.
- 0.28.0 wrote "GiB memory" in the V2 runner's "Model loading took".
A release with no table here is read with the nearest one (and every older wording logformats.py
knows); the report says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .logformats import CAPTURE_BARS, COMMON, COMMON_033, CUDA_RUNNER, FLASHINFER, LogFormat, MarkerSpec

RELEASES: tuple[str, ...] = ("0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")


def _key(version: str) -> tuple[int, int, int]:
    """`0.30.1rc2.dev5` -> (0, 30, 1): the leading number of each of the first three parts."""
    parts = [int(m.group()) if (m := re.match(r"\d+", piece)) else 0 for piece in version.split(".")[:3]]
    major, minor, patch = [*parts, 0, 0, 0][:3]
    return major, minor, patch


@dataclass(frozen=True)
class Wording:
    """One marker as the releases `since` .. `until` (inclusive) print it."""

    spec: MarkerSpec
    since: str = RELEASES[0]
    until: str = RELEASES[-1]

    def covers(self, release: str) -> bool:
        return _key(self.since) <= _key(release) <= _key(self.until)


_TAGGED = {  # compile lines that carry the `%s` tag from 0.32.0
    "compile_cache_dir",
    "compile_cache_disabled",
    "dynamo",
    "graph_compiled",
    "graph_loaded",
    "aot_loaded",
    "aot_saved",
    "aot_save_failed",
    "aot_load_failed",
    "compile_total",
    "compile_total_with_warmup",
    "profile_run",
}
_SINCE = {
    "compile_start": "0.32.0",
    "kv_size": "0.30.0",
    "jit_warmup_start": "0.29.0",
    "jit_warmup_done": "0.29.0",
    "autotune_run": "0.30.0",
    "autotune_start": "0.33.0",
    "autotune_managed_start": "0.33.0",
}


def _wordings() -> tuple[Wording, ...]:
    out: list[Wording] = []
    for spec in COMMON + CUDA_RUNNER + CAPTURE_BARS + FLASHINFER:
        if spec.name in _TAGGED and spec.fmt.startswith("%s"):
            untagged = MarkerSpec(spec.name, spec.source, spec.fmt[2:], spec.anchored)
            out += [Wording(untagged, until="0.31.0"), Wording(spec, since="0.32.0")]
        elif spec.name == "server_start":
            old = MarkerSpec(spec.name, "entrypoints/openai/api_server.py", spec.fmt, spec.anchored)
            out += [Wording(old, until="0.28.0"), Wording(spec, since="0.29.0")]
        elif spec.name == "engine_args":  # moved by 0.33.0
            moved = next(s for s in COMMON_033 if s.name == "engine_args")
            out += [Wording(spec, until="0.32.0"), Wording(moved, since="0.33.0")]
        elif spec.name == "model_loaded":
            old = MarkerSpec(spec.name, spec.source, "Model loading took %s GiB and %.6f seconds", spec.anchored)
            out += [Wording(old, until="0.27.1"), Wording(spec, since="0.28.0")]
        else:
            out.append(Wording(spec, since=_SINCE.get(spec.name, RELEASES[0])))
    # Before 0.30.0 the KV cache size had a line of its own.
    out.append(
        Wording(MarkerSpec("kv_size", "v1/core/kv_cache_utils.py", "GPU KV cache size: %s tokens"), until="0.29.0")
    )
    return tuple(out)


WORDINGS: tuple[Wording, ...] = _wordings()

CUDA_RELEASES: dict[str, LogFormat] = {
    release: LogFormat(f"cuda-{release}", (release,), "cuda", tuple(w.spec for w in WORDINGS if w.covers(release)))
    for release in RELEASES
}


def nearest_release(version: str) -> tuple[str, bool]:
    """The release whose table reads a vLLM version's log, and whether it is that version's own.

    A dev or post build of a release ("0.30.0.dev5", "0.30.1") is read with its release's table where
    one exists, else with the nearest release by version number."""
    key = _key(version)
    base = ".".join(map(str, key))
    if base in CUDA_RELEASES:
        return base, True
    nearest = min(RELEASES, key=lambda r: tuple(abs(a - b) for a, b in zip(_key(r), key, strict=True)))
    return nearest, False


def release_note(version: str | None) -> str | None:
    """The report's line for a version without a table of its own (None where it has one, or is unknown)."""
    if not version:
        return None
    release, exact = nearest_release(version)
    if exact:
        return None
    return (
        f"vLLM {version} has no marker table of its own: its log was read with the nearest release's "
        f"(cuda-{release}) and every older wording known"
    )
