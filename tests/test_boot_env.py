"""What warmstart chooses for vLLM's environment per platform (boot.derive_engine_env)."""

from __future__ import annotations

import pytest

from warmstart.hardware import Hardware
from warmstart.plan import derive_engine_env
from warmstart.settings import from_env

GPU = Hardware("gpu", "NVIDIA H200", "9.0", 1)
CPU = Hardware("cpu", "x86_64", "avx512", 1)


def settings(**env: str):
    return from_env({"MODEL_NAME": "org/m", **env})


def test_startup_plan_on_by_default_on_gpu_only():
    """vLLM 0.33 v1/worker/startup_plan.py: VLLM_ENABLE_STARTUP_PLAN=1 persists the profiled KV size."""
    assert derive_engine_env(GPU, settings())["VLLM_ENABLE_STARTUP_PLAN"] == "1"
    assert "VLLM_ENABLE_STARTUP_PLAN" not in derive_engine_env(CPU, settings())  # the CPU worker has no plan


@pytest.mark.parametrize("value", ["0", "1"])
def test_a_users_startup_plan_setting_wins(value):
    assert "VLLM_ENABLE_STARTUP_PLAN" not in derive_engine_env(GPU, settings(VLLM_ENABLE_STARTUP_PLAN=value))


def test_aot_off_on_cpu_unless_the_user_says():
    assert derive_engine_env(CPU, settings()) == {"VLLM_USE_AOT_COMPILE": "0"}
    assert "VLLM_USE_AOT_COMPILE" not in derive_engine_env(CPU, settings(VLLM_USE_AOT_COMPILE="1"))
    assert "VLLM_USE_AOT_COMPILE" not in derive_engine_env(GPU, settings())


def test_every_mapped_cache_variable_stays_out_of_the_key():
    """The cache mapping's values are paths: they must not split keys (vllm.hashing.MAPPED_ENV)."""
    from warmstart.store.layout import CACHE_LAYERS
    from warmstart.vllm.hashing import MAPPED_ENV

    assert {var for _, _, var in CACHE_LAYERS} <= MAPPED_ENV
