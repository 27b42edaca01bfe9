"""A baked image's caches through whole boots: `warmstart export`, then boots that restore from the image tier.

The engine is the scripted one (it "compiles" files into Inductor's cache directory): these tests are about which
tier a boot restores from, what it publishes where, and what the report names. `make image-check` does the same
with real vLLM inside a built image.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.files import stat_tree
from helpers.run import base_env, run_warmstart
from warmstart_dev.testmodel import write_test_model

MODEL = "warmstart/tiny-llama"


@pytest.fixture
def exported(tmp_path: Path, fake_vllm_python: str) -> tuple[Path, dict]:
    """A key booted cold on a volume (its first boot), then exported for the CPU by this environment's settings."""
    volume = tmp_path / "first-volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL)
    env = base_env(
        volume,
        fake_vllm_python,
        tmp_path,
        WARMSTART_LOCAL_CACHE=str(tmp_path / "local-0"),
        FAKE_VLLM_ARTIFACTS="3:5000:a",
        FAKE_SERVED=MODEL,  # the canary's requests name the served model (test_canary_boot.py)
    )
    cold = run_warmstart(["boot", "--json"], env)
    assert cold.returncode == 0, cold.stderr[-2000:]
    report = json.loads(cold.stdout)
    out = tmp_path / "image-caches"
    done = run_warmstart(["export", str(out), "--gpu", "cpu", "--json"], env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert [(k["key"], k["from"], k["generation"]) for k in result["keys"]] == [(report["key"], "volume", 1)]
    assert result["bundle_bytes"] > 3 * 5000
    return out, report


def boot(tmp_path: Path, python: str, volume: Path, local: str, **extra: str) -> dict:
    env = base_env(volume, python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / local), **extra)
    done = run_warmstart(["boot", "--json"], env)
    assert done.returncode == 0, done.stderr[-2000:]
    return {**json.loads(done.stdout), "log": done.stderr}


def test_a_new_worker_restores_from_the_image_first_and_still_publishes_to_its_volume(
    tmp_path, fake_vllm_python, exported
):
    image, cold = exported
    before = stat_tree(image)
    volume = tmp_path / "empty-volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL)
    warm = boot(tmp_path, fake_vllm_python, volume, "local-1", WARMSTART_IMAGE_CACHES=str(image))
    assert warm["key"] == cold["key"]
    assert (warm["expected"], warm["verdict"]) == ("hit", "warm")
    assert warm["staged"]["restored_from"] == "image"
    assert warm["staged"]["image"]["store"] == str(image / "keys" / cold["key"] / "staged")
    assert "from the image store" in warm["log"]
    # The volume lacked a generation: it gets one (workers without the image read it), the image nothing.
    assert warm["staged"]["publish"]["status"] == "published"
    assert stat_tree(image) == before


def test_no_volume_and_no_s3_the_image_alone_starts_warm(tmp_path, fake_vllm_python, exported):
    image, cold = exported
    hub = tmp_path / "baked-hub"
    write_test_model(hub, MODEL)
    warm = boot(
        tmp_path,
        fake_vllm_python,
        tmp_path / "no-volume",
        "local-2",
        WARMSTART_IMAGE_CACHES=str(image),
        WARMSTART_BAKED_HF_CACHE=str(hub),
    )
    assert (warm["mode"], warm["key"], warm["verdict"]) == ("staged", cold["key"], "warm")
    assert warm["staged"]["restored_from"] == "image" and warm["staged"]["publish"] is None
    assert "needs a volume or WARMSTART_S3_URL" not in warm["log"]


def test_a_key_the_image_lacks_falls_through_and_is_seeded_from_the_image_key(tmp_path, fake_vllm_python, exported):
    image, cold = exported
    volume = tmp_path / "other-volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL)
    other = boot(tmp_path, fake_vllm_python, volume, "local-3", WARMSTART_IMAGE_CACHES=str(image), MAX_MODEL_LEN="128")
    assert other["key"] != cold["key"]
    assert other["staged"]["restored_from"] is None and "image" not in other["staged"]
    seeded = other["staged"]["seeded"]
    assert (seeded["from"], seeded["tier"]) == (cold["key"], "image")
    assert other["verdict"] == "partial"


def test_ls_names_what_the_image_carries(tmp_path, fake_vllm_python, exported):
    image, cold = exported
    env = base_env(tmp_path / "no-volume", fake_vllm_python, tmp_path, WARMSTART_IMAGE_CACHES=str(image))
    listed = run_warmstart(["ls", "--json"], env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["volume"] is None
    (key,) = data["image"]["keys"]
    assert (key["key"], key["model"], key["generation"]) == (cold["key"], MODEL, 1)
    assert key["bundle_bytes"] == data["image"]["bundle_bytes"] > 0
    text = run_warmstart(["ls"], env, timeout=60).stdout
    assert f"Baked into the image at {image}" in text and cold["key"] in text


def test_export_refuses_what_it_cannot_find_and_writes_nothing(tmp_path, fake_vllm_python, exported):
    _, cold = exported
    env = base_env(tmp_path / "first-volume", fake_vllm_python, tmp_path, MAX_MODEL_LEN="999")
    out = tmp_path / "nothing"
    done = run_warmstart(["export", str(out), "--gpu", "cpu"], env, timeout=60)
    assert done.returncode == 2 and "no key of warmstart/tiny-llama with these flags on 'cpu'" in done.stderr
    assert not out.exists()
    done = run_warmstart(["export", str(out), "--gpu", "H100"], {**env, "MAX_MODEL_LEN": "256"}, timeout=60)
    assert done.returncode == 2 and "on 'H100'" in done.stderr
    by_name = run_warmstart(["export", str(out), "--key", cold["key"]], {**env, "MODEL_NAME": ""}, timeout=60)
    assert by_name.returncode == 0, by_name.stderr
    assert (out / "keys" / cold["key"] / "manifest.json").exists()


def test_explain_says_a_key_the_image_holds_boots_warm(tmp_path, fake_vllm_python, exported):
    image, cold = exported
    volume = tmp_path / "explain-volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL)
    env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_IMAGE_CACHES=str(image))
    done = run_warmstart(["explain", "--json"], env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert (data["key"], data["next_boot"]) == (cold["key"], "warm expected")
    assert "the image holds a generation of this key" in data["reason"]
    other = run_warmstart(["explain", "--json"], {**env, "MAX_MODEL_LEN": "128"}, timeout=120)
    assert json.loads(other.stdout)["next_boot"] == "partial expected"


def test_an_image_generation_that_answers_otherwise_cannot_be_marked_and_the_worker_boots_cold(
    tmp_path, fake_vllm_python, exported
):
    image, _ = exported
    before = stat_tree(image)
    volume = tmp_path / "empty-volume"
    write_test_model(volume / "huggingface-cache" / "hub", MODEL)
    warm = boot(
        tmp_path,
        fake_vllm_python,
        volume,
        "local-3",
        WARMSTART_IMAGE_CACHES=str(image),
        FAKE_SERVED=MODEL,
        FAKE_VLLM_CANARY_SHIFT="2",
    )
    canary = warm["canary"]
    assert (canary["status"], canary["generation"]) == ("differs", 1)
    assert any("cannot be marked (the image is read-only)" in a for a in canary["actions"])
    assert stat_tree(image) == before
    # The cold reboot published to the volume, with its own answer as the new record.
    assert warm["staged"]["publish"]["status"] == "published"
