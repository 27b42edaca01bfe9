"""Model resolution against a real HF cache layout on a volume folder."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import threading

import pytest

from helpers.run import MODEL_ID, base_env, run_warmstart
from warmstart.model import ModelError, check_snapshot, repo_dir, resolve, vllm_model_path
from warmstart_dev.fakehub import FakeHub
from warmstart_dev.testmodel import model_files, snapshot_commit, write_test_model


def test_resolves_hub_id_from_cache_without_network(volume, tiny_model):
    hub = volume / "huggingface-cache" / "hub"
    model = resolve(MODEL_ID, None, hub, no_download_reason="test")
    assert model.source == "hf-cache"
    assert model.revision == tiny_model.commit
    assert model.path == tiny_model.snapshot
    assert model.files == 6
    # A branch name and the commit itself resolve to the same snapshot.
    assert resolve(MODEL_ID, "main", hub, no_download_reason="test").path == model.path
    assert resolve(MODEL_ID, tiny_model.commit, hub, no_download_reason="test").path == model.path


def test_same_seed_same_commit_other_seed_other_commit(tmp_path, tiny_model):
    from warmstart_dev.testmodel import write_test_model

    again = write_test_model(tmp_path / "other" / "hub", MODEL_ID)
    assert again.commit == tiny_model.commit
    assert write_test_model(tmp_path / "third" / "hub", MODEL_ID, seed=1).commit != tiny_model.commit


def test_incomplete_snapshot_is_detected(volume, tiny_model):
    blob = (tiny_model.snapshot / "model.safetensors").resolve()
    blob.unlink()
    check = check_snapshot(tiny_model.snapshot)
    assert not check.complete
    assert any("model.safetensors" in m for m in check.missing)
    with pytest.raises(ModelError, match=r"incomplete.*downloading is disabled \(test\)"):
        resolve(MODEL_ID, None, volume / "huggingface-cache" / "hub", no_download_reason="test")


def test_missing_index_shard_is_detected(tiny_model):
    (tiny_model.snapshot / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model.safetensors"}}'
    )
    assert check_snapshot(tiny_model.snapshot).missing == ("model-00001-of-00002.safetensors",)


def test_unknown_revision_without_download(volume, tiny_model):
    with pytest.raises(ModelError, match="'v2' is not in the cache"):
        resolve(MODEL_ID, "v2", volume / "huggingface-cache" / "hub", no_download_reason="test")


def test_local_directory(tmp_path, tiny_model):
    local = tmp_path / "local-model"
    local.mkdir()
    for link in tiny_model.snapshot.iterdir():
        (local / link.name).write_bytes(link.read_bytes())
    model = resolve(str(local), None, tmp_path / "unused", no_download_reason="test")
    assert model.source == "local-dir"
    assert model.revision.startswith("local-")
    assert model.revision == resolve(str(local), None, tmp_path, no_download_reason="test").revision
    (local / "config.json").write_text("{}")
    assert resolve(str(local), None, tmp_path, no_download_reason="test").revision != model.revision
    with pytest.raises(ModelError, match="not usable"):
        resolve(str(tmp_path / "nothing-here"), None, tmp_path, no_download_reason="test")


@pytest.fixture
def silent_hub():
    """An endpoint that accepts connections and never answers (a Hub behind a black-holing proxy)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    server.close()
    for conn in accepted:
        conn.close()


def test_unreachable_hub_fails_within_warmstarts_bound_with_one_line(tmp_path, volume, fake_vllm_python, silent_hub):
    """Shipped defaults (no timeout set by the test), a Hub that accepts and never answers: huggingface_hub
    alone waits forever (its metadata calls have no timeout); warmstart gives up after its own bound,
    WARMSTART_HUB_TIMEOUT_S (20 s), in one line. The subprocess timeout is only a guard against a hang."""
    url, accepted = silent_hub
    env = base_env(volume, fake_vllm_python, tmp_path, MODEL_NAME="someorg/not-cached", HF_ENDPOINT=url)
    assert not any(k.startswith(("HF_HUB_", "WARMSTART_HUB")) for k in env)
    result = run_warmstart(["boot", "--json"], env, timeout=120)
    assert accepted, "the endpoint was never contacted"
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "| error" in line]
    assert errors == [
        f"warmstart | error    | someorg/not-cached: download failed: the Hub at {url} sent nothing for 20 s "
        "(WARMSTART_HUB_TIMEOUT_S); is it reachable from this worker?"
    ]


def test_refused_hub_fails_with_one_line(tmp_path, volume, fake_vllm_python):
    env = base_env(
        volume, fake_vllm_python, tmp_path, MODEL_NAME="someorg/not-cached", HF_ENDPOINT="http://127.0.0.1:9"
    )
    result = run_warmstart(["boot", "--json"], env, timeout=120)
    assert result.returncode == 2
    assert "someorg/not-cached: download failed" in result.stderr
    assert "Traceback" not in result.stderr


def test_offline_and_incomplete_is_an_error_not_a_download(tmp_path, volume, tiny_model, fake_vllm_python):
    # (A cache without refs/main is no longer "missing": its only snapshot is taken. A lost blob is.)
    (tiny_model.snapshot / "model.safetensors").resolve().unlink()
    env = base_env(volume, fake_vllm_python, tmp_path, HF_HUB_OFFLINE="1")
    result = run_warmstart(["boot"], env, timeout=60)
    assert result.returncode == 2
    assert "downloading is disabled (HF_HUB_OFFLINE)" in result.stderr


def test_missing_snapshot_is_downloaded_with_progress_then_never_asked_again(tmp_path, fake_vllm_python):
    files = model_files(0)
    with FakeHub("someorg/remote-tiny", snapshot_commit(files), files) as hub:
        env = base_env(
            tmp_path / "volume",
            fake_vllm_python,
            tmp_path,
            MODEL_NAME="someorg/remote-tiny",
            HF_ENDPOINT=hub.url,
            HF_TOKEN="hf_fakehubtoken123456",
        )
        (tmp_path / "volume").mkdir()
        first = run_warmstart(["fetch"], env, timeout=120)
        assert first.returncode == 0, first.stderr
        fetched = json.loads(first.stdout)
        assert (fetched["source"], fetched["revision"], fetched["files"]) == ("downloaded", hub.commit, 6)
        assert "is not in the cache" in first.stderr and "downloading from the Hub" in first.stderr
        assert "download someorg/remote-tiny: 2.9 MB so far" in first.stderr
        assert ("GET", f"/someorg/remote-tiny/resolve/{hub.commit}/model.safetensors") in hub.requests
        assert "hf_fakehubtoken123456" not in first.stderr
        asked = len(hub.requests)
        boot = run_warmstart(["boot", "--json"], env, timeout=120)
        assert boot.returncode == 0, boot.stderr
        report = json.loads(boot.stdout)
        assert report["caches"]["hf_weights"]["status"] == "hit"
        assert report["model"]["path"] == fetched["path"]
        assert len(hub.requests) == asked, "a complete snapshot must not touch the Hub"


def test_boot_downloads_what_is_missing_and_reports_it(tmp_path, fake_vllm_python):
    files = model_files(0)
    with FakeHub("someorg/remote-tiny", snapshot_commit(files), files) as hub:
        env = base_env(
            tmp_path / "volume", fake_vllm_python, tmp_path, MODEL_NAME="someorg/remote-tiny", HF_ENDPOINT=hub.url
        )
        (tmp_path / "volume").mkdir()
        result = run_warmstart(["boot", "--json"], env, timeout=120)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["caches"]["hf_weights"]["status"] == "miss"
        assert report["caches"]["hf_weights"]["files_added"] == 6
        assert report["model"]["source"] == "downloaded"


def test_vllm_gets_one_path_wherever_the_snapshot_lives(tmp_path, volume, tiny_model):
    """Volume or baked image: vLLM hashes the path it is given (ModelConfig.model), so both
    snapshots are reached through one link, named by repo and commit."""
    from warmstart.model import link_model, vllm_model_path
    from warmstart_dev.testmodel import write_test_model

    baked = write_test_model(tmp_path / "image" / "hub", MODEL_ID)
    on_volume = resolve(MODEL_ID, None, volume / "huggingface-cache" / "hub", no_download_reason="test")
    in_image = resolve(MODEL_ID, None, tmp_path / "image" / "hub", no_download_reason="test")
    assert on_volume.path != in_image.path == baked.snapshot
    local = tmp_path / "local"
    link = vllm_model_path(on_volume, local)
    assert link == vllm_model_path(in_image, local) == local / "models" / "warmstart--tiny-llama" / tiny_model.commit

    assert link_model(link, on_volume.path) is True
    assert link.resolve() == on_volume.path.resolve()
    assert link_model(link, on_volume.path) is False  # already there: untouched
    assert link_model(link, in_image.path) is True  # the snapshot moved: the same path follows it
    assert os.readlink(link) == str(in_image.path)
    assert check_snapshot(link).complete
    assert [p.name for p in link.parent.iterdir()] == [tiny_model.commit]  # no temporary left behind


def test_local_directory_is_its_own_vllm_path(tmp_path, tiny_model):
    from warmstart.model import link_model, vllm_model_path

    model = resolve(str(tiny_model.snapshot), None, tmp_path / "hub")
    assert vllm_model_path(model, tmp_path / "local") == tiny_model.snapshot
    assert link_model(tiny_model.snapshot, tiny_model.snapshot) is False
    assert not (tmp_path / "local").exists()


def test_boot_links_the_stable_path_or_falls_back_to_the_snapshot(tmp_path, volume, tiny_model, fake_vllm_python):
    from warmstart.boot import Boot
    from warmstart.plan import plan_boot
    from warmstart.redact import Redactor
    from warmstart.settings import from_env

    env = base_env(volume, fake_vllm_python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / "local"))
    boot = Boot(plan_boot(from_env(env)), Redactor())
    boot.link_model()
    assert boot.model_arg == tmp_path / "local" / "models" / "warmstart--tiny-llama" / tiny_model.commit
    assert boot.model_arg.resolve() == tiny_model.snapshot.resolve()

    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    env["WARMSTART_LOCAL_CACHE"] = str(blocked)
    boot = Boot(plan_boot(from_env(env)), Redactor())
    boot.link_model()  # the link cannot be made: vLLM still boots, from the snapshot's own path
    assert boot.model_arg == tiny_model.snapshot
    assert any("cannot link" in w for w in boot.warnings)
    assert boot.plan.model_arg != tiny_model.snapshot  # the plan itself stays as planned


# Runpod's cached models and pre-filled volumes store a repo under a lower-cased folder
# (models--qwen--qwen2.5-coder-32b-instruct-awq) while MODEL_NAME is written in the Hub's casing.
HUB_CASED = "Warmstart/Tiny-Llama"


def test_lower_cased_cache_folder_is_found_without_network(tmp_path):
    hub = tmp_path / "hub"
    stored = write_test_model(hub, HUB_CASED.lower())
    model = resolve(HUB_CASED, None, hub, no_download_reason="test")
    assert model.source == "hf-cache"
    assert model.path == stored.snapshot
    # The served name and the key's model factor are the user's MODEL_NAME, whatever the folder's casing.
    assert model.name == model.repo_id == HUB_CASED
    assert not repo_dir(hub, HUB_CASED).exists()  # nothing copied or downloaded


def test_either_casing_gives_one_key_and_one_vllm_path(tmp_path):
    lower = write_test_model(tmp_path / "a" / "hub", HUB_CASED.lower())
    exact = write_test_model(tmp_path / "b" / "hub", HUB_CASED)
    assert lower.commit == exact.commit
    one = resolve(HUB_CASED, None, tmp_path / "a" / "hub", no_download_reason="test")
    two = resolve(HUB_CASED, None, tmp_path / "b" / "hub", no_download_reason="test")
    assert (one.repo_id, one.revision) == (two.repo_id, two.revision)
    assert vllm_model_path(one, tmp_path / "local") == vllm_model_path(two, tmp_path / "local")


def test_exact_casing_is_preferred_over_lower_cased(tmp_path):
    hub = tmp_path / "hub"
    write_test_model(hub, HUB_CASED.lower(), seed=1)
    exact = write_test_model(hub, HUB_CASED)
    assert resolve(HUB_CASED, None, hub, no_download_reason="test").path == exact.snapshot


def test_cache_without_refs_takes_the_only_snapshot_or_says_which(tmp_path, caplog):
    hub = tmp_path / "hub"
    stored = write_test_model(hub, HUB_CASED.lower())
    shutil.rmtree(repo_dir(hub, HUB_CASED.lower()) / "refs")
    assert resolve(HUB_CASED, None, hub, no_download_reason="test").path == stored.snapshot
    # A named revision that no ref records is not guessed.
    with pytest.raises(ModelError, match="'v2' is not in the cache"):
        resolve(HUB_CASED, "v2", hub, no_download_reason="test")
    newer = stored.snapshot.parent / ("f" * 40)
    shutil.copytree(stored.snapshot, newer, symlinks=True)
    os.utime(stored.snapshot, (1, 1))
    with caplog.at_level(logging.WARNING, logger="warmstart"):
        assert resolve(HUB_CASED, None, hub, no_download_reason="test").path == newer
    assert "2 snapshots; taking the most recently written, ffffffffffff" in caplog.text


def test_snapshot_hashes_name_a_weight_file_altered_under_the_same_revision(tmp_path):
    from warmstart.model import check_snapshot_hashes
    from warmstart_dev.testmodel import write_test_model

    model = write_test_model(tmp_path / "hub", "warmstart/tiny-llama")
    snapshot = model.snapshot
    clean = check_snapshot_hashes(snapshot)
    assert "model.safetensors" in clean.checked and clean.differ == ()
    blob = (snapshot / "model.safetensors").resolve()
    with open(blob, "r+b") as handle:
        handle.seek(blob.stat().st_size - 2)
        handle.write(b"\x40\x40")
    assert check_snapshot_hashes(snapshot).differ == ("model.safetensors",)
