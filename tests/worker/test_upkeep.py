"""The serving upkeep's decisions: what counts as new, when it looks, what a JIT warning does.

The processes themselves (signals, publishes while serving, exit 3, gc) are in test_serve_signals.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from helpers.files import write
from warmstart.report.model import BootReport
from warmstart.worker.upkeep import JIT_SETTLE_S, ServingUpkeep, cache_snapshot, changed

JIT = (
    "(EngineCore_DP0 pid=812) WARNING 05-01 23:11:07 [jit_monitor.py:112] Triton kernel JIT compilation during "
    "inference: _fwd_kernel_stage1 (grid=(8, 32, 1)). This causes a latency spike; consider extending warmup to "
    "cover this shape/config."
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def served_report() -> BootReport:
    return BootReport(None, None, None, None, None, {}, {}, None)


def upkeep(interval_s: float = 60.0) -> tuple[ServingUpkeep, Clock]:
    clock = Clock()
    boot = SimpleNamespace(plan=SimpleNamespace(tiers=("volume",)), published=None)
    return ServingUpkeep(boot, served_report(), interval_s=interval_s, clock=clock), clock  # type: ignore[arg-type]


def test_new_or_rewritten_files_count_removed_ones_do_not():
    before = {"inductor/a.so": (10, 1), "inductor/b.so": (10, 1)}
    assert changed(None, {})
    assert not changed(before, dict(before))
    assert not changed(before, {"inductor/a.so": (10, 1)})  # a publish adds, it never takes away
    assert changed(before, {**before, "triton/c.cubin": (5, 2)})
    assert changed(before, {**before, "inductor/a.so": (12, 3)})


def test_a_writers_temporary_file_is_not_new_a_publish_would_not_take_it(tmp_path: Path):
    triton = tmp_path / "triton"
    write(triton, "ab/kernel.cubin", b"k" * 8)
    boot = SimpleNamespace(plan=SimpleNamespace(cache_dirs=SimpleNamespace(layers=lambda: {"triton": triton})))
    before = cache_snapshot(boot)  # type: ignore[arg-type]
    assert before == {"triton/ab/kernel.cubin": (8, (triton / "ab/kernel.cubin").stat().st_mtime_ns)}
    write(triton, "tmp.pid_4242_1b4e28ba-2fa1-11d2-883f-0016d3cca427/other.cubin", b"half")  # Triton mid-write
    assert not changed(before, cache_snapshot(boot))  # type: ignore[arg-type]
    write(triton, "cd/other.cubin", b"o" * 4)
    assert changed(before, cache_snapshot(boot))  # type: ignore[arg-type]


def test_a_jit_warning_is_counted_and_brings_the_next_look_forward():
    keeper, _ = upkeep()
    keeper.on_line("INFO unrelated line")
    assert keeper.served_report()["compiled_while_serving"] is None
    assert keeper._next_look() == 60.0
    keeper.on_line(JIT)
    served = keeper.served_report()
    assert served["compiled_while_serving"] == 1 and served["compiled_kernels"] == ["_fwd_kernel_stage1"]
    assert keeper.report.compiled_kernels == ("_fwd_kernel_stage1",)
    assert keeper._next_look() == JIT_SETTLE_S


def test_never_two_publishes_closer_than_the_interval():
    keeper, clock = upkeep()
    keeper._last_publish = clock.now - 10.0
    keeper.on_line(JIT)
    assert keeper._next_look() == 50.0  # the interval since the last publish, not the 2 s settle
    assert not keeper._publish_allowed()
    clock.now += 50.0
    assert keeper._publish_allowed()


def test_off_publishes_nothing_but_still_renews_the_marker():
    keeper, _ = upkeep(interval_s=0)
    keeper.on_line(JIT)
    assert keeper._next_look() == keeper.renew_s > 0
    assert not keeper._publish_allowed()
