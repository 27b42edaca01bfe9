"""NVIDIA devices as nvidia-smi lists them, selected and ordered the way CUDA does it.

`nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,compute_cap` lists the physical GPUs
(in PCI order) and `nvidia-smi -L` the MIG slices, which `--query-gpu` does not list. CUDA
then picks and orders them: `CUDA_VISIBLE_DEVICES` entries are indices, `GPU-` UUIDs
(unique prefixes allowed) or `MIG-` ids, and enumeration stops at the first invalid entry
(CUDA's documented rule); integer indices follow `CUDA_DEVICE_ORDER` (CUDA's default
FASTEST_FIRST, not nvidia-smi's PCI order). vLLM's own `--device-ids` (vLLM 0.33
`engine/arg_utils.py`, `_resolve_device_ids`) then picks among those.

Everything here takes text and returns devices: tests use recorded nvidia-smi output.
hardware.py runs nvidia-smi and turns the selection into the key's Hardware.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GpuDevice:
    """One device as nvidia-smi (or torch) names it. `index` is nvidia-smi's (PCI order)."""

    index: int
    uuid: str
    pci_bus_id: str
    name: str
    capability: str


SMI_QUERY = "index,uuid,pci.bus_id,name,compute_cap"


def parse_smi_query(out: str) -> list[GpuDevice]:
    """Rows of `nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,compute_cap --format=csv,noheader`.

    The name is the only field that could hold a comma, so the row is split from both ends.
    """
    devices: list[GpuDevice] = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        index, uuid, bus = int(parts[0]), parts[1], parts[2]
        name, cap = ", ".join(parts[3:-1]), parts[-1]
        if not re.fullmatch(r"\d+\.\d+", cap):
            continue
        devices.append(GpuDevice(index, uuid, bus, name, cap))
    return devices


_SMI_L_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")
_SMI_L_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)\s*$")


@dataclass(frozen=True)
class MigDevice:
    """A MIG slice from `nvidia-smi -L`: its UUID, its profile (e.g. 1g.10gb) and its parent GPU."""

    uuid: str
    profile: str
    parent_uuid: str


def parse_smi_list(out: str) -> list[MigDevice]:
    """MIG devices in `nvidia-smi -L` output, with the GPU each belongs to.

    Both UUID forms are read: `MIG-<uuid>` (R470 and later) and `MIG-GPU-<uuid>/<gi>/<ci>`.
    """
    migs: list[MigDevice] = []
    parent: str | None = None
    for line in out.splitlines():
        if m := _SMI_L_GPU.match(line):
            parent = m.group(3)
        elif (m := _SMI_L_MIG.match(line)) and parent is not None:
            migs.append(MigDevice(m.group(3), m.group(1), parent))
    return migs


def _bus_key(device: GpuDevice) -> tuple[int, ...]:
    """PCI bus id `00000000:19:00.0` as numbers (domain, bus, device, function)."""
    nums = [int(x, 16) for x in re.split(r"[:.]", device.pci_bus_id) if re.fullmatch(r"[0-9A-Fa-f]+", x)]
    return tuple(nums) or (device.index,)


def _cap_key(device: GpuDevice) -> tuple[int, int]:
    major, _, minor = device.capability.partition(".")
    return (int(major), int(minor or 0))


def cuda_order(devices: Sequence[GpuDevice], device_order: str | None) -> tuple[list[GpuDevice], bool]:
    """Devices in the order CUDA enumerates them, and whether that order is certain.

    PCI_BUS_ID: ascending PCI bus id. FASTEST_FIRST (CUDA's default): "fastest to slowest
    using a simple heuristic" that CUDA does not document; for identical GPUs it is the PCI
    order, for mixed ones it is approximated by compute capability (higher first), so the
    order is reported as uncertain.
    """
    by_bus = sorted(devices, key=_bus_key)
    if (device_order or "FASTEST_FIRST").upper() == "PCI_BUS_ID":
        return by_bus, True
    if len({(d.name, d.capability) for d in devices}) <= 1:
        return by_bus, True
    return sorted(by_bus, key=_cap_key, reverse=True), False


@dataclass(frozen=True)
class Selection:
    """Devices visible to CUDA, in CUDA's order, plus what a person should know."""

    devices: tuple[GpuDevice, ...]
    notes: tuple[str, ...] = ()


def _mig_as_device(mig: MigDevice, physical: Sequence[GpuDevice]) -> GpuDevice | None:
    parent = next((d for d in physical if d.uuid == mig.parent_uuid), None)
    if parent is None:
        return None
    # torch names a MIG device "<GPU name> MIG <profile>" (cudaGetDeviceProperties), so the
    # key is the same whichever way the hardware was read.
    return replace(parent, uuid=mig.uuid, name=f"{parent.name} MIG {mig.profile}")


def _match_uuid(entry: str, devices: Sequence[GpuDevice]) -> list[GpuDevice]:
    low = entry.lower()
    return [d for d in devices if d.uuid.lower().startswith(low)]


def select_visible(
    physical: Sequence[GpuDevice],
    visible: str | None,
    device_order: str | None = None,
    migs: Sequence[MigDevice] = (),
) -> Selection:
    """Apply CUDA_VISIBLE_DEVICES (and CUDA_DEVICE_ORDER) to nvidia-smi's devices.

    CUDA's rules (CUDA C Programming Guide, "CUDA Environment Variables"): entries are
    integer indices, GPU UUIDs or unique UUID prefixes, or MIG ids; devices are enumerated
    in the order given; an invalid entry hides itself and every entry after it.
    """
    ordered, certain = cuda_order(physical, device_order)
    notes: list[str] = []
    if visible is None:
        if not certain:
            notes.append(_mixed_note(physical))
        return Selection(tuple(ordered), tuple(notes))
    chosen: list[GpuDevice] = []
    used_index = False
    for raw in visible.split(","):
        entry = raw.strip()
        found: GpuDevice | None = None
        if re.fullmatch(r"\d+", entry):
            used_index = True
            if int(entry) < len(ordered):
                found = ordered[int(entry)]
        elif entry.upper().startswith("MIG-"):
            found = _select_mig(entry, physical, migs)
        elif entry.upper().startswith("GPU-"):
            matches = _match_uuid(entry, physical)
            found = matches[0] if len(matches) == 1 else None
        if found is None or any(d.uuid == found.uuid for d in chosen):
            if entry:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES={visible}: entry {entry!r} matches no single device here, "
                    "so CUDA hides it and every entry after it"
                )
            break
        chosen.append(found)
    if used_index and not certain:
        notes.append(_mixed_note(physical))
    return Selection(tuple(chosen), tuple(notes))


def _select_mig(entry: str, physical: Sequence[GpuDevice], migs: Sequence[MigDevice]) -> GpuDevice | None:
    mig = next((m for m in migs if m.uuid.lower() == entry.lower()), None)
    if mig is not None:
        return _mig_as_device(mig, physical)
    # MIG-GPU-<uuid>/<gi>/<ci> names its parent even when `nvidia-smi -L` was not readable.
    if m := re.fullmatch(r"MIG-(GPU-[0-9a-fA-F-]+)/\d+/\d+", entry, flags=re.I):
        parents = _match_uuid(m.group(1), physical)
        if len(parents) == 1:
            return replace(parents[0], uuid=entry, name=f"{parents[0].name} MIG")
    return None


def _mixed_note(devices: Sequence[GpuDevice]) -> str:
    names = ", ".join(sorted({d.name for d in devices}))
    return (
        f"different GPUs in this machine ({names}) and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA "
        "numbers them fastest-first, nvidia-smi and vLLM's NVML queries by PCI bus (vLLM warns the "
        "same); set CUDA_DEVICE_ORDER=PCI_BUS_ID so that index N means one device everywhere"
    )


def apply_device_ids(
    selection: Selection, physical: Sequence[GpuDevice], device_ids: str | None, *, visible_set: bool = True
) -> Selection:
    """vLLM 0.33's `--device-ids`: UUIDs, or integers that index the CUDA_VISIBLE_DEVICES set,
    or NVML's physical (PCI-ordered) indices when it is unset. From `EngineArgs._resolve_device_ids`."""
    if not device_ids:
        return selection
    ids = [part.strip() for part in device_ids.split(",") if part.strip()]
    picked: list[GpuDevice] = []
    for entry in ids:
        if entry.isdigit():
            pool = selection.devices if visible_set else tuple(sorted(physical, key=_bus_key))
            found = pool[int(entry)] if int(entry) < len(pool) else None
        else:
            matches = _match_uuid(entry, physical)
            found = matches[0] if len(matches) == 1 else None
        if found is None:
            return replace(
                selection, notes=(*selection.notes, f"--device-ids {device_ids}: {entry!r} matches no device")
            )
        picked.append(found)
    return Selection(tuple(picked), selection.notes)
