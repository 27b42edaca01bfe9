"""`warmstart-dev bench rehearsal`: the wrapper's own cost on a GPU-shaped boot, over the rehearsal engine.

The real `warmstart boot` and `warmstart serve` (queue: runpod's local API server; load_balancer: `/ping`)
start the rehearsal engine (rehearsal.py) in vLLM 0.33's place, on a machine that a fake `nvidia-smi`
shows as 8 H100s, so the wrapper plans, keys, reads the log and stores the caches as on a GPU worker.
Each (front, TP, volume) gets a volume of its own: a cold boot (the tree written and published), then a
warm one from a fresh local disk (restored, nothing written). Volumes: a local folder, and the slow mock
volume (slowfs: a FUSE passthrough adding round trips and capping bandwidth). Per boot it reports:

- `log_cpu_s`, `log_cpu_share`: the wrapper's CPU (its own threads: /proc/PID/stat utime+stime, which
  leaves the engine, a child, out) from the engine's first line to its ready line, or to the wrapper's
  handling of the lines written until then where that comes later: the window holds the
  log reader, the health poll and the front, and neither restore (before) nor publish (after). The share
  is of the recorded boot's length (the window times the replay's speed), the budget's terms;
- `lag_ms`: p50, p99 and max from the engine's write of a line (CLOCK_MONOTONIC, system-wide, stamped
  just before the write) to the wrapper's return from handling it (`Boot._on_line`, wrapped by the probe
  this bench launches the wrapper with; the probe's own cost, a line of a file per line, is in the CPU);
- `phases`: the live report's engine phases (times the speed) against `warmstart report` of the same file
  and the figures the log itself states (the compile total, init engine);
- `restore_s`, `publish_s`, against one sequential read of the tree's bytes off the same volume;
- `peak_rss_mb`: the wrapper's VmHWM;
- `ready_to_serving_ms`: from the replayed ready line's write to the wrapper's own ready (boot), to `/ping`
  200 (load_balancer), to the first job answered through runpod's API (queue).

Budgets (issue 37, on the shared 2-core machine): lag p99 <= 20 ms and max <= 200 ms with lines up to
1 MB (`--long-line`); the wrapper's CPU for the log path <= 1 % of the boot. The rehearsal never proves
that vLLM works: no GPU ran, nothing was compiled (docs/rehearsal.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from warmstart.engine.ports import free_port

from .rehearsal import DEFAULT_COLD, DEFAULT_WARM, PAIR_BYTES, fake_nvidia_smi, plan_tree, rehearsal_vllm_python

BUDGET_LAG_P99_MS = 20.0
BUDGET_LAG_MAX_MS = 200.0
BUDGET_LOG_CPU_SHARE = 0.01
FRONTS = ("boot", "queue", "load_balancer")
VOLUMES = ("local", "slowfs")
ENGINE_PHASES = (
    "bootstrap",
    "weights",
    "compile",
    "first_forward",
    "kv_cache",
    "kernel_warmup",
    "autotune",
    "cudagraph",
)
REPORT_JSON = "warmstart | report   | json "
MODEL = "warmstart/tiny-llama"
# What a deployed worker has set: its Hub token and Runpod's key. Made up; each makes the redactor search every
# line (a 1 MB line too) for its spellings, as a real worker's does, and neither may reach a log.
SECRETS = {
    "HF_TOKEN": "hf_RehearsalTokenNotReal0123456789abcd",
    "RUNPOD_AI_API_KEY": "rpa_REHEARSALKEYNOTREAL0123456789ABCDEFGHIJ",
}
PUBLISHED = re.compile(r"publish  \| volume generation \d+: \d+ files \(([\d.]+) MB\) in ([\d.]+) s")

# The wrapper, with the probe: each line's handling time, and when the wrapper itself saw vLLM ready.
LAUNCH = """
import sys
from warmstart_dev.rehearsalbench import install_probe
install_probe(sys.argv.pop(1))
sys.argv[0] = "warmstart"
from warmstart.cli import main
sys.exit(main())
"""


def install_probe(path: str) -> None:
    """Wrap `Boot._on_line` and `Boot.wait_ready` to append `<ns>\\t<crc32>\\t<len>` per line handled, and
    `<ns>\\tready` when the wrapper saw vLLM serve, to `path`. (Where parsing moves off the pipe's thread,
    the wrapped method must be the one that finishes a line's handling.)"""
    from warmstart.boot import Boot

    out = open(path, "a", buffering=1)
    on_line, wait_ready = Boot._on_line, Boot.wait_ready

    def probed_on_line(self: Boot, line: Any) -> None:
        on_line(self, line)
        data = line.text.encode()
        out.write(f"{time.clock_gettime_ns(time.CLOCK_MONOTONIC)}\t{zlib.crc32(data[:PAIR_BYTES])}\t{len(data)}\n")

    def probed_wait_ready(self: Boot) -> float:
        result = wait_ready(self)
        out.write(f"{time.clock_gettime_ns(time.CLOCK_MONOTONIC)}\tready\n")
        return result

    Boot._on_line = probed_on_line  # type: ignore[method-assign]
    Boot.wait_ready = probed_wait_ready  # type: ignore[method-assign]


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None, "lines": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 3), "lines": len(ordered)}


def read_stamps(path: Path) -> tuple[list[tuple[int, int, int]], int | None]:
    """The engine's stamps: [(ns, crc, len)] and the ready line's ns."""
    rows, ready = [], None
    if path.exists():
        for line in path.read_text().splitlines():
            ns, crc, length, mark = line.split("\t")
            rows.append((int(ns), int(crc), int(length)))
            if mark == "ready" and ready is None:
                ready = int(ns)
    return rows, ready


def read_probe(path: Path) -> tuple[list[tuple[int, int, int]], int | None]:
    rows, ready = [], None
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if parts[1] == "ready":
                ready = ready or int(parts[0])
            else:
                rows.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return rows, ready


def lags_ms(
    written: Sequence[tuple[int, int, int]], handled: Sequence[tuple[int, int, int]]
) -> tuple[list[float], int]:
    """Each handled line against the earliest unmatched write of the same head (the crc of its first PAIR_BYTES:
    the wrapper reads a long line by its head, so the lengths differ); (lags, lines never handled)."""
    pending: dict[int, deque[int]] = defaultdict(deque)
    for ns, crc, _length in written:
        pending[crc].append(ns)
    lags = []
    for ns, crc, _length in handled:
        queue = pending.get(crc)
        if queue:
            lags.append((ns - queue.popleft()) / 1e6)
    return lags, sum(len(q) for q in pending.values())


class Sampler:
    """The wrapper's CPU seconds (its own threads) and VmHWM, every `period_s`, with CLOCK_MONOTONIC."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        self.pid, self.period_s = pid, period_s
        self.samples: list[tuple[int, float]] = []
        self.hwm_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            try:
                stat = Path(f"/proc/{self.pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                cpu = (int(fields[11]) + int(fields[12])) / tick
                status = Path(f"/proc/{self.pid}/status").read_text()
                if m := re.search(r"VmHWM:\s+(\d+) kB", status):
                    self.hwm_kb = max(self.hwm_kb, int(m.group(1)))
            except (OSError, ValueError):
                return  # the wrapper has exited
            self.samples.append((time.clock_gettime_ns(time.CLOCK_MONOTONIC), cpu))
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def cpu_at(self, ns: int) -> float | None:
        """The CPU reading last taken at or before `ns` (None before the first)."""
        before = [cpu for t, cpu in self.samples if t <= ns]
        return before[-1] if before else None


def _get(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def _post_job(url: str) -> bool:
    body = json.dumps({"input": {"prompt": "rehearsal", "sampling_params": {"max_tokens": 2}}}).encode()
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status == 200 and json.loads(resp.read()).get("status") == "COMPLETED"
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_serving(front: str, port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """Poll the front until it serves (/ping 200; a job answered); the CLOCK_MONOTONIC ns of that answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if front == "load_balancer" and _get(f"http://127.0.0.1:{port}/ping") == 200:
            return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if front == "queue" and _post_job(f"http://127.0.0.1:{port}/runsync"):
            return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        time.sleep(0.01)
    return None


def last_report(log_text: str) -> dict[str, Any] | None:
    for line in reversed(log_text.splitlines()):
        if REPORT_JSON in line:
            return json.loads(line.split(REPORT_JSON, 1)[1])
    return None


def log_figures(path: Path) -> dict[str, Any]:
    """`warmstart report` of the file (its phases), and the totals the log states in its own words."""
    from warmstart.report.fromlog import report_from_log

    text = path.read_text(errors="replace")
    report = report_from_log(text.splitlines())
    stated = {}
    for name, pattern in (
        ("torch_compile_total_s", r"torch\.compile (?:took|takes) ([\d.]+) s in total"),
        ("init_engine_s", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
        ("weights_s", r"Loading weights took ([\d.]+) seconds"),
        ("graph_capture_s", r"Graph capturing finished in ([\d.]+) secs"),
    ):
        if m := re.search(pattern, text):
            stated[name] = float(m.group(1))
    return {"phases": {k: report.phases.get(k) for k in ENGINE_PHASES}, "stated": stated}


def compare_phases(live: dict[str, Any], from_file: dict[str, Any], speed: float) -> dict[str, Any]:
    """Each engine phase: the live report's (times the replay's speed: recorded seconds) against the file's."""
    out = {}
    for name in ENGINE_PHASES:
        a, b = live.get(name), from_file["phases"].get(name)
        if a is None and b is None:
            continue
        scaled = round(a * speed, 2) if a is not None else None
        out[name] = {
            "live_x_speed": scaled,
            "log": b,
            "diff_s": round(scaled - b, 2) if None not in (scaled, b) else None,
        }
    return out


def sequential_read_s(directory: Path, size: int) -> float:
    """One sequential read of `size` bytes from a file in `directory` (written first, not timed)."""
    path = directory / "sequential.bin"
    with open(path, "wb") as handle:
        left = size
        while left:
            n = min(left, 16 << 20)
            handle.write(os.urandom(n))
            left -= n
    buf = bytearray(8 << 20)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(buf):
            pass
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def run_one(
    front: str,
    volume: Path,
    local: Path,
    env_base: dict[str, str],
    workdir: Path,
    name: str,
    speed: float,
    timeout_s: float,
) -> dict[str, Any]:
    """One boot through `front`, from launch until it serves (serve fronts: then SIGTERM and its exit)."""
    stamps, probe, log_path = workdir / f"{name}.stamps", workdir / f"{name}.probe", workdir / f"{name}.log"
    port = free_port()
    env = {
        **env_base,
        "RUNPOD_VOLUME_PATH": str(volume),
        "WARMSTART_LOCAL_CACHE": str(local),
        "REHEARSAL_STAMPS": str(stamps),
    }
    argv = [sys.executable, "-c", LAUNCH, str(probe)]
    if front == "boot":
        argv += ["boot", "--json"]
    elif front == "queue":
        argv += ["serve", "--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", str(port)]
    else:
        argv += ["serve"]
        env.update({"WARMSTART_ENDPOINT_TYPE": "load_balancer", "WARMSTART_HTTP_HOST": "127.0.0.1", "PORT": str(port)})
    launched = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    sampler = Sampler(proc.pid)
    served_ns = None
    try:
        if front == "boot":
            proc.wait(timeout_s)
        else:
            served_ns = wait_serving(front, port, proc, timeout_s)
            time.sleep(0.5)  # a last CPU sample after serving
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout_s)  # the upkeep's final publish runs before the exit
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        sampler.stop()
    wall = time.monotonic() - launched
    text = log_path.read_text(errors="replace")
    report = last_report(text) or {}
    written, ready_line = read_stamps(stamps)
    handled, wrapper_ready = read_probe(probe)
    lags, unhandled = lags_ms(written, handled)
    first = written[0][0] if written else None
    cpu_first = sampler.cpu_at(first) if first else None
    # Until the wrapper has handled every line written up to the ready line (a backlog of slow lines
    # is handled after it was written), and no earlier than that line's write.
    before_ready = sum(1 for ns, _, _ in written if ready_line and ns <= ready_line)
    handled_by = handled[before_ready - 1][0] if 0 < before_ready <= len(handled) else None
    cpu_ready = sampler.cpu_at(max(ready_line, handled_by or 0)) if ready_line else None
    window_s = (ready_line - first) / 1e9 if first and ready_line else None
    log_cpu = round(cpu_ready - cpu_first, 3) if cpu_first is not None and cpu_ready is not None else None
    end = served_ns or wrapper_ready
    staged = report.get("staged") or {}
    if (published := PUBLISHED.search(text)) is not None and report.get("phases", {}).get("publish") is None:
        # a serving worker publishes after its report (worker/upkeep.py): its publish line says it
        report.setdefault("phases", {})["publish"] = float(published.group(2))
        staged = {**staged, "publish": {**(staged.get("publish") or {}), "bytes": int(float(published.group(1)) * 1e6)}}
    restored_bytes = sum(int(c.get("restored_bytes") or 0) for c in (report.get("caches") or {}).values())
    return {
        "exit": proc.returncode,
        "verdict": report.get("verdict"),
        "wall_s": round(wall, 2),
        "ready_s": report.get("ready_s"),
        "log_window_s": round(window_s, 3) if window_s else None,
        "log_cpu_s": log_cpu,
        "log_cpu_share": round(log_cpu / (window_s * speed), 5) if log_cpu is not None and window_s else None,
        "wrapper_cpu_total_s": round(sampler.samples[-1][1], 2) if sampler.samples else None,
        "lag_ms": {**percentiles(lags), "lines_written": len(written), "lines_unmatched": unhandled},
        "longest_line": max((length for _, _, length in written), default=0),
        "ready_to_serving_ms": round((end - ready_line) / 1e6, 1) if end and ready_line else None,
        "restore_s": (report.get("phases") or {}).get("restore"),
        "restored_bytes": restored_bytes,
        "publish_s": (report.get("phases") or {}).get("publish"),
        "published_bytes": (staged.get("publish") or {}).get("bytes"),
        "publish_status": (staged.get("publish") or {}).get("status"),
        "peak_rss_mb": round(sampler.hwm_kb / 1024, 1),
        "secrets_in_log": sum(text.count(v) for v in SECRETS.values()),
        "phases": report.get("phases") or {},
        "files_added": sum(int(c.get("files_added") or 0) for c in (report.get("caches") or {}).values()),
        "rank_dirs": len((report.get("ranks") or {}).get("dirs") or []),  # the report's per-rank block
    }


@contextlib.contextmanager
def volume_root(kind: str, workdir: Path) -> Iterator[Path]:
    if kind == "local":
        root = workdir / "volume-local"
        root.mkdir(parents=True, exist_ok=True)
        yield root
        return
    from .slowfs import mounted

    with mounted(workdir / "volume-backing", workdir / "volume-slowfs") as mnt:
        yield mnt


def bench_rehearsal(
    workdir: Path,
    *,
    quick: bool = False,
    tps: Sequence[int] = (1, 8),
    fronts: Sequence[str] = FRONTS,
    volumes: Sequence[str] = VOLUMES,
    cold_log: str = DEFAULT_COLD,
    warm_log: str = DEFAULT_WARM,
    speed: float | None = None,
    scale: float | None = None,
    long_line: int = 0,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """`quick`: a tree of a twentieth of the files, replayed 100x faster (the default: a half, 10x)."""
    from .testmodel import write_test_model

    speed = speed if speed is not None else 100.0 if quick else 10.0
    scale = scale if scale is not None else 0.05 if quick else 0.5
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    workdir = workdir.resolve()
    bindir = workdir / "bin"
    fake_nvidia_smi(bindir, max(8, *tps))
    options = ["--cold-log", str(Path(cold_log).resolve()), "--warm-log", str(Path(warm_log).resolve())]
    options += ["--speed", str(speed), "--scale", str(scale)]
    if long_line:
        options += ["--long-line", str(long_line)]
    # The stamps file differs per boot: the engine reads it from the environment the wrapper passes on.
    python = rehearsal_vllm_python(workdir / "engine-env", [*options, "--stamps-from-env", "REHEARSAL_STAMPS"])
    env_base = {
        "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(workdir / "home"),
        "LANG": "C.UTF-8",
        "MODEL_NAME": MODEL,
        "WARMSTART_VLLM_PYTHON": python,
        "WARMSTART_VLLM_ENV": "REHEARSAL_*",
        "VLLM_STARTUP_TIMEOUT": str(int(timeout_s)),
        **SECRETS,
    }
    cold_figures, warm_figures = log_figures(Path(cold_log)), log_figures(Path(warm_log))
    runs: list[dict[str, Any]] = []
    for kind in volumes:
        with volume_root(kind, workdir) as root:
            for tp in tps:
                for front in fronts:
                    volume = root / f"{front}-tp{tp}"
                    write_test_model(volume / "huggingface-cache" / "hub", MODEL)
                    env = {**env_base, "TENSOR_PARALLEL_SIZE": str(tp)}
                    for boot in ("cold", "warm"):
                        name = f"{kind}-{front}-tp{tp}-{boot}"
                        local = workdir / "local" / name  # a fresh local disk: the warm boot restores
                        result = run_one(front, volume, local, env, workdir, name, speed, timeout_s)
                        figures = cold_figures if boot == "cold" else warm_figures
                        result["phases_vs_log"] = compare_phases(result.pop("phases"), figures, speed)
                        # The tree's own bytes, whichever way they went (a bundle is compressed: fewer).
                        size = sum(f.size for f in plan_tree(tp, scale=scale))
                        result["tree_bytes"] = size
                        result["sequential_read_s"] = round(sequential_read_s(volume, size), 3)
                        shutil.rmtree(local, ignore_errors=True)
                        runs.append({"volume": kind, "front": front, "tp": tp, "boot": boot, **result})
    lags = [r["lag_ms"] for r in runs if r["lag_ms"]["lines"]]
    shares = [r["log_cpu_share"] for r in runs if r["log_cpu_share"] is not None]
    worst_p99 = max((lag["p99"] for lag in lags), default=None)
    worst_max = max((lag["max"] for lag in lags), default=None)
    worst_share = max(shares, default=None)
    trees = {tp: plan_tree(tp, scale=scale) for tp in tps}
    return {
        "benchmark": "rehearsal",
        "engine": "warmstart_dev.rehearsal in vLLM 0.33's place (no GPU ran, nothing compiled; not a figure of vLLM)",
        "cold_log": str(cold_log),
        "warm_log": str(warm_log),
        "speed": speed,
        "scale": scale,
        "long_line": long_line or max((r["longest_line"] for r in runs), default=0),
        "trees": {
            f"tp{tp}": {"files": len(t), "mb": round(sum(f.size for f in t) / 1e6, 1)} for tp, t in trees.items()
        },
        "log_stated": {"cold": cold_figures["stated"], "warm": warm_figures["stated"]},
        "runs": runs,
        "worst": {"lag_p99_ms": worst_p99, "lag_max_ms": worst_max, "log_cpu_share": worst_share},
        "budgets": {
            "lag_p99_ms": BUDGET_LAG_P99_MS,
            "lag_max_ms": BUDGET_LAG_MAX_MS,
            "log_cpu_share": BUDGET_LOG_CPU_SHARE,
        },
        "budgets_met": {
            "lag_p99": worst_p99 is not None and worst_p99 <= BUDGET_LAG_P99_MS,
            "lag_max": worst_max is not None and worst_max <= BUDGET_LAG_MAX_MS,
            "log_cpu_share": worst_share is not None and worst_share <= BUDGET_LOG_CPU_SHARE,
        },
        "all_served": all(r["exit"] in (0, -15, 143) and r["verdict"] for r in runs),
        "secrets_set": sorted(SECRETS),
        "secrets_in_logs": sum(r["secrets_in_log"] for r in runs),
        "warm_wrote_nothing": all(r["files_added"] == 0 for r in runs if r["boot"] == "warm"),
        "warm_verdicts": sorted({str(r["verdict"]) for r in runs if r["boot"] == "warm"}),
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """One record per run, less the phases (`phase_diff_max_s`: the largest difference, live times the speed
    against the file's report, over the engine phases both have): what BENCHMARKS.md shows."""
    keys = (
        "verdict",
        "lag_ms",
        "log_cpu_s",
        "log_cpu_share",
        "ready_to_serving_ms",
        "restore_s",
        "publish_s",
        "sequential_read_s",
        "peak_rss_mb",
        "rank_dirs",
    )
    rows = {}
    for r in result["runs"]:
        diffs = [abs(p["diff_s"]) for p in r.get("phases_vs_log", {}).values() if p.get("diff_s") is not None]
        rows[f"{r['volume']}/{r['front']}/tp{r['tp']}/{r['boot']}"] = {k: r.get(k) for k in keys} | {
            "phase_diff_max_s": max(diffs, default=None)
        }
    return {k: v for k, v in result.items() if k != "runs"} | {"runs": rows}
