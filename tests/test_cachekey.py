"""Cache key semantics: what splits a key, what must not, and that secrets stay out."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.run import WARMSTART, base_env, run_warmstart
from helpers.spellings import DIFFERENT_KEYS, SAME_KEY_GROUPS
from warmstart.hardware import Hardware, detect_cpu
from warmstart.key import derive_key, key_extra_args
from warmstart.model import ResolvedModel
from warmstart.settings import from_env
from warmstart.vllm.install import EngineInfo

MODEL = ResolvedModel("org/model", "org/model", "a" * 40, Path("/snap"), "hf-cache", 3, 100)
GPU = Hardware("gpu", "NVIDIA H200", "9.0", 1)
ENGINE = EngineInfo("/py", "vllm", "0.33.0", "2.10.0+cu129", "3.5.0", "3.12.3")


def key(
    env: dict[str, str] | None = None,
    *,
    model: ResolvedModel = MODEL,
    hardware: Hardware = GPU,
    engine: EngineInfo = ENGINE,
):
    settings = from_env({"MODEL_NAME": "org/model", **(env or {})})
    return derive_key(settings, model, hardware, engine)


BASELINE = {"MAX_MODEL_LEN": "4096", "DTYPE": "bfloat16"}
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    "change",
    [
        {"MAX_MODEL_LEN": "8192"},
        {"DTYPE": "float16"},
        {"MAX_NUM_SEQS": "64"},
        {"MAX_NUM_BATCHED_TOKENS": "2048"},
        {"QUANTIZATION": "fp8"},
        {"TENSOR_PARALLEL_SIZE": "2"},
        {"ENFORCE_EAGER": "true"},
        {"COMPILATION_CONFIG": '{"cudagraph_capture_sizes": [1, 2, 4]}'},
        {"VLLM_EXTRA_ARGS": "--max-num-batched-tokens 4096"},
        {"VLLM_USE_DEEP_GEMM": "1"},
        # vLLM hashes these ModelConfig fields (config/model.py compute_hash does not ignore them).
        {"TRUST_REMOTE_CODE": "true"},
        {"MAX_LOGPROBS": "5"},
        {"LIMIT_MM_PER_PROMPT": '{"image": 2}'},
        {"VLLM_EXTRA_ARGS": "--generation-config vllm"},
        {"VLLM_EXTRA_ARGS": '--override-generation-config {"temperature":0.5}'},
        {"VLLM_EXTRA_ARGS": "--max-logprobs 3"},
        # Unprefixed names vLLM reads through envs.py and hashes.
        {"VERBOSE": "1"},
        {"CUDA_HOME": "/usr/local/cuda-13.0"},
        # A VLLM_* name vLLM does not know: kept, a typo cannot be told from a newer variable.
        {"VLLM_NOT_A_REAL_VARIABLE": "1"},
    ],
)
def test_key_changes_with_artifact_flags(change):
    assert key(BASELINE).digest != key({**BASELINE, **change}).digest


@pytest.mark.parametrize(
    "change",
    [
        {"OPENAI_SERVED_MODEL_NAME_OVERRIDE": "friendly"},
        {"GPU_MEMORY_UTILIZATION": "0.5"},
        {"HF_TOKEN": "hf_verysecrettoken123"},
        {"VLLM_API_KEY": "sk-verysecret123"},
        {"VLLM_PORT": "9000"},
        {"ENABLE_PREFIX_CACHING": "true"},
        {"SEED": "7"},
        {"VLLM_EXTRA_ARGS": "--uvicorn-log-level warning --api-key sk-abcdef123456"},
        {"KV_CACHE_MEMORY_BYTES": "8G"},
        # In vLLM's ignore list (envs.compile_factors): they must not split a key.
        {"VLLM_CPU_KVCACHE_SPACE": "4"},
        {"VLLM_ENABLE_STARTUP_PLAN": "1"},
        {"VLLM_LOGGING_PREFIX": "[w1] "},
        {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
        {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "30"},
        {"VLLM_STARTUP_TIMEOUT": "900"},
        {"VLLM_CONFIG_FILE": str(FIXTURES / "vllm-config-serving.yaml")},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ],
)
def test_key_ignores_serving_only_flags(change):
    assert key(BASELINE).digest == key({**BASELINE, **change}).digest


def test_max_concurrency_enters_the_key_only_through_the_fitted_max_num_seqs():
    """The fit (engine/concurrency.py) gives vLLM `--max-num-seqs MAX_CONCURRENCY`, which vLLM hashes
    (tests/vllm/test_vllm_hash.py): the key holds the flag's value, as it would the user's own."""
    fitted = key(BASELINE)
    assert fitted.factors["args"]["max_num_seqs"] == 30
    assert fitted.digest == key({**BASELINE, "MAX_NUM_SEQS": "30"}).digest  # fitted 30 is explicit 30
    assert fitted.digest != key({**BASELINE, "MAX_CONCURRENCY": "5"}).digest
    off = key({**BASELINE, "WARMSTART_FIT_CONCURRENCY": "0"})
    assert "max_num_seqs" not in off.factors["args"] and off.digest != fitted.digest
    for chosen in (
        {"MAX_NUM_SEQS": "8"},
        {"WARMSTART_FIT_CONCURRENCY": "0"},
        {"COMPILATION_CONFIG": '{"cudagraph_capture_sizes": [1, 2, 4]}'},
        {"VLLM_EXTRA_ARGS": "--max_num_seqs 8"},
        {"VLLM_EXTRA_ARGS": "-cc.max_cudagraph_capture_size 64"},
    ):
        assert key({**BASELINE, **chosen}).digest == key({**BASELINE, **chosen, "MAX_CONCURRENCY": "5"}).digest


def test_key_changes_with_vllm_version_gpu_and_revision():
    base = key(BASELINE)
    assert key(BASELINE, engine=replace(ENGINE, vllm="0.33.1")).digest != base.digest
    assert key(BASELINE, engine=replace(ENGINE, torch="2.10.1+cu129")).digest != base.digest
    assert key(BASELINE, hardware=Hardware("gpu", "NVIDIA H100 80GB HBM3", "9.0", 1)).digest != base.digest
    assert key(BASELINE, hardware=replace(GPU, count=2)).digest != base.digest
    assert key(BASELINE, model=replace(MODEL, revision="b" * 40)).digest != base.digest


def test_dirname_is_readable():
    k = key(BASELINE)
    assert k.dirname == f"model--aaaaaaaa--h200-sm90x1--vllm-0.33.0--{k.digest[:10]}"
    cpu = key(BASELINE, hardware=Hardware("cpu", "x86_64", "avx512", 1))
    assert "--cpu-x86_64-avx512--" in cpu.dirname


def test_extra_args_drop_serving_flags_with_their_values():
    kept = key_extra_args(("--api-key", "sk-1", "--max-num-batched-tokens", "4096", "--seed=3", "--enforce-eager"))
    assert kept == ["--max-num-batched-tokens", "4096", "--enforce-eager"]


def test_how_weights_are_read_does_not_split_the_key():
    """`bench weights` found it: adding vLLM's own prefetch flag made a warm worker boot cold."""
    plain = key(BASELINE)
    prefetch = key({**BASELINE, "VLLM_EXTRA_ARGS": "--safetensors-load-strategy prefetch --no-use-tqdm-on-load"})
    assert prefetch.digest == plain.digest
    eager = key({**BASELINE, "VLLM_EXTRA_ARGS": "--safetensors-load-strategy=eager --enforce-eager"})
    assert eager.digest != plain.digest and eager.factors["args"] == {**plain.factors["args"], "enforce_eager": True}


def test_vllm_033s_disable_spellings_are_read_as_vllm_033_reads_them():
    """0.33 pairs every `--enable-x` with `--disable-x` (utils/argparse_utils.py EnableDisableAction). Read as
    a flag the table did not know, `--disable-chunked-prefill` stayed a word beside the dest, and the last of
    two spellings, which vLLM obeys, was lost: both command lines below gave one key while CUDA vLLM 0.33.0
    hashes them apart (tests/vllm/test_vllm033_hash.py)."""
    on = {"ENABLE_CHUNKED_PREFILL": "true"}
    off = key({**on, "VLLM_EXTRA_ARGS": "--disable-chunked-prefill"})
    back_on = key({**on, "VLLM_EXTRA_ARGS": "--disable-chunked-prefill --enable-chunked-prefill"})
    assert off.factors["args"]["enable_chunked_prefill"] is False
    assert back_on.factors["args"]["enable_chunked_prefill"] is True
    assert off.digest != back_on.digest
    assert (
        key({"ENABLE_CHUNKED_PREFILL": "false"}).digest == key({"VLLM_EXTRA_ARGS": "--disable-chunked-prefill"}).digest
    )


def test_flags_and_fields_vllm_033_does_not_hash_keep_the_key():
    """KernelConfig's warm-up switches, cascade attention, custom all-reduce: out of 0.33's hash, out of the key."""
    plain = key(BASELINE)
    for extra in (
        "--disable-flashinfer-autotune",
        "--enable-flashinfer-autotune",
        "--disable-cascade-attn",
        "--disable-custom-all-reduce",
        '--kernel-config \'{"enable_flashinfer_autotune": false, "enable_jit_warmup": false}\'',
    ):
        assert key({**BASELINE, "VLLM_EXTRA_ARGS": extra}).digest == plain.digest, extra
    hashed = key({**BASELINE, "VLLM_EXTRA_ARGS": "--kernel-config '{\"monokernel\": true}'"})
    assert hashed.digest != plain.digest and hashed.factors["args"]["kernel_config"] == {"monokernel": True}


@pytest.mark.parametrize("group", sorted(SAME_KEY_GROUPS))
def test_spellings_vllm_reads_alike_give_one_key(group):
    keys = {key(env).digest for env in SAME_KEY_GROUPS[group]}
    assert len(keys) == 1, [key(env).factors["args"] for env in SAME_KEY_GROUPS[group]]


@pytest.mark.parametrize("pair", DIFFERENT_KEYS, ids=repr)
def test_values_vllm_hashes_apart_give_two_keys(pair):
    assert key(pair[0]).digest != key(pair[1]).digest


def test_watermark_key_is_masked_and_the_rest_of_its_config_stays():
    text = '--watermark-config \'{"key": 123456789, "algorithm": "gumbel"}\''
    k = key({"VLLM_EXTRA_ARGS": text})
    assert "123456789" not in json.dumps(k.factors)
    assert k.factors["args"]["watermark_config"] == {"key": "***", "algorithm": "gumbel"}
    assert key({"VLLM_EXTRA_ARGS": text.replace("123456789", "987654321")}).digest == k.digest


def test_secrets_never_in_factors():
    k = key(
        {
            **BASELINE,
            "HF_TOKEN": "hf_verysecrettoken123",
            "VLLM_API_KEY": "sk-verysecret123",
            "VLLM_EXTRA_ARGS": "--hf-token hf_othersecret999",
        }
    )
    text = json.dumps(k.factors)
    for secret in ("hf_verysecrettoken123", "sk-verysecret123", "hf_othersecret999"):
        assert secret not in text


def test_gpu_slug_and_cpu_identity_parsing():
    assert Hardware("gpu", "NVIDIA H200", "9.0", 2).slug == "h200-sm90x2"
    assert Hardware("gpu", "NVIDIA GeForce RTX 4090", "8.9", 1).slug == "rtx-4090-sm89x1"
    cpu = detect_cpu("processor : 0\nflags : fpu sse avx2 avx512f avx512_bf16\n", "x86_64")
    assert cpu.slug == "cpu-x86_64-avx512"
    assert cpu.features == ("avx2", "avx512f", "avx512_bf16")
    assert detect_cpu("flags : fpu avx2\n", "x86_64").slug == "cpu-x86_64-avx2"


def test_key_command_prints_key_and_mapping_without_secrets(tmp_path, volume, tiny_model, fake_vllm_python):
    env = base_env(
        volume,
        fake_vllm_python,
        tmp_path,
        HF_TOKEN="hf_supersecretvalue42",
        VLLM_API_KEY="sk-anothersecret77",
        WARMSTART_CACHE_MODE="direct",
    )
    result = run_warmstart(["key", "--json"], env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["factors"]["revision"] == tiny_model.commit
    assert data["factors"]["engine"]["vllm"] == "0.32.0"
    key_dir = Path(data["key_dir"])
    assert key_dir.parent == volume / "warmstart" / "keys"
    for var, sub in (
        ("VLLM_CACHE_ROOT", "vllm"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("TRITON_CACHE_DIR", "triton"),
        ("CUDA_CACHE_PATH", "cuda"),
        ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
        ("DG_JIT_CACHE_DIR", "deep_gemm"),
    ):
        assert data["env"][var] == str(key_dir / "cache" / sub)
    assert data["env"]["HF_HOME"] == str(volume / "huggingface-cache")
    assert data["env"]["HF_HUB_OFFLINE"] == "1"
    assert "hf_supersecretvalue42" not in result.stdout + result.stderr
    assert "sk-anothersecret77" not in result.stdout + result.stderr
    assert not key_dir.exists(), "`warmstart key` must not create anything"
    stable = tmp_path / ".cache" / "warmstart" / "models" / "warmstart--tiny-llama" / tiny_model.commit
    assert data["model"]["path"] == str(tiny_model.snapshot)
    assert data["model"]["vllm_path"] == str(stable)
    assert not stable.parent.exists(), "the link is made by the boot, not by `warmstart key`"


def test_staged_mapping_points_at_local_disk(tmp_path, volume, tiny_model, fake_vllm_python):
    local = tmp_path / "local"
    env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(local))
    data = json.loads(run_warmstart(["key", "--json"], env).stdout)
    assert data["cache_mode"] == "staged"
    assert data["staged_store"] == str(volume / "warmstart" / "keys" / data["key"] / "staged")
    assert data["env"]["VLLM_CACHE_ROOT"] == str(local / "warmstart" / "keys" / data["key"] / "cache" / "vllm")
    assert data["env"]["HF_HOME"] == str(volume / "huggingface-cache")


def test_key_command_is_stable_and_ignores_served_name(tmp_path, volume, tiny_model, fake_vllm_python):
    env = base_env(volume, fake_vllm_python, tmp_path)
    first = json.loads(run_warmstart(["key", "--json"], env).stdout)["key"]
    env["OPENAI_SERVED_MODEL_NAME_OVERRIDE"] = "another-name"
    env["GPU_MEMORY_UTILIZATION"] = "0.5"
    assert json.loads(run_warmstart(["key", "--json"], env).stdout)["key"] == first
    env["MAX_MODEL_LEN"] = "128"
    assert json.loads(run_warmstart(["key", "--json"], env).stdout)["key"] != first


def test_bad_setting_stops_before_anything_starts(tmp_path, volume, fake_vllm_python):
    env = base_env(volume, fake_vllm_python, tmp_path, MAX_MODEL_LEN="lots")
    result = run_warmstart(["boot", "--json"], env)
    assert result.returncode == 2
    assert "MAX_MODEL_LEN='lots': expected an integer" in result.stderr
    assert result.stdout == ""
    assert not (volume / "warmstart").exists()


@pytest.mark.parametrize("command", ["key", "boot", "serve", "fetch", "explain"])
def test_the_installed_script_runs_and_prints_each_commands_help(command):
    """The `warmstart` on PATH (the image's entrypoint) starts, and every command that reads the
    key's settings answers --help without needing any of them."""
    result = subprocess.run(
        [WARMSTART, command, "--help"], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: warmstart {command} ")
    assert "--volume DIR" in result.stdout


def test_same_key_for_the_volume_and_the_baked_snapshot():
    """One model, one commit, two places: one key, and vLLM is given one path for both."""
    from warmstart.model import vllm_model_path

    baked = replace(MODEL, path=Path("/opt/hf/hub/models--org--model/snapshots/" + "a" * 40))
    volume = replace(MODEL, path=Path("/runpod-volume/huggingface-cache/hub/models--org--model/snapshots/" + "a" * 40))
    assert key(BASELINE, model=baked).digest == key(BASELINE, model=volume).digest
    local = from_env({"MODEL_NAME": "org/model"}).local_cache_dir
    assert vllm_model_path(volume, local) == vllm_model_path(baked, local)


def test_workers_with_other_local_disks_share_a_key():
    """The link vLLM is given lives under WARMSTART_LOCAL_CACHE, one constant per image: workers (and
    tests) whose local caches differ must still share the volume's generations."""
    assert key(BASELINE).digest == key({**BASELINE, "WARMSTART_LOCAL_CACHE": "/elsewhere"}).digest


def test_ignore_list_is_vllm_033s():
    """A spot check of the copied table against vllm/envs.py 0.33 (`ignored_factors`)."""
    from warmstart.vllm.hashing import VLLM_ENV_NOT_HASHED

    assert len(VLLM_ENV_NOT_HASHED) == 83
    for name in ("VLLM_PORT", "VLLM_CACHE_ROOT", "VLLM_ENABLE_STARTUP_PLAN", "VLLM_API_KEY", "VLLM_CPU_KVCACHE_SPACE"):
        assert name in VLLM_ENV_NOT_HASHED
    assert "VLLM_USE_AOT_COMPILE" not in VLLM_ENV_NOT_HASHED


def test_the_factor_diff_is_written_once_and_read_by_the_report_explain_and_the_siblings():
    from warmstart import explain
    from warmstart.key import factor_diff
    from warmstart.report.miss import differing

    old = {"args": {"max_model_len": 256, "dtype": "auto"}, "vllm": "0.33.0", "capture": [1, 2]}
    new = {"args": {"max_model_len": 384, "dtype": "auto"}, "vllm": "0.33.0", "capture": [1, 2, 4], "extra": 1}
    assert factor_diff(old, new) == {
        "args.max_model_len": [256, 384],
        "capture": ["[1, 2]", "[1, 2, 4]"],
        "extra": [None, 1],
    }
    assert factor_diff(old, old) == {}
    assert differing(old, new) == [
        "args.max_model_len: 256 -> 384",
        "capture: '[1, 2]' -> '[1, 2, 4]'",
        "extra: None -> 1",
    ]
    assert [pair for pair in explain.factor_differences(old, new).values()] == list(factor_diff(old, new).values())
