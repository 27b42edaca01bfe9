"""`warmstart-dev bench weights`: weights read off an NFS-like volume, with and without warmstart.

The model (about 1 GiB of bf16 in 4 shards, `warmstart-dev testmodel --size`, cached in .bench/models)
lies on the NFS-like mock volume (slowfs: page cache on, a per-stream and an aggregate
bandwidth cap, 3 ms per metadata operation), freshly mounted for every run so that every
run starts with a cold page cache. Compile caches are warm on every side (one unmeasured
boot per side first), so the weights dominate. Three sides, alternating in each round:

    bare            vLLM as warmstart would start it, default flags (lazy mmap)
    bare_prefetch   the same with vLLM's own `--safetensors-load-strategy prefetch`
    warmstart       `warmstart boot` (prefetch while vLLM boots)

`*_ready_s` is launch -> /health 200 seen by this process; `*_weights_s` is vLLM's own
"Loading weights took %.2f seconds" (model_executor/model_loader/default_loader.py); the
bootstrap is launch -> "Starting to load model" on the bare side. `volume_read_s` is a
plain parallel read of the same files on a fresh mount: the floor. Medians of `repeats`.
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
from pathlib import Path
from typing import Any

from warmstart.engine.ports import free_port
from warmstart.engine.process import EngineProcess, LogLine, engine_command
from warmstart.model import resolve
from warmstart.plan import derive_engine_env, detect_engine_hardware
from warmstart.settings import from_env
from warmstart.store.layout import CacheDirs, VolumeLayout, engine_env
from warmstart.vllm.install import find_vllm_python, probe_engine
from warmstart.weights import LOAD_DONE, LOAD_START, STREAMS, Prefetcher, WeightsPlan, weight_files

from .slowfs import NFS_BANDWIDTH_MBPS, NFS_LATENCY_MS, NFS_STREAM_MBPS, nfs_mounted
from .testmodel import parse_size, write_test_model

MODEL = "warmstart/llama-1g"
DEFAULTS = {
    "MAX_MODEL_LEN": "256",
    "MAX_NUM_SEQS": "4",
    "MAX_NUM_BATCHED_TOKENS": "256",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}
# The seconds in the line that ends loading (weights.LOAD_DONE: "Loading weights took %.2f
# seconds", or the V2 runner's "Model loading took %s GiB memory and %.6f seconds").
_SECONDS = re.compile(r"([\d.]+) seconds")


def weights_seconds(text: str) -> float | None:
    """vLLM's own weights time from the first line of `text` that ends loading; None if none does."""
    for line in text.splitlines():
        if (done := LOAD_DONE.search(line)) is not None and (m := _SECONDS.search(line, done.start())) is not None:
            return float(m.group(1))
    return None


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link the cached model into the volume's backing folder (1 GiB, no copy)."""
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(src), str(dst)], check=True)


class Side:
    """One way of booting; collects per-run figures."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: list[float] = []
        self.weights: list[float] = []
        self.bootstrap: list[float] = []
        self.extra: list[dict[str, Any]] = []

    def summary(self) -> dict[str, Any]:
        med = statistics.median
        return {
            "ready_s": round(med(self.ready), 2),
            "weights_s": round(med(self.weights), 2) if self.weights else None,
            "bootstrap_s": round(med(self.bootstrap), 2) if self.bootstrap else None,
            "ready_runs_s": [round(x, 2) for x in self.ready],
            "weights_runs_s": [round(x, 2) for x in self.weights],
        }


def bench_weights(workdir: Path, *, repeats: int = 3, size: str = "1GiB") -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    models = Path(os.environ.get("WARMSTART_BENCH_MODELS", ".bench/models")).resolve()
    t = time.monotonic()
    model = write_test_model(models / "hub", MODEL, size_bytes=parse_size(size))
    model_s = time.monotonic() - t
    backing = workdir / "backing"
    repo = "models--" + MODEL.replace("/", "--")
    _link_tree(model.hub_cache / repo, backing / "huggingface-cache" / "hub" / repo)
    # BENCH_KEEP_CACHES=1 (experiments): keep the warm compile caches of an earlier run, skip the warm-ups.
    keep = os.environ.get("BENCH_KEEP_CACHES") == "1" and (workdir / "bare-cache").exists()
    for stale in ("logs",) if keep else ("bare-cache", "local", "logs"):
        shutil.rmtree(workdir / stale, ignore_errors=True)
    (workdir / "logs").mkdir()
    if not keep:
        shutil.rmtree(backing / "warmstart", ignore_errors=True)  # warmstart's records and staged generations
    mnt = workdir / "volume"

    env_base = {
        **os.environ,
        **DEFAULTS,
        **{k: v for k, v in os.environ.items() if k in DEFAULTS},
        "MODEL_NAME": MODEL,
        "RUNPOD_VOLUME_PATH": str(mnt),
        "WARMSTART_LOCAL_CACHE": str(workdir / "local"),
    }
    settings = from_env(env_base)
    engine = probe_engine(find_vllm_python(settings.vllm_python))
    hardware = detect_engine_hardware(settings, engine, os.environ).hardware
    timeout = float(os.environ.get("VLLM_STARTUP_TIMEOUT", "900"))
    bare_dirs = CacheDirs(workdir / "bare-cache")
    bare_dirs.create()
    layout = VolumeLayout(mnt, on_volume=True)

    with nfs_mounted(backing, mnt):
        resolved = resolve(MODEL, None, layout.hub_cache, no_download_reason="benchmark")
        files = weight_files(resolved.path)
    total = sum(s for _, s in files)

    def bare_argv(port: int, prefetch: bool) -> list[str]:
        argv = engine_command(engine, settings, resolved.path, port)
        return argv + (["--safetensors-load-strategy", "prefetch"] if prefetch else [])

    bare_env = {
        **env_base,
        **engine_env(layout, bare_dirs, offline=True),
        **derive_engine_env(hardware, settings),
        "PYTHONUNBUFFERED": "1",
    }

    def run_bare(side: Side | None, prefetch: bool, tag: str) -> None:
        port = free_port()
        stamps: dict[str, float] = {}

        def on_line(line: LogLine) -> None:
            if "load" not in stamps and LOAD_START.search(line.text):
                stamps["load"] = line.t
            if (seconds := weights_seconds(line.text)) is not None:
                stamps["weights"] = seconds

        with nfs_mounted(backing, mnt), open(workdir / "logs" / f"{tag}.log", "w") as log:
            proc = EngineProcess(bare_argv(port, prefetch), bare_env, port, on_line=on_line, echo=log)
            proc.start()
            try:
                ready = proc.wait_ready(timeout, poll_s=0.1)
            finally:
                proc.stop()
        print(f"bench weights | {tag}: ready {ready:.2f} s, {stamps}", file=sys.stderr, flush=True)
        if side is not None:
            side.ready.append(ready)
            if "weights" in stamps:
                side.weights.append(stamps["weights"])
            if "load" in stamps:
                side.bootstrap.append(stamps["load"])

    def run_warmstart(side: Side | None, tag: str, extra_env: dict[str, str] | None = None) -> None:
        port = free_port()
        log_path = workdir / "logs" / f"{tag}.log"
        argv = [str(Path(sys.executable).parent / "warmstart"), "boot", "--json"]
        with nfs_mounted(backing, mnt), open(log_path, "w") as err, open(log_path.with_suffix(".json"), "w") as out:
            launched = time.monotonic()
            env = {**env_base, **(extra_env or {}), "VLLM_PORT": str(port)}
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err)
            probe = EngineProcess([], {}, port)
            probe.started_mono = launched
            while not probe.healthy(timeout=1.0):
                if proc.poll() is not None:
                    raise RuntimeError(f"warmstart boot exited with {proc.returncode}; see {log_path}")
                if time.monotonic() - launched > timeout:
                    proc.kill()
                    raise TimeoutError(f"warmstart not ready after {timeout:.0f} s")
                time.sleep(0.1)
            ready = time.monotonic() - launched
            proc.wait(300)  # it reports, (staged) publishes, then stops vLLM itself
        report = json.loads(log_path.with_suffix(".json").read_text())
        text = log_path.read_text()
        pre = (report.get("weights") or {}).get("prefetch")
        print(f"bench weights | {tag}: ready {ready:.2f} s, prefetch {pre}", file=sys.stderr, flush=True)
        if side is not None:
            side.ready.append(ready)
            if (seconds := weights_seconds(text)) is not None:
                side.weights.append(seconds)
            side.extra.append({"verdict": report.get("verdict"), "weights": report.get("weights")})

    def volume_read() -> float:
        with nfs_mounted(backing, mnt):
            fresh = tuple(weight_files(resolved.path))
            plan = WeightsPlan(str(resolved.path), "volume", "", fresh, total, "prefetch", "bench", STREAMS)
            reader = Prefetcher(plan)
            t0 = time.monotonic()
            reader.start()
            reader.wait()
            return time.monotonic() - t0

    floor = volume_read()
    print(f"bench weights | volume read {total / 1e6:.0f} MB: {floor:.2f} s", file=sys.stderr, flush=True)
    # Warm-up (not measured): the compile caches of both engines' sides, and warmstart's generation.
    if not keep:
        run_bare(None, False, "warmup-bare")
        run_warmstart(None, "warmup-warmstart")

    bare, bare_pf, ws = Side("bare"), Side("bare_prefetch"), Side("warmstart")
    both = Side("warmstart_vllm_prefetch")  # warmstart plus vLLM's own prefetch flag: the decision's evidence
    flag = {"VLLM_EXTRA_ARGS": "--safetensors-load-strategy prefetch"}
    every = {
        "bare": lambda i: run_bare(bare, False, f"bare-{i}"),
        "bare_prefetch": lambda i: run_bare(bare_pf, True, f"bare_prefetch-{i}"),
        "warmstart": lambda i: run_warmstart(ws, f"warmstart-{i}"),
        "warmstart_vllm_prefetch": lambda i: run_warmstart(both, f"warmstart_vllm_prefetch-{i}", flag),
    }
    chosen = os.environ.get("BENCH_WEIGHTS_SIDES", "bare,bare_prefetch,warmstart").split(",")
    runs = [every[name] for name in chosen]
    for i in range(repeats):
        for j in range(len(runs)):  # rotate the order each round, so drift hits every side
            runs[(i + j) % len(runs)](i)

    if chosen != ["bare", "bare_prefetch", "warmstart"]:  # an experiment: the sides it ran, no goals
        sides = {"bare": bare, "bare_prefetch": bare_pf, "warmstart": ws, "warmstart_vllm_prefetch": both}
        return {"benchmark": "weights", "experiment": chosen, "bytes": total, "volume_read_s": round(floor, 2)} | {
            name: sides[name].summary() for name in chosen
        }
    b, p, w = bare.summary(), bare_pf.summary(), ws.summary()
    result: dict[str, Any] = {
        "benchmark": "weights",
        "model": MODEL,
        "vllm_version": engine.vllm,
        "hardware": hardware.slug,
        "volume": {
            "kind": "slowfs NFS-like (FUSE, page cache on, fresh mount per run)",
            "latency_ms": NFS_LATENCY_MS,
            "stream_mbps": NFS_STREAM_MBPS,
            "aggregate_mbps": NFS_BANDWIDTH_MBPS,
        },
        "engine_flags": {k: env_base[k] for k in DEFAULTS},
        "repeats": repeats,
        "bytes": total,
        "files": len(files),
        "model_write_s": round(model_s, 2),
        "bootstrap_s": b["bootstrap_s"],
        "volume_read_s": round(floor, 2),
        "bare_weights_s": b["weights_s"],
        "bare_ready_s": b["ready_s"],
        "bare_prefetch_weights_s": p["weights_s"],
        "bare_prefetch_ready_s": p["ready_s"],
        "warmstart_weights_s": w["weights_s"],
        "warmstart_ready_s": w["ready_s"],
        "runs": {"bare": b, "bare_prefetch": p, "warmstart": w},
        "warmstart_reports": ws.extra,
    }
    result["goals"] = weights_goals(b, p, w)
    result["goal_met"] = all(result["goals"].values())
    return result


def weights_goals(bare: dict[str, Any], bare_prefetch: dict[str, Any], warmstart: dict[str, Any]) -> dict[str, bool]:
    """The goals, from the three sides' summaries: warmstart's weights phase at most a quarter of
    bare vLLM's and half of vLLM's own prefetch's, and its ready time not above the latter's.
    A side without a weights figure (vLLM never logged one) meets no weights goal."""
    w, b, p = warmstart["weights_s"], bare["weights_s"], bare_prefetch["weights_s"]
    return {
        "weights_at_most_25pct_of_bare": bool(w is not None and b and w <= 0.25 * b),
        "weights_at_most_50pct_of_bare_prefetch": bool(w is not None and p and w <= 0.5 * p),
        "ready_not_above_bare_prefetch": warmstart["ready_s"] <= bare_prefetch["ready_s"],
    }
