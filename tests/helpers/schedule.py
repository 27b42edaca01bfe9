"""The order `make test` hands files to its workers: the longest first, each behind a short one.

`--dist loadfile` hands each worker a file at a time, in collection order when xdist is told not to
reorder (`--no-loadscope-reorder`; by default it hands out the files with the most tests first). It
hands a worker its next file as soon as the worker holds two tests or fewer (xdist
scheduler/loadscope.py `_reschedule`: `if self._pending_of(self.assigned_work[node]) > 2: return`), so
a file of one long test claims the next file at once, minutes before the worker can run it. In runs
of `404bbe8` and `32fefe7` (three workers, xdist's reorder still on), one long vLLM file ran alone at
the end (the S3 model's, then the canary's).

So the files that boot vLLM go longest first (the classic LPT rule), each followed by one of the
shortest files, and the rest after them, longest first. What a worker claims early is then a short
file of three tests or more; the next long one is claimed only when that short one is down to its
last two, by whichever worker gets there first.

The seconds are each file's setup, call and teardown, summed from one full run's `--durations=0`
(`404bbe8`, 3 workers, 1,483 passed in 1,021 s); files under 15 s count as 0. They only order the
run: a stale figure makes the run longer, never wrong."""

from __future__ import annotations

FILE_SECONDS = {
    "test_boot_vllm.py": 215,
    "store/test_siblings_vllm.py": 189,
    "store/test_canary_vllm.py": 187,
    "store/test_s3.py": 173,
    "store/test_volume_vllm.py": 148,
    "test_boot_vllm_tp.py": 147,
    "vllm/test_vllm_relocation.py": 102,
    "worker/test_lb_e2e.py": 101,
    "store/test_s3_model_vllm.py": 88,
    "worker/test_worker_e2e.py": 85,
    "test_weights.py": 84,
    "tools/test_benches.py": 72,
    "store/test_staged_vllm.py": 62,
    "worker/test_fuzz.py": 60,
    "store/test_odd_volumes.py": 57,
    "worker/test_serve_signals.py": 53,
    "test_boot_vllm_flags.py": 48,
    "store/test_s3_faults.py": 46,
    "vllm/test_vllm033_hash.py": 43,
    "tools/test_capturebench.py": 41,
    "test_model.py": 39,
    "worker/test_lb_lifecycle.py": 37,
    "vllm/test_vllm_hash.py": 29,
    "store/test_staged_volume.py": 28,
    "tools/test_gpucheck.py": 27,
    "vllm/test_flag_parser_property.py": 26,
    "test_docs_commands.py": 25,
    "vllm/test_flagtypes.py": 25,
    "store/test_image_boot.py": 24,
    "vllm/test_inductor_isa_key.py": 22,
    "tools/test_chaos.py": 19,
    "store/test_liveness.py": 19,
    "store/test_canary_boot.py": 18,
    "store/test_deadline.py": 16,
    "vllm/test_releases.py": 16,
    "store/test_volume_tools.py": 16,
    "store/test_s3_model.py": 16,
}


def weight(relative_path: str) -> int:
    """A file's measured seconds (0 when unmeasured), by its path under tests/."""
    return FILE_SECONDS.get(relative_path, 0)


def file_order(files: dict[str, int], boots: set[str]) -> list[str]:
    """The files (paths under tests/ and their test counts, in collection order) in the order to hand
    them out."""
    longest = sorted((f for f in files if f in boots), key=weight, reverse=True)
    # A spacer holds a worker past xdist's "two or fewer" until the long file before it is done.
    others = sorted((f for f in files if f not in boots), key=lambda f: (files[f] < 3, weight(f)))
    spacers, rest = others[: len(longest)], others[len(longest) :]
    interleaved = [f for pair in zip(longest, spacers, strict=False) for f in pair]
    interleaved += longest[len(spacers) :]
    return interleaved + sorted(rest, key=weight, reverse=True)
