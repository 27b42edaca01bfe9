"""Signals at every stage, and what a serving worker compiles and holds, with real processes.

Real SIGTERM/SIGKILL to a real `warmstart boot`/`warmstart serve`; the scripted engine
(tests/helpers/fake_vllm_server.py) stands in for vLLM because it can hang, die and "JIT-compile
a kernel while serving" on cue. Each test checks what must not stay behind: no pid of vLLM's
process group alive, no boot marker, no publish lease.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from helpers.run import WARMSTART, base_env, engine_pid, group_alive, paused_env, read_until, start_warmstart
from helpers.worker import Worker
from warmstart.store.volume import StagedStore


def markers(volume: Path) -> list[Path]:
    return list((volume / "warmstart" / "booting").glob("*.json"))


def leases(volume: Path) -> list[Path]:
    return list((volume / "warmstart" / "keys").glob("*/staged/publish.lease"))


def engine_pgid(text: str) -> int:
    return engine_pid(text)


def published_files(volume: Path) -> set[str]:
    """Every file of the newest generation of every key on the volume."""
    out: set[str] = set()
    for staged in (volume / "warmstart" / "keys").glob("*/staged"):
        generation, _ = StagedStore(staged).latest()
        if generation is not None:
            out |= set(generation.files)
    return out


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not after {timeout} s")


def wait_gone(pgid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not group_alive(pgid)


def test_sigterm_while_vllm_boots_stops_its_group_and_the_marker(tmp_path, volume, tiny_model, fake_vllm_python):
    env = base_env(volume, fake_vllm_python, tmp_path, FAKE_VLLM_MODE="hang", VLLM_STARTUP_TIMEOUT="3600")
    proc = start_warmstart(["boot"], env)
    log: list[str] = []
    try:
        pgid = engine_pgid(read_until(proc, "starting vLLM", log))
        # vLLM and its engine core run. Their first lines may come before warmstart's own `starting vLLM`
        # on a loaded machine (the engine writes while warmstart's line waits its turn): read on only if not.
        if not any("Initializing a V1 LLM engine" in line for line in log):
            read_until(proc, "Initializing a V1 LLM engine", log)
        assert markers(volume)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_gone(pgid), "vLLM's process group outlived `warmstart boot`"
    assert markers(volume) == [], "the boot marker stayed: gc would think the key still boots"
    assert proc.returncode == 128 + signal.SIGTERM, "".join(log) + rest
    assert "SIGTERM: stopping vLLM and cleaning up" in rest


def test_ctrl_c_while_vllm_boots_prints_one_line_not_vllms_traceback(tmp_path, volume, tiny_model, fake_vllm_python):
    """vLLM answers a SIGTERM during its init with an ~85-line `KeyboardInterrupt: terminated` traceback
    (0.32's api_server/entry.py `_interrupt_init`; the scripted engine prints its last lines): a user who
    pressed Ctrl-C reads one line for it instead."""
    env = base_env(volume, fake_vllm_python, tmp_path, FAKE_VLLM_MODE="hang", VLLM_STARTUP_TIMEOUT="3600")
    proc = start_warmstart(["boot"], env)
    log: list[str] = []
    try:
        read_until(proc, "Initializing a V1 LLM engine", log)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, "".join(log) + rest
    assert "SIGINT: stopping vLLM and cleaning up" in rest
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    assert re.search(r"vLLM stopped in [\d.]+ s; its [1-9]\d* line\(s\) of shutdown output not shown", rest), rest


def test_sigterm_during_the_restore_removes_the_marker_and_the_registration(
    tmp_path, volume, tiny_model, fake_vllm_python
):
    env = base_env(volume, fake_vllm_python, tmp_path)
    first = subprocess.run([WARMSTART, "boot"], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr  # a generation to restore
    proc = start_warmstart(["boot"], paused_env(env, "restore:registered", tmp_path / "resume"))
    log: list[str] = []
    try:
        read_until(proc, "step     | restore:registered", log)
        assert markers(volume) and list(volume.glob("warmstart/keys/*/staged/readers/*"))
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert markers(volume) == [] and leases(volume) == []
    assert list(volume.glob("warmstart/keys/*/staged/readers/*")) == []
    assert proc.returncode == 128 + signal.SIGTERM


def test_sigterm_during_the_publish_of_boot_releases_the_lease(tmp_path, volume, tiny_model, fake_vllm_python):
    resume = tmp_path / "resume"  # never created: the publish stays paused with the lease held
    env = paused_env(base_env(volume, fake_vllm_python, tmp_path), "publish:lease_held", resume)
    proc = start_warmstart(["boot"], env)
    log: list[str] = []
    try:
        pgid = engine_pgid(read_until(proc, "starting vLLM", log))
        read_until(proc, "step     | publish:lease_held", log)
        assert leases(volume)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert leases(volume) == [], "the publish lease stayed held for its whole TTL"
    assert wait_gone(pgid) and markers(volume) == []
    assert proc.returncode == 128 + signal.SIGTERM


def test_sigterm_during_the_background_publish_of_serve_releases_the_lease(
    tmp_path, volume, tiny_model, fake_vllm_python
):
    env = paused_env({}, "publish:lease_held", tmp_path / "resume")
    worker = Worker(volume, tmp_path, fake_vllm_python, "paused", **env)
    try:
        wait_for(lambda: "step     | publish:lease_held" in worker.log, 60, "the background publish")
        pgid = worker.vllm_pgid()
        assert leases(volume) and markers(volume)
        worker.proc.send_signal(signal.SIGTERM)
        worker.proc.wait(60)
        assert leases(volume) == [], worker.log[-3000:]
        assert wait_gone(pgid) and markers(volume) == []
    finally:
        worker.stop()


def test_sigterm_while_serving_stops_everything(tmp_path, volume, tiny_model, fake_vllm_python):
    worker = Worker(volume, tmp_path, fake_vllm_python, "serving")
    try:
        worker.wait_serving(60)
        pgid = worker.vllm_pgid()
        wait_for(lambda: len(markers(volume)) == 1, 10, "the serving marker")
        assert json.loads(markers(volume)[0].read_text())["state"] == "serving"
        worker.proc.send_signal(signal.SIGTERM)
        worker.proc.wait(60)
        assert wait_gone(pgid) and markers(volume) == [] and leases(volume) == []
    finally:
        worker.stop()


def test_kernels_compiled_while_serving_are_published_without_an_exit(tmp_path, volume, tiny_model, fake_vllm_python):
    worker = Worker(volume, tmp_path, fake_vllm_python, "jit", FAKE_VLLM_JIT_AFTER="2", WARMSTART_SERVE_PUBLISH_S="1")
    try:
        worker.wait_serving(60)
        wait_for(lambda: "JIT compilation during inference" in worker.log, 30, "the JIT warning")
        wait_for(
            lambda: any(f.endswith("fake/jit/kernel.so") for f in published_files(volume)),
            30,
            "the kernel compiled while serving in a generation on the volume",
        )
        (report,) = worker.runsync({"warmstart": "boot_report"})["output"]
        assert report["compiled_while_serving"] == 1
        assert report["compiled_kernels"] == ["_fake_decode_kernel"]
        # SIGKILL: nothing of the worker runs any more, and what it compiled is on the volume already.
        pgid = worker.vllm_pgid()
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(30)
        assert wait_gone(pgid), "vLLM's group outlived a SIGKILLed worker"
    finally:
        worker.stop()
    assert any(f.endswith("fake/jit/kernel.so") for f in published_files(volume))


def test_exit_3_publishes_what_was_compiled_while_serving(tmp_path, volume, tiny_model, fake_vllm_python):
    # The periodic publish is far off (600 s): only the exit's own publish can bring the kernel.
    worker = Worker(
        volume,
        tmp_path,
        fake_vllm_python,
        "dies",
        FAKE_VLLM_MODE="die_after=5",
        FAKE_VLLM_JIT_AFTER="1",
        WARMSTART_SERVE_PUBLISH_S="600",
    )
    try:
        worker.proc.wait(90)
        assert worker.proc.returncode == 3, worker.log[-3000:]
        assert "JIT compilation during inference" in worker.log
        assert any(f.endswith("fake/jit/kernel.so") for f in published_files(volume)), worker.log[-3000:]
        assert markers(volume) == [] and leases(volume) == []
    finally:
        worker.stop()


def test_gc_keeps_the_key_of_a_serving_worker(tmp_path, volume, tiny_model, fake_vllm_python):
    worker = Worker(volume, tmp_path, fake_vllm_python, "kept", WARMSTART_SERVE_PUBLISH_S="1")
    try:
        worker.wait_serving(60)
        time.sleep(1.5)  # served "for a while": everything of the boot is recorded
        env = base_env(volume, fake_vllm_python, tmp_path)
        for option in (["--older-than", "0"], ["--keep-last", "0"]):
            done = subprocess.run(
                [WARMSTART, "gc", *option, "--yes", "--json"], env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            data = json.loads(done.stdout)
            assert data["removed_keys"] == [], data
            (reason,) = data["kept_because"].values()
            assert reason.startswith("in use"), data
        assert list((volume / "warmstart" / "keys").glob("*/manifest.json"))
        (report,) = worker.runsync({"warmstart": "boot_report"})["output"]
        assert report["verdict"] is not None
    finally:
        worker.stop()
