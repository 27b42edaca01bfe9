"""The order `make test` hands files to its workers: the longest first, each behind a short one.

`--dist loadfile` hands each worker a file at a time, in collection order when xdist is told not to
reorder (`--no-loadscope-reorder`; by default it hands out the files with the most tests first). It
hands a worker its next file as soon as the worker holds two tests or fewer (xdist
scheduler/loadscope.py `_reschedule`: `if self._pending_of(self.assigned_work[node]) > 2: return`), so
a file of one long test claims the next file at once, minutes before the worker can run it. In runs
of `404bbe8` and `32fefe7` (three workers, xdist's reorder still on), one long vLLM file ran alone at
the end (the S3 model's, then the canary's).

So the files that boot vLLM go longest first (the classic LPT rule), each followed by a short file,
one that mostly waits (`WAITING`) while there are such, and the rest after them: the files that wait,
then those that compute, each longest first. What a worker claims early is then a short file of three
tests or more; the next long one is claimed only when that short one is down to its last two, by
whichever worker gets there first.

The seconds are each file's setup, call and teardown, summed from one full run (`c1a2fa8`, 3 workers,
1,483 passed in 932 s, with a per-test rusage plugin), the three files that now share the run's cold
boot (tests/helpers/sharedboot.py) estimated from a run of those three, and test_boot_vllm_flags.py's boot
counted in the relocation file's since it was folded there; files under 15 s count as 0.
They only order the run: a stale figure makes the run longer, never wrong."""

from __future__ import annotations

FILE_SECONDS = {
    "test_boot_vllm.py": 265,
    "store/test_s3.py": 195,
    "store/test_canary_vllm.py": 190,
    "store/test_siblings_vllm.py": 150,
    "store/test_volume_vllm.py": 160,
    "test_boot_vllm_tp.py": 125,
    "tools/test_benches.py": 110,
    "store/test_s3_model_vllm.py": 140,
    "store/test_staged_vllm.py": 93,
    "worker/test_worker_e2e.py": 91,
    "vllm/test_vllm_relocation.py": 100,
    "worker/test_lb_e2e.py": 84,
    "test_weights.py": 69,
    "store/test_odd_volumes.py": 68,
    "worker/test_fuzz.py": 47,
    "vllm/test_vllm033_hash.py": 47,
    "worker/test_serve_signals.py": 45,
    "tools/test_capturebench.py": 43,
    "vllm/test_inductor_isa_key.py": 43,
    "store/test_s3_faults.py": 40,
    "test_model.py": 35,
    "worker/test_lb_lifecycle.py": 30,
    "store/test_staged_volume.py": 29,
    "vllm/test_vllm_hash.py": 28,
    "tools/test_gpucheck.py": 25,
    "vllm/test_flagtypes.py": 23,
    "test_docs_commands.py": 18,
    "vllm/test_flag_parser_property.py": 17,
    "store/test_liveness.py": 17,
    "tools/test_chaos.py": 17,
    "store/test_image_boot.py": 16,
}


# Files that mostly wait (on sockets, deadlines, a throttled store, a child's signal): their CPU time was
# under 0.4 of their wall time in a run of 2026-12-06 (tests/ run with a per-test rusage plugin, `c1a2fa8`).
# They go out as the spacers, beside the other workers' vLLM boots, which then have the cores to
# themselves, and the rest of them before the files that compute: at the end of the run, they left
# the two cores idle (94 % busy in all; two of under three tests ran last, alone, for 20 s).
WAITING = {
    "worker/test_serve_signals.py",
    "store/test_s3_faults.py",
    "test_model.py",
    "worker/test_lb_lifecycle.py",
    "store/test_staged_volume.py",
    "store/test_liveness.py",
    "tools/test_chaos.py",
    "store/test_deadline.py",
    "store/test_volume_tools.py",
    "store/test_store_faults.py",
    "store/test_siblings.py",
    "vllm/test_engine_faults.py",
    "worker/test_front_pool.py",
    "worker/test_upkeep_faults.py",
}


def weight(relative_path: str) -> int:
    """A file's measured seconds (0 when unmeasured), by its path under tests/."""
    return FILE_SECONDS.get(relative_path, 0)


def file_order(files: dict[str, int], boots: set[str]) -> list[str]:
    """The files (paths under tests/ and their test counts, in collection order) in the order to hand
    them out."""
    longest = sorted((f for f in files if f in boots), key=weight, reverse=True)
    # A spacer holds a worker past xdist's "two or fewer" until the long file before it is done.
    others = sorted((f for f in files if f not in boots), key=lambda f: (files[f] < 3, f not in WAITING, weight(f)))
    spacers, rest = others[: len(longest)], others[len(longest) :]
    interleaved = [f for pair in zip(longest, spacers, strict=False) for f in pair]
    interleaved += longest[len(spacers) :]
    # What waits goes before what computes, so that the last files keep both cores busy.
    return interleaved + sorted(rest, key=lambda f: (f not in WAITING, -weight(f)))
