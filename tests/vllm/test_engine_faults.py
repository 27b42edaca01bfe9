"""Fault injection with a scripted engine: crash, hang, odd output, and no orphans after stop.

The scripted engine (tests/helpers/fake_vllm_server.py) only stands in for vLLM where a real one
cannot be made to fail on cue; what works is proven with real vLLM in test_boot_vllm.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from helpers.run import alive, base_env, run_warmstart


def pids(pidfile: Path) -> list[int]:
    return [int(p) for p in pidfile.read_text().split()]


def test_crash_before_ready_fails_fast_with_the_log_tail(tmp_path, volume, tiny_model, fake_vllm_python):
    # "Fast" by what it did: the startup timeout is an hour, so an exit at all means the crash
    # was noticed, not waited out (the subprocess timeout only guards against a hang).
    env = base_env(
        volume,
        fake_vllm_python,
        tmp_path,
        FAKE_VLLM_MODE="crash",
        FAKE_VLLM_PIDFILE=str(tmp_path / "pids"),
        VLLM_STARTUP_TIMEOUT="3600",
    )
    result = run_warmstart(["boot", "--json"], env, timeout=120)
    assert result.returncode == 3
    assert "was not ready after" not in result.stderr  # (the timeout's message, engine/process.py)
    assert "vLLM exited with code 1 before it was ready" in result.stderr
    assert "RuntimeError: fake engine crashed on purpose" in result.stderr.split("last lines of vLLM's log")[1]
    assert result.stdout == ""
    boots = list((volume / "warmstart" / "keys").glob("*/boots.jsonl"))
    record = json.loads(boots[0].read_text().splitlines()[-1])
    assert record["error"].startswith("vLLM exited with code 1")
    assert record["verdict"] is None
    assert not any(alive(p) for p in pids(tmp_path / "pids"))


def test_serve_with_an_engine_that_crashes_at_boot_exits_3_with_the_log_tail(
    tmp_path, volume, tiny_model, fake_vllm_python
):
    """`warmstart serve` leaves EngineFailed to cli.dispatch, as `boot` does: the same line, the same status."""
    env = base_env(volume, fake_vllm_python, tmp_path, FAKE_VLLM_MODE="crash", VLLM_STARTUP_TIMEOUT="3600")
    result = run_warmstart(["serve"], env, timeout=120)
    assert result.returncode == 3, result.stderr
    head, _, tail = result.stderr.partition("--- last lines of vLLM's log ---")
    assert "warmstart | engine   | vLLM exited with code 1 before it was ready" in head
    assert "fake engine crashed on purpose" in tail
    assert "EngineFailed" not in result.stderr  # one line, not the wrapper's traceback


def test_hang_times_out_and_leaves_no_process(tmp_path, volume, tiny_model, fake_vllm_python):
    pidfile = tmp_path / "pids"
    env = base_env(
        volume,
        fake_vllm_python,
        tmp_path,
        FAKE_VLLM_MODE="hang",
        VLLM_STARTUP_TIMEOUT="4",
        FAKE_VLLM_PIDFILE=str(pidfile),
    )
    result = run_warmstart(["boot"], env, timeout=60)
    assert result.returncode == 3
    assert "not ready after 4 s (VLLM_STARTUP_TIMEOUT)" in result.stderr
    assert "Initializing a V1 LLM engine" in result.stderr
    time.sleep(0.5)
    assert not any(alive(p) for p in pids(pidfile))


def test_boot_with_scripted_engine_reports_and_stops_everything(tmp_path, volume, tiny_model, fake_vllm_python):
    pidfile = tmp_path / "pids"
    env = base_env(
        volume,
        fake_vllm_python,
        tmp_path,
        FAKE_VLLM_MODE="odd",
        FAKE_VLLM_PIDFILE=str(pidfile),
        HF_TOKEN="hf_tokenthatmustnotleak",
    )
    first = run_warmstart(["boot", "--json"], env, timeout=60)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["expected"] == "miss"
    assert report["verdict"] == "cold"  # the fake "compiled" one file into the Inductor cache
    assert report["caches"]["inductor"]["files_added"] == 1
    assert not any(alive(p) for p in pids(pidfile)), "vLLM or its child survived `warmstart boot`"
    second = json.loads(run_warmstart(["boot", "--json"], env, timeout=60).stdout)
    assert (second["expected"], second["verdict"]) == ("hit", "warm")
    assert second["caches"]["inductor"]["status"] == "hit"
    manifest = json.loads((Path(report["key_dir"]) / "manifest.json").read_text())
    assert manifest["boot_count"] == 2
    assert manifest["key"] == report["key"]
    everything = first.stdout + first.stderr + json.dumps(manifest)
    everything += (Path(report["key_dir"]) / "boots.jsonl").read_text()
    assert "hf_tokenthatmustnotleak" not in everything


def test_no_volume_falls_back_to_local_caches_with_one_warning(tmp_path, tiny_model, volume, fake_vllm_python):
    # The model stays where it is (a local directory); the "volume" path does not exist.
    env = base_env(
        tmp_path / "no-such-volume",
        fake_vllm_python,
        tmp_path,
        MODEL_NAME=str(tiny_model.snapshot),
        WARMSTART_LOCAL_CACHE=str(tmp_path / "local"),
    )
    result = run_warmstart(["boot", "--json"], env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("no volume mounted") == 1
    report = json.loads(result.stdout)
    assert report["on_volume"] is False
    assert report["key_dir"].startswith(str(tmp_path / "local"))
    assert any("no volume" in w for w in report["warnings"])
