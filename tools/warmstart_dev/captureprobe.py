"""Runs inside vLLM's interpreter with a release's own sources first on the path: the CUDA graphs vLLM's
config code derives for a GPU profile, per command line. `warmstart-dev bench capture` drives it.

Input (stdin, JSON): {"stage": "inspect" | "profile", "model": PATH, "profile": {"name", "capability",
"memory_gib"}, "cases": [{"name", "argv"}]}. Output: JSON written to the path given as the only argument.

No GPU is needed to build vLLM's config, but vLLM's CUDA platform module loads its CUDA kernels at import
and asks the device four questions. So, and only so, vLLM's platform is stood in for:
- stage "inspect": vLLM's CPU platform builds the model config once, which runs vLLM's model inspection
  (in a subprocess of vLLM's own) and leaves its result in VLLM_CACHE_ROOT/modelinfos; the CUDA platform
  would import the model's CUDA kernels to inspect it;
- stage "profile": vLLM's own CudaPlatform (platforms/cuda.py `NonNvmlCudaPlatform`), its compiled-kernel
  modules replaced by empty ones, with the device queries answered from the profile (capability, name,
  total memory, one device). The rest is vLLM's code as released: its parser (`make_arg_parser`), the engine
  config (`AsyncEngineArgs.create_engine_config`, with `get_batch_defaults` and `_set_cudagraph_sizes`), and
  the V2 runner's capture list (`CudaGraphManager._init_candidates` and the descriptor class, read out of
  v1/worker/gpu/cudagraph_utils.py and executed: the module itself imports CUDA-only kernels).

This file imports nothing from warmstart: it runs where only vLLM is installed.
"""

from __future__ import annotations

import ast
import json
import sys
import types
from collections import defaultdict
from dataclasses import dataclass, replace
from itertools import groupby, product
from pathlib import Path
from typing import Any

GIB = 1 << 30


def _stub_kernels() -> None:
    """vLLM's compiled CUDA modules, which platforms/cuda.py imports for their side effects."""
    for name in ("vllm._C_stable_libtorch", "vllm._qutlass_C"):
        sys.modules.setdefault(name, types.ModuleType(name))


def set_platform(stage: str, profile: dict[str, Any]) -> None:
    import vllm.platforms as platforms

    if stage == "inspect":
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
        return
    _stub_kernels()
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    major, minor = profile["capability"]

    class Profile(cuda.NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(major, minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return str(profile["name"])

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return int(profile["memory_gib"] * GIB)

        @classmethod
        def device_count(cls) -> int:
            return int(profile.get("count", 1))

    platforms.current_platform = Profile()


def _capture_list() -> Any:
    """The V2 runner's capture-list code, read out of vLLM's source and executed (see the module doc)."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.utils.math_utils import round_up
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
    from vllm.v1.worker.ubatch_utils import check_ubatch_thresholds, get_num_ubatches

    import vllm

    path = Path(vllm.__path__[0]) / "v1" / "worker" / "gpu" / "cudagraph_utils.py"
    source = path.read_text()
    pieces: list[str] = []
    samples = None
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "BatchExecutionDescriptor":
            decorators = "".join(f"@{ast.get_source_segment(source, d)}\n" for d in node.decorator_list)
            pieces.append(decorators + str(ast.get_source_segment(source, node)))
        elif isinstance(node, ast.ClassDef) and node.name == "CudaGraphManager":
            wanted = ("_init_candidates", "_maybe_ubatch_twin")
            methods = [str(ast.get_source_segment(source, m)) for m in node.body if getattr(m, "name", "") in wanted]
            pieces.append("class Candidates:\n" + "\n".join("    " + line for m in methods for line in m.splitlines()))
        elif isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_FULL_GRAPH_PROFILING_SAMPLES":
            samples = ast.literal_eval(node.value)
    namespace: dict[str, Any] = {
        "defaultdict": defaultdict,
        "dataclass": dataclass,
        "replace": replace,
        "groupby": groupby,
        "product": product,
        "CUDAGraphMode": CUDAGraphMode,
        "round_up": round_up,
        "build_dynamic_sd_schedule_lookup": build_dynamic_sd_schedule_lookup,
        "check_ubatch_thresholds": check_ubatch_thresholds,
        "get_num_ubatches": get_num_ubatches,
    }
    exec(compile("from __future__ import annotations\n" + "\n\n".join(pieces), str(path), "exec"), namespace)
    return namespace["Candidates"], samples


def graphs_per_mode(candidates_cls: Any, config: Any) -> dict[str, int]:
    """The graphs the V2 runner captures per mode for this config (no speculative decoding, no LoRA)."""
    m = candidates_cls()
    m.vllm_config = config
    m.max_num_reqs = config.scheduler_config.max_num_seqs
    m.compilation_config = config.compilation_config
    m.cudagraph_mode = config.compilation_config.cudagraph_mode
    m.decode_query_len = 1
    m.varlen_decode = False
    m.lora_capture_cases = [0]
    m.ubatch_runner = None
    m._candidates = {}
    m._capture_descs = {}
    m._init_candidates()
    return {mode.name: len(descs) for mode, descs in m._capture_descs.items()}


def main() -> None:
    request = json.load(sys.stdin)
    stage = request["stage"]
    set_platform(stage, request.get("profile") or {})
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm

    parser = make_arg_parser(FlexibleArgumentParser())
    out: dict[str, Any] = {"vllm": vllm.__version__, "vllm_path": vllm.__path__[0], "cases": {}}
    if stage == "inspect":
        args = parser.parse_args(["--model", request["model"]])
        AsyncEngineArgs.from_cli_args(args).create_model_config()
    else:
        candidates_cls, samples = _capture_list()
        out["full_graph_profiling_samples"] = samples
        for case in request["cases"]:
            args = parser.parse_args(["--model", request["model"], *case["argv"]])
            config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
                usage_context=UsageContext.OPENAI_API_SERVER
            )
            cc = config.compilation_config
            out["cases"][case["name"]] = {
                "max_num_seqs": config.scheduler_config.max_num_seqs,
                "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
                "cudagraph_mode": cc.cudagraph_mode.name,
                "sizes": list(cc.cudagraph_capture_sizes),
                "max_cudagraph_capture_size": cc.max_cudagraph_capture_size,
                "graphs": graphs_per_mode(candidates_cls, config),
                "config_line": str(config),  # what the engine logs after "with config: "
            }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
