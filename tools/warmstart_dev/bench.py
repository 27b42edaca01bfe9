"""Benchmarks that print JSON. Speed is measured here, never in a timed test.

`bench boot`: warmstart's own overhead. Bare vLLM (same interpreter, same argv, same
cache mapping, started directly) against `warmstart boot`, cold then warm, in one run.
Both are timed the same way, from process launch until an outside poller gets 200 from
/health, so the wrapper's Python start, resolution, key and cache scans all count
against it. Warm pairs alternate to spread the machine's noise over both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from warmstart.engine.ports import free_port
from warmstart.engine.process import engine_command
from warmstart.model import resolve
from warmstart.plan import derive_engine_env, detect_engine_hardware
from warmstart.settings import from_env
from warmstart.store.layout import CacheDirs, VolumeLayout, engine_env
from warmstart.vllm.install import find_vllm_python, probe_engine

from .testmodel import write_test_model

BENCH_MODEL = "warmstart/tiny-llama"
# boot.py's "vLLM serves after" line: seconds before vLLM was started, and the wrapper's own CPU.
_WRAPPER_CPU = re.compile(r"vLLM started ([\d.]+) s into the boot; wrapper CPU ([\d.]+) s")
DEFAULTS = {"MAX_MODEL_LEN": "256", "MAX_NUM_SEQS": "4", "VLLM_CPU_KVCACHE_SPACE": "1"}
GOAL_OVERHEAD_WARM_S = 1.0  # warmstart may add at most this to a warm boot (median of the pairs' sides)
GOAL_OVERHEAD_COLD_S = 2.0  # and this to the cold one


def boot_goal_met(overhead_warm_s: float, overhead_cold_s: float) -> bool:
    """Is warmstart's overhead against bare vLLM within both goals?"""
    return overhead_warm_s <= GOAL_OVERHEAD_WARM_S and overhead_cold_s <= GOAL_OVERHEAD_COLD_S


def _wait_health(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Poll /health until it answers 200 or the process exits; the caller times from its launch."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            return
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"not ready after {timeout:.0f} s")


def _timed_until_ready(
    argv: list[str], env: dict[str, str], port: int, log: Path, timeout: float, *, stop: bool
) -> tuple[float, subprocess.Popen[bytes]]:
    with open(log, "ab") as out:
        launched = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_health(port, proc, timeout)
        if proc.poll() is not None and proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited with {proc.returncode}; see {log}")
        elapsed = time.monotonic() - launched
    if stop:
        os.killpg(proc.pid, 15)
        proc.wait(60)
    return elapsed, proc


def bench_boot(workdir: Path, repeats: int = 2) -> dict[str, Any]:
    if workdir.exists():
        shutil.rmtree(workdir)
    volume = workdir / "volume"
    env_base = {**DEFAULTS, **{k: v for k, v in os.environ.items() if k in DEFAULTS}}
    env_base = {
        **os.environ,
        **env_base,
        "MODEL_NAME": BENCH_MODEL,
        "RUNPOD_VOLUME_PATH": str(volume),
        "WARMSTART_LOCAL_CACHE": str(workdir / "local"),
    }
    layout = VolumeLayout(volume, on_volume=True)
    write_test_model(layout.hub_cache, BENCH_MODEL)

    settings = from_env(env_base)
    engine = probe_engine(find_vllm_python(settings.vllm_python))
    model = resolve(BENCH_MODEL, None, layout.hub_cache, no_download_reason="benchmark")
    hardware = detect_engine_hardware(settings, engine, os.environ).hardware
    port = free_port()
    bare_dirs = CacheDirs(workdir / "bare-cache")
    bare_dirs.create()
    bare_env = {
        **env_base,
        **engine_env(layout, bare_dirs, offline=True),
        **derive_engine_env(hardware, settings),
        "PYTHONUNBUFFERED": "1",
    }
    bare_argv = engine_command(engine, settings, model.path, port)
    warmstart_argv = [str(Path(sys.executable).parent / "warmstart"), "boot", "--json"]
    ws_env = {**env_base, "VLLM_PORT": str(port)}
    timeout = float(os.environ.get("VLLM_STARTUP_TIMEOUT", "900"))

    def bare() -> float:
        return _timed_until_ready(bare_argv, bare_env, port, workdir / "bare.log", timeout, stop=True)[0]

    verdicts: list[str] = []
    wrapper_cpu: list[float] = []
    before_engine: list[float] = []

    def warm_start() -> float:
        log = workdir / "warmstart.log"
        offset = log.stat().st_size if log.exists() else 0
        elapsed, proc = _timed_until_ready(warmstart_argv, ws_env, port, log, timeout, stop=False)
        proc.wait(120)  # `warmstart boot` reports, then stops vLLM itself
        text = log.read_text(errors="replace")[offset:]
        report = json.loads(text.strip().splitlines()[-1])
        verdicts.append(report["verdict"])
        if (m := _WRAPPER_CPU.search(text)) is not None:
            before_engine.append(float(m.group(1)))
            wrapper_cpu.append(float(m.group(2)))
        return elapsed

    bare_cold = bare()
    ws_cold = warm_start()
    bare_warm: list[float] = []
    ws_warm: list[float] = []
    for i in range(repeats):
        # Alternate which side goes first, so drift in the machine's load hits both.
        if i % 2 == 0:
            bare_warm.append(bare())
            ws_warm.append(warm_start())
        else:
            ws_warm.append(warm_start())
            bare_warm.append(bare())
    bare_med = statistics.median(bare_warm)
    ws_med = statistics.median(ws_warm)
    diffs = [w - b for w, b in zip(ws_warm, bare_warm, strict=True)]
    return {
        "benchmark": "boot",
        "model": BENCH_MODEL,
        "vllm_version": engine.vllm,
        "hardware": hardware.slug,
        "warmstart_cache_mode": settings.cache_mode,
        "repeats": repeats,
        "bare_cold_s": round(bare_cold, 2),
        "warmstart_cold_s": round(ws_cold, 2),
        "bare_warm_s": round(bare_med, 2),
        "warmstart_warm_s": round(ws_med, 2),
        "overhead_warm_s": round(ws_med - bare_med, 2),
        "overhead_cold_s": round(ws_cold - bare_cold, 2),
        "warm_ratio": round(ws_med / bare_med, 3),
        "bare_warm_runs_s": [round(x, 2) for x in bare_warm],
        "warmstart_warm_runs_s": [round(x, 2) for x in ws_warm],
        "pair_overheads_s": [round(d, 2) for d in diffs],
        "pair_overhead_median_s": round(statistics.median(diffs), 2),
        "pair_overhead_spread_s": [round(min(diffs), 2), round(max(diffs), 2)],
        "bare_warm_stdev_s": round(statistics.stdev(bare_warm), 2) if len(bare_warm) > 1 else None,
        "warmstart_warm_stdev_s": round(statistics.stdev(ws_warm), 2) if len(ws_warm) > 1 else None,
        "warmstart_before_engine_s": [round(x, 2) for x in before_engine],
        "warmstart_wrapper_cpu_s": [round(x, 2) for x in wrapper_cpu],
        "warmstart_verdicts": verdicts,
        "goal_overhead_warm_s": GOAL_OVERHEAD_WARM_S,
        "goal_overhead_cold_s": GOAL_OVERHEAD_COLD_S,
        "goal_met": boot_goal_met(ws_med - bare_med, ws_cold - bare_cold),
    }


def main(args: argparse.Namespace) -> int:
    if args.bench == "capture":
        from .capturebench import bench_capture, markdown

        result = bench_capture(Path(args.workdir).resolve(), wheel=args.wheel)
        if args.markdown:
            print(markdown(result))
            return 0
    elif args.bench == "boot":
        result = bench_boot(Path(args.workdir).resolve(), repeats=int(os.environ.get("BENCH_REPEATS", "2")))
    elif args.bench == "s3":
        from .s3bench import bench_s3

        result = bench_s3(
            Path(args.workdir).resolve(),
            latency_ms=args.latency_ms,
            mbps=args.mbps,
            server=args.server,
            repeats=int(os.environ.get("BENCH_REPEATS", "3")),
        )
    elif args.bench == "s3-weights":
        from .s3weightsbench import bench_s3_weights

        result = bench_s3_weights(
            Path(args.workdir).resolve(),
            size="tiny" if args.quick else args.size,
            latency_ms=args.latency_ms,
            mbps=args.mbps,
            total_mbps=args.total_mbps,
            server="moto" if args.quick else args.server,
            repeats=1 if args.quick else int(os.environ.get("BENCH_REPEATS", "3")),
            vllm_python=args.vllm_python or str(Path(".vllm-venv/bin/python").absolute()),
        )
    elif args.bench == "chaos":
        from .chaos import bench_chaos

        result = bench_chaos(
            Path(args.workdir).resolve(),
            rounds=args.rounds,
            workers=args.workers,
            fault_rate=args.fault_rate,
            kill_rate=args.kill_rate,
            seed=args.seed,
        )
    elif args.bench == "siblings":
        from .siblingsbench import bench_siblings

        result = bench_siblings(Path(args.workdir).resolve(), pairs=args.pairs)
    elif args.bench == "canary":
        from .canarybench import bench_canary

        result = bench_canary(Path(args.workdir).resolve(), pairs=args.pairs)
    elif args.bench == "compress":
        from .compressbench import bench_compress

        levels = tuple(int(x) for x in args.levels.split(","))
        result = bench_compress([Path(p) for p in args.paths], levels)
    elif args.bench == "logread":
        from .logreadbench import bench_logread

        result = bench_logread(command=not args.no_command)
    elif args.bench == "predict":
        from .predictbench import bench_predict

        result = bench_predict(Path(args.workdir).resolve())
    elif args.bench == "weights":
        from .weightsbench import bench_weights

        result = bench_weights(
            Path(args.workdir).resolve(), repeats=int(os.environ.get("BENCH_REPEATS", "3")), size=args.size
        )
    elif args.bench == "lb":
        from .lbbench import bench_lb

        result = bench_lb(
            Path(args.workdir).resolve(),
            engine=args.engine,
            concurrencies=tuple(int(c) for c in args.concurrency.split(",")),
            rounds=args.rounds,
            num_prompts=args.prompts,
            first_chunk_ms=args.first_chunk_ms,
            chunk_interval_ms=args.chunk_interval_ms,
            front_core=args.front_core,
        )
    elif args.bench == "hostile":
        from .hostilebench import BODY_BYTES, bench_hostile

        result = bench_hostile(
            Path(args.workdir).resolve(),
            senders=tuple(int(n) for n in args.senders.split(",")),
            interval_ms=args.interval_ms,
            body_bytes=args.body_kib * 1024 if args.body_kib else BODY_BYTES,
        )
    elif args.bench == "rehearsal":
        from .rehearsalbench import bench_rehearsal, summary

        result = bench_rehearsal(
            Path(args.workdir).resolve(),
            quick=args.quick,
            tps=tuple(int(t) for t in args.tp.split(",")),
            fronts=tuple(args.fronts.split(",")),
            volumes=tuple(args.volumes.split(",")),
            cold_log=args.cold_log,
            warm_log=args.warm_log,
            speed=args.speed,
            scale=args.scale,
            long_line=args.long_line,
        )
        if not args.runs:
            result = summary(result)
    elif args.bench == "serve":
        from .servebench import bench_api, bench_serve

        if args.api:
            result = bench_api(Path(args.workdir).resolve(), jobs=args.jobs or 30, concurrency=args.concurrency)
        else:
            result = bench_serve(jobs=args.jobs or 3000, concurrency=args.concurrency)
    else:
        from .volumebench import bench_volume

        result = bench_volume(
            Path(args.workdir).resolve(),
            repeats=int(os.environ.get("BENCH_REPEATS", "3")),
            local=Path(args.local).resolve() if args.local else None,
        )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0
