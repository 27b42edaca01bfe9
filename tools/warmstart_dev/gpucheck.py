"""`make gpu-check`: warmstart's GPU path on a CUDA machine (torch and Triton; vLLM where installed).

    PYTHONPATH=src:tools python3 -m warmstart_dev.gpucheck [--python PY] [--workdir DIR] [--no-vllm]

What it checks, each through warmstart's own code:

- hardware: nvidia-smi as `warmstart.hardware` reads it; torch's view of the same devices;
  the torch fallback forced (nvidia-smi made to fail) giving the same key hardware;
  CUDA_VISIBLE_DEVICES by UUID (and by MIG id where the machine has MIG) selecting the
  device torch then sees;
- caches: a small module torch.compile'd in two fresh processes with the environment of
  `CacheDirs.env()` (warmstart's mapping). The first must add Inductor and Triton files,
  the second must add none and read `hit` from `evidence.layer_statuses` (the boot
  report's own verdict code), with Inductor's FX-graph cache counting a hit;
- FlashInfer: only where `flashinfer` and `nvcc` are installed (not on a bare machine);
- the fit to MAX_CONCURRENCY (engine/concurrency.py): only where `--python` has vLLM. Two cold
  `warmstart boot`s of the tiny test model, fitted (MAX_CONCURRENCY=30: `--max-num-seqs 30`) and
  not (WARMSTART_FIT_CONCURRENCY=0: vLLM's default), each on its own volume; per boot the report's
  `cudagraphs` block (sizes, graphs per mode, vLLM's own capture seconds), its cudagraph phase and
  its ready time (gpufit.py). The fitted boot must capture fewer sizes. These boots take minutes
  more (gpufit.VLLM_BOOT_S each at most); `--no-vllm` skips them.

It prints one JSON document on stdout (progress goes to stderr) and exits 0 only if every
check passed, or with `"status": "skipped"` where there is no GPU. It imports only the
standard library and warmstart modules that do (no runpod, no huggingface_hub, no vLLM);
without vLLM it runs in well under 5 minutes: every subprocess gets a share of one deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from warmstart.gpus import parse_smi_list
from warmstart.hardware import (
    HardwareError,
    detect_hardware,
    gpu_signs,
    probe_torch,
    run_smi,
    smi_selection,
)
from warmstart.report.statuses import layer_statuses
from warmstart.store.layout import CacheDirs
from warmstart.tree import TreeScan, scan_tree
from warmstart.vllm.phases import LogEvidence

from .gpufit import check_fit, vllm_version

DEADLINE_S = 270.0  # the checks without vLLM; they must finish in under 5 minutes

# One compile in a fresh process. Seeded weights, so both runs compute the same numbers.
_COMPILE = r"""
import json, time
t0 = time.monotonic()
import torch
from torch._dynamo.utils import counters
t1 = time.monotonic()
torch.manual_seed(0)
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 1024)
        self.down = torch.nn.Linear(1024, 256)
        self.norm = torch.nn.LayerNorm(256)
    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))
dtype = torch.half if DEVICE == "cuda" else torch.float32
model = Block().to(DEVICE, dtype)
x = torch.randn(16, 256, device=DEVICE, dtype=dtype)
with torch.no_grad():
    compiled = torch.compile(model, dynamic=False)
    y = compiled(x)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
t2 = time.monotonic()
print(json.dumps({
    "torch": torch.__version__,
    "import_s": round(t1 - t0, 2),
    "compile_s": round(t2 - t1, 2),
    "checksum": round(float(y.float().abs().sum()), 3),
    "counters": {k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd")},
}))
"""

_FLASHINFER = r"""
import json, time
import torch, flashinfer
t0 = time.monotonic()
x = torch.randn(8, 4096, device="cuda", dtype=torch.half)
w = torch.ones(4096, device="cuda", dtype=torch.half)
y = flashinfer.norm.rmsnorm(x, w)
torch.cuda.synchronize()
print(json.dumps({"flashinfer": flashinfer.__version__, "seconds": round(time.monotonic() - t0, 2),
                  "checksum": round(float(y.float().sum()), 3)}))
"""


class Deadline:
    """One time budget for the whole check, shared out to subprocesses."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        return max(1.0, min(cap, self.end - time.monotonic()))


def say(message: str) -> None:
    print(f"gpucheck | {message}", file=sys.stderr, flush=True)


def _run_json(python: str, code: str, env: Mapping[str, str], timeout: float) -> dict[str, Any]:
    """Run `code` in a fresh interpreter and return the JSON it printed last. Raises RuntimeError."""
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=timeout, env=dict(env), check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"timed out after {timeout:.0f} s") from exc
    if out.returncode != 0:
        tail = " | ".join(out.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"exited {out.returncode}: {tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- hardware


_ERRORS = (HardwareError, RuntimeError, OSError, subprocess.SubprocessError, ValueError, IndexError)


def check_hardware(python: str, env: Mapping[str, str], deadline: Deadline) -> dict[str, Any]:
    """nvidia-smi and torch must agree, through warmstart's reading of each. Every part is
    recorded, failed or not, so the JSON says which one broke."""
    result: dict[str, Any] = {}
    selection, physical = smi_selection(env, None, run_smi)
    smi_devices = [(d.name, d.capability) for d in selection.devices]
    smi_probe = detect_hardware(env, world_size=1, python=python)
    result["nvidia_smi"] = {
        "ok": smi_probe.source == "nvidia-smi" and bool(selection.devices),
        "physical": physical,
        "visible": [{"name": d.name, "capability": d.capability, "uuid": d.uuid} for d in selection.devices],
        "hardware": smi_probe.hardware.as_dict(),
        "slug": smi_probe.hardware.slug,
        "notes": list(selection.notes),
    }

    def part(name: str, check: Any) -> None:
        try:
            result[name] = check()
        except _ERRORS as exc:
            result[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    def torch_view() -> dict[str, Any]:
        view = probe_torch(python, env, timeout=deadline.left(120))
        torch_devices = [(d.name, d.capability) for d in view.devices]
        return {
            "ok": torch_devices == smi_devices,
            "torch": view.torch,
            "cuda": view.cuda,
            "devices": [{"name": n, "capability": c} for n, c in torch_devices],
        }

    def torch_fallback() -> dict[str, Any]:
        def broken_smi(args: list[str]) -> str:
            raise subprocess.CalledProcessError(9, ["nvidia-smi", *args], "forced failure (gpucheck)\n")

        count = max(1, len(selection.devices))
        fallback = detect_hardware(env, world_size=count, python=python, smi=broken_smi)
        direct = detect_hardware(env, world_size=count, python=python)
        return {
            "ok": fallback.source == "torch" and fallback.hardware == direct.hardware,
            "hardware": fallback.hardware.as_dict(),
            "same_key_hardware_as_nvidia_smi": fallback.hardware == direct.hardware,
            "gpu_signs": gpu_signs(env),  # what made warmstart ask torch
            "notes": list(fallback.notes),
        }

    def select(visible: str) -> dict[str, Any]:
        """warmstart's selection and CUDA's (through torch) must name the same device."""
        chosen = {**env, "CUDA_VISIBLE_DEVICES": visible}
        ours = [d.name for d in smi_selection(chosen, None, run_smi)[0].devices]
        theirs = [d.name for d in probe_torch(python, chosen, timeout=deadline.left(120)).devices]
        ok = bool(ours) and ours == theirs
        return {"ok": ok, "CUDA_VISIBLE_DEVICES": visible, "warmstart": ours, "torch": theirs}

    def mig_selection() -> dict[str, Any]:
        migs = parse_smi_list(run_smi(["-L"]))
        if not migs:
            return {"ok": True, "skipped": "no MIG devices on this machine"}
        return select(migs[0].uuid)

    part("torch_view", torch_view)
    part("torch_fallback", torch_fallback)
    if selection.devices:
        part("uuid_selection", lambda: select(selection.devices[-1].uuid))
    part("mig_selection", mig_selection)
    return result


# --------------------------------------------------------------------------- compile caches


def _outside_mapping(env: Mapping[str, str]) -> dict[str, Path]:
    """Default cache places a mapped boot should leave alone (informational)."""
    home = Path(env.get("HOME") or Path.home())
    user = env.get("USER") or str(os.getuid())
    return {
        "~/.triton": home / ".triton",
        "~/.nv": home / ".nv",
        "~/.cache/torch": home / ".cache" / "torch",
        "~/.cache/flashinfer": home / ".cache" / "flashinfer",
        f"/tmp/torchinductor_{user}": Path(tempfile.gettempdir()) / f"torchinductor_{user}",
    }


def _scan(dirs: Mapping[str, Path]) -> dict[str, TreeScan]:
    return {name: scan_tree(path) for name, path in dirs.items()}


def _added(before: TreeScan, after: TreeScan, limit: int = 12) -> list[str]:
    return sorted(k for k in after.files if k not in before.files)[:limit]


def compile_twice(
    python: str,
    env: Mapping[str, str],
    workdir: Path,
    deadline: Deadline,
    code: str = _COMPILE,
    device: str = "cuda",
) -> dict[str, Any]:
    """Two fresh processes under warmstart's cache mapping; per run, the layers' statuses.

    `device="cpu"` runs the same module through Inductor's C++ backend: the tests use it to
    check this machinery where there is no GPU (no Triton files then)."""
    code = f"DEVICE = {device!r}\n{code}"
    dirs = CacheDirs(workdir / "cache")
    dirs.create()
    layers = dirs.layers()
    child_env = {**env, **dirs.env()}
    outside = _outside_mapping(child_env)
    runs: list[dict[str, Any]] = []
    for run in (1, 2):
        before, before_out = _scan(layers), _scan(outside)
        started = time.monotonic()
        output = _run_json(python, code, child_env, deadline.left(150))
        after, after_out = _scan(layers), _scan(outside)
        statuses = layer_statuses(LogEvidence(), before, after)
        runs.append(
            {
                "run": run,
                "wall_s": round(time.monotonic() - started, 2),
                **output,
                "layers": {
                    name: {
                        "status": layer.status,
                        "files_added": layer.files_added,
                        "bytes_added": layer.bytes_added,
                        "files_before": layer.files_before,
                        "detail": layer.detail,
                    }
                    for name, layer in statuses.items()
                },
                "added_examples": {
                    name: _added(before[name], after[name]) for name in layers if _added(before[name], after[name])
                },
                "outside_mapping_added": {
                    name: len(after_out[name].files) - len(before_out[name].files)
                    for name in outside
                    if len(after_out[name].files) != len(before_out[name].files)
                },
            }
        )
        say(f"compile run {run}: " + ", ".join(f"{n} {v['status']}" for n, v in runs[-1]["layers"].items()))
    return {"runs": runs, "cache_root": str(dirs.base)}


def judge_compile(result: dict[str, Any], layers: tuple[str, ...] = ("inductor", "triton")) -> list[str]:
    """What is wrong with two compile runs (empty: the warm run hit everything it should).
    On a GPU both Inductor and Triton write; on the CPU (tests) Inductor only."""
    problems: list[str] = []
    first, second = result["runs"]
    for layer in layers:
        if first["layers"][layer]["status"] != "miss":
            problems.append(f"run 1: {layer} is {first['layers'][layer]['status']}, expected miss (files added)")
        if second["layers"][layer]["status"] != "hit":
            problems.append(f"run 2: {layer} is {second['layers'][layer]['status']}, expected hit (no files added)")
    if first.get("checksum") != second.get("checksum"):
        problems.append(f"outputs differ: {first.get('checksum')} vs {second.get('checksum')}")
    inductor = second.get("counters", {}).get("inductor", {})
    if "fxgraph_cache_hit" in inductor or "fxgraph_cache_miss" in inductor:
        if not inductor.get("fxgraph_cache_hit"):
            problems.append(f"run 2: Inductor's FX graph cache did not hit ({inductor})")
    return problems


# --------------------------------------------------------------------------- FlashInfer


def check_flashinfer(python: str, env: Mapping[str, str], workdir: Path, deadline: Deadline) -> dict[str, Any]:
    """JIT one FlashInfer kernel twice under FLASHINFER_WORKSPACE_BASE, where FlashInfer can JIT."""
    has = _run_json(
        python,
        "import importlib.util, json, shutil, os; print(json.dumps({'flashinfer': "
        "importlib.util.find_spec('flashinfer') is not None, 'nvcc': shutil.which('nvcc') or "
        "(os.path.exists(os.path.join(os.environ.get('CUDA_HOME', '/usr/local/cuda'), 'bin', 'nvcc')))}))",
        env,
        deadline.left(30),
    )
    if not has["flashinfer"]:
        return {"ok": True, "skipped": f"flashinfer is not installed for {python}"}
    if not has["nvcc"]:
        return {"ok": True, "skipped": "flashinfer is installed but there is no nvcc to JIT with"}
    runs = compile_twice(python, env, workdir, deadline, code=_FLASHINFER)["runs"]
    first, second = (run["layers"]["flashinfer"] for run in runs)
    return {
        "ok": first["status"] == "miss" and second["status"] == "hit",
        "runs": [{k: run[k] for k in ("run", "wall_s", "layers", "outside_mapping_added")} for run in runs],
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpucheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch and Triton")
    parser.add_argument("--workdir", help="where the cache directories go (default: a fresh temporary one)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the two vLLM boots (fitted and not)")
    args = parser.parse_args(argv)
    deadline = Deadline(DEADLINE_S)
    t0 = time.monotonic()
    env = dict(os.environ)
    report: dict[str, Any] = {"check": "gpu", "python": args.python, "checks": {}}

    try:
        probe = detect_hardware(env, world_size=1, python=args.python)
    except HardwareError as exc:
        report.update(status="fail", problems=[f"hardware: {exc}"], seconds=round(time.monotonic() - t0, 1))
        print(json.dumps(report, indent=2))
        return 1
    if probe.hardware.kind != "gpu":
        report.update(
            status="skipped",
            reason="skipped: no GPU",
            hardware=probe.hardware.as_dict(),
            source=probe.source,
            notes=list(probe.notes),
        )
        print(json.dumps(report, indent=2))
        return 0

    problems: list[str] = []
    say(f"GPU: {probe.hardware.slug} (from {probe.source})")
    try:
        report["checks"]["hardware"] = hw = check_hardware(args.python, env, deadline)
        for name, part in hw.items():
            if not part["ok"]:
                problems.append(f"hardware: {name}: {part.get('error', 'disagrees')}")
    except _ERRORS as exc:
        problems.append(f"hardware: {type(exc).__name__}: {exc}")

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="warmstart-gpucheck-"))
    try:
        report["checks"]["compile"] = compiled = compile_twice(args.python, env, workdir / "compile", deadline)
        problems += [f"compile: {p}" for p in judge_compile(compiled)]
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        problems.append(f"compile: {exc}")

    try:
        report["checks"]["flashinfer"] = fi = check_flashinfer(args.python, env, workdir / "flashinfer", deadline)
        if not fi.get("ok"):
            problems.append("flashinfer: the second JIT did not hit the cache")
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        problems.append(f"flashinfer: {exc}")

    version = None if args.no_vllm else vllm_version(args.python, env, deadline.left(30))
    if version is None:
        why = "--no-vllm" if args.no_vllm else f"vLLM is not installed for {args.python}"
        report["checks"]["fit"] = {"ok": True, "skipped": why}
    else:
        try:
            report["checks"]["fit"] = fit = {"vllm": version, **check_fit(args.python, env, workdir / "fit")}
            if not fit["ok"]:
                problems.append("fit: the fitted boot did not capture fewer CUDA graph sizes (or a boot failed)")
        except (RuntimeError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            problems.append(f"fit: {exc}")

    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    report.update(
        status="pass" if not problems else "fail",
        problems=problems,
        seconds=round(time.monotonic() - t0, 1),
    )
    print(json.dumps(report, indent=2))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
