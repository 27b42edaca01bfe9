"""The canary through whole boots with the scripted engine: recorded cold, replayed warm, and a
generation that answers otherwise distrusted and replaced by a cold reboot before ready.

The scripted engine answers the canary from the first byte of the "kernel" it compiled into
Inductor's cache (tests/helpers/fake_vllm_server.py `canary_answer`): an altered artifact in a
published generation answers otherwise, as a bad cache would. FAKE_VLLM_CANARY_SHIFT changes the
answer whatever the cache holds, as altered weights would. Real vLLM: test_canary_vllm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from helpers.files import write
from helpers.run import base_env, run_warmstart
from warmstart.engine.ports import free_port
from warmstart.store.publish import publish
from warmstart.store.restore import restore
from warmstart.store.volume import StagedStore
from warmstart_dev.testmodel import write_test_model

MODEL = "warmstart/tiny-llama"


def boot(tmp_path: Path, python: str, volume: Path, local: str, **extra: str) -> dict:
    env = base_env(volume, python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / local), FAKE_SERVED=MODEL, **extra)
    done = run_warmstart(["boot", "--json"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout), "log": done.stderr}


@pytest.fixture
def cold(tmp_path: Path, fake_vllm_python: str) -> tuple[Path, dict, StagedStore]:
    volume = tmp_path / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL)
    report = boot(tmp_path, fake_vllm_python, volume, "local-0")
    return volume, report, StagedStore(Path(report["key_dir"]) / "staged")


def altered_generation(store: StagedStore, tmp_path: Path) -> int:
    """A generation whose compiled kernel computes something else, published with valid hashes
    (as a bad artifact would be: its bundle checks out, only its answer differs)."""
    work = tmp_path / "alter" / "cache"
    restore(store, work, reader="alter")
    kernel = next(work.rglob("fake-kernel.so"))
    write(work, str(kernel.relative_to(work)), b"\x01" * 4096)
    result = publish(store, work, publisher="alter", lease_wait_s=0)
    assert result.status == "published"
    assert result.generation is not None
    for number in store.generation_numbers()[:-1]:  # as garbage collection does, publishes later
        store.remove(f"generations/g{number:08d}.json")
    return result.generation


def test_cold_records_and_warm_replays_equal(tmp_path, fake_vllm_python, cold):
    volume, report, store = cold
    assert report["canary"]["status"] == "recorded", report["canary"]
    assert report["canary"]["seconds"] > 0 and report["canary"]["repeat_spread"] == 0.0
    assert report["phases"]["canary"] == round(report["canary"]["seconds"], 3) <= report["ready_s"]
    record = store.load(1).canary
    assert record is not None and len(record["answers"]) == 3 and record["latency_s"] > 0
    warm = boot(tmp_path, fake_vllm_python, volume, "local-1")
    assert warm["canary"]["status"] == "equal", warm["canary"]
    assert warm["canary"]["generation"] == 1
    assert "warmstart | canary" in warm["log"]


def test_an_altered_artifact_is_distrusted_and_the_boot_starts_again_cold(tmp_path, fake_vllm_python, cold):
    volume, _, store = cold
    bad = altered_generation(store, tmp_path)
    warm = boot(tmp_path, fake_vllm_python, volume, "local-1")
    canary = warm["canary"]
    assert (canary["status"], canary["fault"], canary["generation"]) == ("differs", "cache", bad)
    assert f"volume generation {bad} marked distrusted" in canary["actions"]
    assert "its canary equals the record (a cache fault)" in canary["line"]
    assert store.distrusted_numbers() == {bad}
    assert warm["verdict"] != "warm"
    # The cold reboot published a new generation, which answers as the record did.
    assert warm["staged"]["publish"]["status"] == "published"
    newest = store.latest()[0]
    assert newest is not None and newest.number == bad + 1
    assert newest.canary["answers"] == store.load(bad).canary["answers"], "the cold canary equals the record"
    after = boot(tmp_path, fake_vllm_python, volume, "local-2")
    assert after["canary"]["status"] == "equal"
    assert after["canary"]["generation"] == newest.number
    listed = run_warmstart(["ls", "--json"], base_env(volume, fake_vllm_python, tmp_path))
    assert [k["distrusted"] for k in json.loads(listed.stdout)["keys"]] == [[bad]]
    shown = run_warmstart(["ls"], base_env(volume, fake_vllm_python, tmp_path)).stdout
    assert f"(distrusted: {bad})" in shown


def test_a_model_fault_is_told_apart_from_a_cache_fault(tmp_path, fake_vllm_python, cold):
    volume, _, store = cold
    warm = boot(tmp_path, fake_vllm_python, volume, "local-1", FAKE_VLLM_CANARY_SHIFT="3")
    canary = warm["canary"]
    assert (canary["status"], canary["fault"]) == ("differs", "model")
    assert "not a cache fault" in canary["line"]
    assert "the cold canary is recorded with the new generation" in canary["actions"]
    assert store.distrusted_numbers() == {1}
    newest = store.latest()[0]
    assert newest is not None and newest.number == 2
    assert newest.canary["answers"] != store.load(1).canary["answers"], "the cold canary is the new record"


def test_warn_reports_and_serves_and_off_asks_nothing(tmp_path, fake_vllm_python, cold):
    volume, _, store = cold
    warm = boot(tmp_path, fake_vllm_python, volume, "local-1", FAKE_VLLM_CANARY_SHIFT="3", WARMSTART_CANARY="warn")
    assert warm["canary"]["status"] == "differs"
    assert warm["canary"]["actions"] == ["served anyway (WARMSTART_CANARY=warn)"]
    assert warm["verdict"] == "warm" and not store.distrusted_numbers()
    off = boot(tmp_path, fake_vllm_python, volume, "local-2", WARMSTART_CANARY="off")
    assert off["canary"] is None


def test_a_model_that_does_not_generate_text_is_skipped_with_a_line(tmp_path, fake_vllm_python):
    volume = tmp_path / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL)
    report = boot(tmp_path, fake_vllm_python, volume, "local-0", FAKE_VLLM_POOLING="1")
    assert report["canary"]["status"] == "skipped"
    assert "does not generate text (vLLM answered 501" in report["canary"]["line"]
    assert report["verdict"] == "cold" and report["staged"]["publish"]["status"] == "published"


def test_verify_asks_a_running_server_and_compares_with_the_keys_record(tmp_path, fake_vllm_python, cold):
    volume, report, _ = cold
    for shift, code, status in (("0", 0, "equal"), ("5", 1, "differs")):
        port = free_port()
        env = {**os.environ, "FAKE_SERVED": MODEL, "FAKE_VLLM_CANARY_SHIFT": shift}
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / f"inductor-{shift}")
        server = subprocess.Popen(
            [fake_vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_health(port)
            done = run_warmstart(
                ["verify", "--url", f"http://127.0.0.1:{port}", "--json"], base_env(volume, fake_vllm_python, tmp_path)
            )
        finally:
            os.killpg(server.pid, 9)
            server.wait()
        assert done.returncode == code, done.stderr[-2000:]
        out = json.loads(done.stdout)
        assert (out["status"], out["key"], out["generation"]) == (status, report["key"], 1)


def wait_health(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the scripted engine never served")
