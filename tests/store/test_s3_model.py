"""MODEL_NAME=s3://BUCKET/PREFIX (warmstart/s3model.py) against a real S3-protocol server (moto on loopback),
faults by the proxy (warmstart_dev.throttle): listed once, pinned by the listing, read whole or not at all."""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.run import MODEL_ID, base_env
from helpers.s3_server import SECRET_KEY, moto_server, s3_env
from warmstart.errors import EXIT_CONFIG, ModelError
from warmstart.s3model import (
    MANIFEST,
    BackgroundRead,
    list_model,
    model_dir,
    plan_s3,
    read_model,
    resolve_s3,
    streamer_env,
)
from warmstart.s3url import parse_s3_url
from warmstart.settings import from_env
from warmstart.store.s3client import make_client
from warmstart_dev.throttle import throttled

pytestmark = pytest.mark.usefixtures("aws_credentials")

WEIGHTS = os.urandom(3 * 1024 * 1024 + 17)  # three and a bit ranges of 1 MiB
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b'{"version": "1.0"}',
    "model.safetensors": WEIGHTS,
}


@pytest.fixture
def client(endpoint):
    return make_client(endpoint, "us-east-1")


@pytest.fixture
def bucket(client) -> str:
    name = f"models-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


def put(client, bucket: str, files: dict[str, bytes], prefix: str = "tiny", manifest: bool = False) -> str:
    entries = {}
    for name, data in files.items():
        etag = client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)["ETag"]
        entries[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "etag": etag.strip('"')}
    if manifest:
        body = json.dumps({"format": 1, "files": entries}).encode()
        client.put_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}", Body=body)
    return f"s3://{bucket}/{prefix}"


def no_volume_env(tmp_path: Path, python: str, name: str, endpoint: str, **extra: str) -> dict[str, str]:
    """A worker with no volume whose MODEL_NAME is `name` in the store at `endpoint`."""
    local = str(tmp_path / "local")
    return base_env(
        tmp_path / "no-volume",
        python,
        tmp_path,
        MODEL_NAME=name,
        WARMSTART_LOCAL_CACHE=local,
        **s3_env(endpoint),
        **extra,
    )


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_settings_take_an_s3_model_and_refuse_what_cannot_be_one(tmp_path):
    env = {"MODEL_NAME": "s3://my-volume/models/qwen", "WARMSTART_S3_ENDPOINT_URL": "https://s3api-eu-ro-1.runpod.io"}
    settings = from_env(env)
    assert settings.model_name == "s3://my-volume/models/qwen"
    assert not [w for w in settings.warnings if "no S3 tier" in w], "the endpoint serves the model"
    for bad, why in (
        ("s3://my-volume", "name the model's prefix"),
        ("s3://user:pw@bucket/m", "a bucket name only"),
        ("s3://bucket/a/../b", "must not contain"),
    ):
        with pytest.raises(Exception, match=why):
            from_env({"MODEL_NAME": bad})
    with pytest.raises(Exception, match="listing"):
        from_env({"MODEL_NAME": "s3://b/m", "MODEL_REVISION": "main"})


def test_the_streamer_reads_path_addressing_for_an_s3_compatible_endpoint():
    # runai-model-streamer 0.17.1 libstreamers3.so reads these names; its default is virtual addressing.
    assert streamer_env("https://s3api-eu-ro-1.runpod.io", "eu-ro-1") == {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": "https://s3api-eu-ro-1.runpod.io",
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        "AWS_REGION": "eu-ro-1",
    }
    assert streamer_env(None, None) == {"AWS_EC2_METADATA_DISABLED": "true"}, "AWS S3 itself: virtual addressing"


def test_the_listing_is_the_revision_and_a_changed_object_is_a_new_one(client, bucket):
    url = parse_s3_url(put(client, bucket, FILES))
    first, again = list_model(client, url), list_model(client, url)
    assert first.revision == again.revision and first.revision.startswith("s3-")
    assert [o.name for o in first.objects] == sorted(FILES) and first.bytes == sum(map(len, FILES.values()))
    client.put_object(Bucket=bucket, Key="tiny/model.safetensors", Body=WEIGHTS[::-1])  # same size, new bytes
    assert list_model(client, url).revision != first.revision


def test_an_s3_model_is_read_whole_to_local_disk_once_and_keyed_by_its_url(client, bucket, endpoint, tmp_path):
    name = put(client, bucket, FILES, manifest=True)
    model = resolve_s3(name, tmp_path, endpoint_url=endpoint, region="us-east-1")
    assert (model.source, model.repo_id, model.files, model.bytes) == ("s3", None, 3, sum(map(len, FILES.values())))
    assert model.path == model_dir(tmp_path, parse_s3_url(name)) / model.revision
    assert tree(model.path) == FILES, "every object, the manifest left out"
    assert model.downloaded_bytes == model.bytes
    again = resolve_s3(name, tmp_path, endpoint_url=endpoint, region="us-east-1")
    assert (again.path, again.revision, again.downloaded_bytes) == (model.path, model.revision, 0)
    assert [p.name for p in model.path.parent.iterdir()] == [model.revision], "no partial folder left"


def test_ranges_are_read_in_parallel_and_checked_against_the_manifest(client, bucket, tmp_path):
    url = parse_s3_url(put(client, bucket, FILES, manifest=True))
    listing = list_model(client, url)
    manifest = json.loads(client.get_object(Bucket=bucket, Key=f"tiny/{MANIFEST}")["Body"].read())
    stats = read_model(client, listing, tmp_path / "m", manifest, workers=4, part_bytes=1024 * 1024)
    assert tree(tmp_path / "m") == FILES and stats.bytes == listing.bytes


class _SlowGets:
    """The real client, each GET held 0.2 s (a distant store's first byte) and its key's span recorded."""

    def __init__(self, client) -> None:
        self._client, self.spans = client, []

    def __getattr__(self, name):
        return getattr(self._client, name)

    def get_object(self, **kwargs):
        start = time.monotonic()
        time.sleep(0.2)
        response = self._client.get_object(**kwargs)
        self.spans.append((kwargs["Key"].rsplit("/", 1)[-1], start, time.monotonic()))
        return response


def test_the_next_files_ranges_are_fetched_while_this_one_is_written_and_hashed(client, bucket, tmp_path):
    """One queue of ranges for all the files: the link is not idle at a file's end (hashing a large shard
    and writing a 275 MB shard took 0.84 s here, once per file, while nothing was fetched)."""
    files = {"config.json": b"{}", **{f"model-{i}.safetensors": os.urandom(1024 * 1024) for i in range(3)}}
    url = parse_s3_url(put(client, bucket, files))
    slow = _SlowGets(client)
    read_model(slow, list_model(client, url), tmp_path / "m", workers=4, part_bytes=1024 * 1024)
    assert tree(tmp_path / "m") == files
    started = {name: start for name, start, _ in slow.spans}
    ended = {name: end for name, _, end in slow.spans}
    assert started["model-2.safetensors"] < ended["config.json"], "every file's GETs in flight at once"


@pytest.mark.parametrize(
    ("files", "manifest_edit", "error"),
    [
        ({"config.json": b"{}", "model.bin": b"x"}, None, "no \\*.safetensors"),
        ({"model.safetensors": b"x"}, None, "no config.json"),
        (FILES, ("model.safetensors", "etag", "0" * 32), "disagree: model.safetensors: ETag"),
        (FILES, ("model.safetensors", "size", 1), "disagree: model.safetensors: .* bytes listed"),
        (FILES, ("extra.safetensors", None, None), "in warmstart-model.json but not listed"),
    ],
)
def test_a_prefix_that_is_no_model_or_disagrees_with_its_manifest_fails_before_anything_is_read(
    client, bucket, endpoint, tmp_path, files, manifest_edit, error
):
    name = put(client, bucket, files, manifest=manifest_edit is not None)
    if manifest_edit is not None:
        key = f"tiny/{MANIFEST}"
        manifest = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        file, field, value = manifest_edit
        if field is None:
            manifest["files"][file] = {"size": 1, "sha256": "0" * 64}
        else:
            manifest["files"][file][field] = value
        client.put_object(Bucket=bucket, Key=key, Body=json.dumps(manifest).encode())
    with pytest.raises(ModelError, match=error) as caught:
        resolve_s3(name, tmp_path, endpoint_url=endpoint, region="us-east-1")
    assert caught.value.exit_code == EXIT_CONFIG
    assert not (tmp_path / "models").exists(), "nothing read, nothing written"


def test_bytes_that_are_not_the_manifest_s_fail_and_leave_nothing(client, bucket, endpoint, tmp_path):
    name = put(client, bucket, FILES, manifest=True)
    key = f"tiny/{MANIFEST}"
    manifest = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    manifest["files"]["model.safetensors"]["sha256"] = "ab" * 32
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(manifest).encode())
    with pytest.raises(ModelError, match="SHA-256"):
        resolve_s3(name, tmp_path, endpoint_url=endpoint, region="us-east-1")
    assert [p for p in (tmp_path / "models").rglob("*") if p.is_file()] == []


def test_an_object_deleted_or_replaced_mid_read_fails_and_leaves_nothing(client, bucket, tmp_path):
    url = parse_s3_url(put(client, bucket, FILES))
    listing = list_model(client, url)
    client.delete_object(Bucket=bucket, Key="tiny/tokenizer.json")
    with pytest.raises(ModelError, match="vanished while it was read"):
        read_model(client, listing, tmp_path / "m", part_bytes=1024 * 1024)
    client.put_object(Bucket=bucket, Key="tiny/tokenizer.json", Body=FILES["tokenizer.json"])
    listing = list_model(client, url)
    client.put_object(Bucket=bucket, Key="tiny/model.safetensors", Body=WEIGHTS[::-1])
    with pytest.raises(ModelError, match="changed while it was read"):
        read_model(client, listing, tmp_path / "m", part_bytes=1024 * 1024)
    assert list(tmp_path.iterdir()) == []


def test_refused_credentials_and_an_unreachable_store_are_one_clear_line(tmp_path):
    with moto_server(auth=True) as url, pytest.raises(ModelError, match="check the credentials") as caught:
        resolve_s3("s3://b/m", tmp_path, endpoint_url=url, region="us-east-1")
    assert SECRET_KEY not in str(caught.value) and caught.value.exit_code == EXIT_CONFIG
    start = time.monotonic()
    with pytest.raises(ModelError, match="unreachable"):
        resolve_s3("s3://b/m", tmp_path, endpoint_url="http://127.0.0.1:9", region="us-east-1")
    assert time.monotonic() - start < 15, "bounded by the client's timeouts and retries"
    assert not (tmp_path / "models").exists()


def test_with_the_streamer_chosen_a_bad_prefix_or_refused_credentials_still_fail_before_vllm_starts(
    client, bucket, tmp_path, fake_vllm_python
):
    """LOAD_FORMAT=runai_streamer hands vLLM the read, not the checks: the plan's listing refuses a prefix
    with no weights and credentials the store refuses, exit 2, before any vLLM process exists."""
    from warmstart.plan import plan_boot

    not_a_model = put(client, bucket, {"config.json": b"{}", "model.bin": b"x"})
    with moto_server(auth=True) as url:
        for name, endpoint, why in (
            (not_a_model, client.meta.endpoint_url, "no \\*.safetensors"),
            ("s3://b/m", url, "check the credentials"),
        ):
            env = no_volume_env(tmp_path, fake_vllm_python, name, endpoint, LOAD_FORMAT="runai_streamer")
            with pytest.raises(ModelError, match=why) as caught:
                plan_boot(from_env(env))
            assert caught.value.exit_code == EXIT_CONFIG and SECRET_KEY not in str(caught.value)


def test_a_throttling_store_is_retried_and_one_that_always_throttles_fails_in_bounded_time(
    client, bucket, endpoint, tmp_path
):
    name = put(client, bucket, FILES)
    with throttled(endpoint, fault="slowdown", every=3) as url:
        model = resolve_s3(name, tmp_path / "a", endpoint_url=url, region="us-east-1")
    assert tree(model.path) == FILES
    with throttled(endpoint, fault="slowdown", every=1) as url:
        start = time.monotonic()
        with pytest.raises(ModelError, match="SlowDown"):
            resolve_s3(name, tmp_path / "b", endpoint_url=url, region="us-east-1")
    assert time.monotonic() - start < 20


def fetch_to(env: dict[str, str], to: str, capsys) -> tuple[int, dict, str]:
    from warmstart.cli import main

    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        code = main(["fetch", "--to", to])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else {}, err


def test_fetch_to_copies_the_pinned_snapshot_as_real_files_that_a_boot_reads_back(
    client, bucket, endpoint, tmp_path, tiny_model, volume, capsys
):
    env = {"MODEL_NAME": MODEL_ID, "RUNPOD_VOLUME_PATH": str(volume), "WARMSTART_S3_ENDPOINT_URL": endpoint}
    client.put_object(Bucket=bucket, Key="tiny/stale.safetensors", Body=b"an older upload's shard")
    code, out, _ = fetch_to(env, f"s3://{bucket}/tiny", capsys)
    assert code == 0 and out["uploaded"]["removed"] == ["stale.safetensors"]
    snapshot = {p.name: p.read_bytes() for p in tiny_model.snapshot.iterdir()}
    assert out["uploaded"]["files"] == len(snapshot) and out["revision"] == tiny_model.commit
    manifest = json.loads(client.get_object(Bucket=bucket, Key=f"tiny/{MANIFEST}")["Body"].read())
    assert manifest["source"] == {"repo_id": MODEL_ID, "revision": tiny_model.commit}
    assert {n: e["sha256"] for n, e in manifest["files"].items()} == {
        n: hashlib.sha256(d).hexdigest() for n, d in snapshot.items()
    }
    model = resolve_s3(f"s3://{bucket}/tiny", tmp_path / "local", endpoint_url=endpoint, region="us-east-1")
    assert tree(model.path) == snapshot and not any(p.is_symlink() for p in model.path.iterdir())


def test_fetch_to_refuses_a_corrupt_hf_cache_and_publishes_no_manifest(
    client, bucket, endpoint, tiny_model, volume, capsys
):
    shard = next(p for p in tiny_model.snapshot.iterdir() if p.name.endswith(".safetensors"))
    blob = shard.resolve()
    blob.write_bytes(blob.read_bytes()[::-1])  # same size, not the bytes the Hub's ETag names
    env = {"MODEL_NAME": MODEL_ID, "RUNPOD_VOLUME_PATH": str(volume), "WARMSTART_S3_ENDPOINT_URL": endpoint}
    code, _, err = fetch_to(env, f"s3://{bucket}/tiny", capsys)
    assert code == EXIT_CONFIG and "the HF cache is corrupt" in err
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix=f"tiny/{MANIFEST}")


def test_the_plan_only_lists_and_the_boot_reads_beside_the_restore(client, bucket, endpoint, tmp_path):
    name = put(client, bucket, FILES)
    model, read = plan_s3(name, tmp_path, endpoint_url=endpoint, region="us-east-1")
    assert not model.path.exists(), "one listing in the plan, no read"
    assert model.downloaded_bytes == model.bytes
    background = BackgroundRead.start(read)
    stats = background.join()
    assert stats.bytes == model.bytes and tree(model.path) == FILES
    again, _ = plan_s3(name, tmp_path, endpoint_url=endpoint, region="us-east-1")
    assert again.downloaded_bytes == 0, "already whole on local disk"


def test_an_object_lost_between_plan_and_read_fails_the_boot_before_vllm_starts(
    client, bucket, endpoint, tmp_path, fake_vllm_python
):
    from warmstart.boot import run_boot
    from warmstart.plan import plan_boot
    from warmstart.redact import Redactor

    name = put(client, bucket, FILES)
    env = no_volume_env(tmp_path, fake_vllm_python, name, endpoint)
    plan = plan_boot(from_env(env))
    client.delete_object(Bucket=bucket, Key="tiny/model.safetensors")
    with pytest.raises(ModelError, match="vanished while it was read") as caught:
        run_boot(plan, Redactor.from_env(env), echo=io.StringIO())
    assert caught.value.exit_code == EXIT_CONFIG
    assert not list((tmp_path / "local" / "models").rglob("*.safetensors")), "nothing half-read left"


def test_an_s3_tokenizer_is_the_models_own_prefix_read_with_it():
    same = from_env({"MODEL_NAME": "s3://vol/models/qwen", "TOKENIZER_NAME": "s3://vol/models/qwen/"})
    assert "TOKENIZER_NAME" not in same.engine, "no --tokenizer s3://...: the files are in the model's folder"
    assert any("read with the model" in w for w in same.warnings)
    with pytest.raises(Exception, match="MODEL_NAME's own prefix"):
        from_env({"MODEL_NAME": "s3://vol/models/qwen", "TOKENIZER": "s3://vol/tokenizers/qwen"})


def test_weights_read_from_s3_are_where_they_live_not_a_miss(tmp_path):
    from warmstart.model import ResolvedModel
    from warmstart.report.build import hf_weights_layer
    from warmstart.report.statuses import decide_verdict

    read = ResolvedModel("s3://vol/m", None, "s3-abc", tmp_path, "s3", 3, 3000, downloaded_bytes=3000)
    layer = hf_weights_layer(read)
    assert layer.status == "hit" and "read from s3://vol/m" in layer.detail
    assert decide_verdict({"inductor": replace(layer, detail="compiled"), "hf_weights": layer}) == "warm"


def test_load_format_runai_streamer_hands_the_url_and_only_then_the_credentials_to_vllm(
    client, bucket, endpoint, tmp_path, fake_vllm_python
):
    """The user's choice (worker-vllm's LOAD_FORMAT): vLLM's streamer reads the prefix itself. The plan still
    lists it once (the revision, the key) but reads nothing; vLLM gets the URL, `--load-format
    runai_streamer`, the streamer's endpoint variables and the S3 credentials, which it never gets otherwise;
    `warmstart key` shows none of them."""
    from warmstart.engine.process import engine_command, engine_environment
    from warmstart.plan import plan_boot
    from warmstart.redact import Redactor
    from warmstart.s3model import streamer_dir

    name = put(client, bucket, FILES)
    env = no_volume_env(tmp_path, fake_vllm_python, name, endpoint)
    staged = plan_boot(from_env(env), write=False)
    streamed = plan_boot(from_env({**env, "LOAD_FORMAT": "runai_streamer"}), write=False)
    by_extra_args = plan_boot(from_env({**env, "VLLM_EXTRA_ARGS": "--load-format=RUNAI_STREAMER"}), write=False)
    assert staged.streamed is None and staged.s3_read is not None and staged.engine_credentials == {}
    assert streamed.streamed == by_extra_args.streamed == name and streamed.s3_read is None
    assert streamed.model.revision == staged.model.revision, "the same listing pins both"
    assert streamed.key.dirname != staged.key.dirname, "LOAD_FORMAT is a key factor (engineflags.py)"
    assert (
        streamed.model.path
        == streamer_dir(name, env)
        == tmp_path / ".cache" / "vllm" / "assets" / ("model_streamer/" + hashlib.sha256(name.encode()).hexdigest()[:8])
    )
    argv = engine_command(streamed.engine, streamed.settings, streamed.model_arg, 8000, streamed.fit)
    assert argv[argv.index("--model") + 1] == name and argv[argv.index("--load-format") + 1] == "runai_streamer"
    given = engine_environment(streamed.settings.environ, streamed.engine_mapping)
    assert given["AWS_SECRET_ACCESS_KEY"] == SECRET_KEY and given["AWS_ENDPOINT_URL"] == endpoint
    assert given["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] == "0"
    assert "AWS_SECRET_ACCESS_KEY" not in engine_environment(staged.settings.environ, staged.engine_mapping)
    shown = json.dumps(streamed.describe(Redactor.from_env(env)))
    assert SECRET_KEY not in shown and "AWS_SECRET_ACCESS_KEY" not in shown
    # A model that is not in S3 is vLLM's to stream from disk: nothing of this applies.
    from warmstart_dev.testmodel import write_test_model

    write_test_model(tmp_path / "v" / "huggingface-cache" / "hub", MODEL_ID)
    local_env = {
        **base_env(tmp_path / "v", fake_vllm_python, tmp_path, **s3_env(endpoint)),
        "LOAD_FORMAT": "runai_streamer",
    }
    local = plan_boot(from_env(local_env), write=False)
    assert local.streamed is None and local.engine_credentials == {} and local.model.source == "hf-cache"


def test_the_streamers_read_is_reported_with_vllms_weights_phase(tmp_path):
    from warmstart.model import ResolvedModel
    from warmstart.report.build import hf_weights_layer
    from warmstart.report.weights import s3_read, with_streamer_seconds

    model = ResolvedModel("s3://vol/m", None, "s3-abc", tmp_path, "s3", 3, 3_000_000, downloaded_bytes=3_000_000)
    read = s3_read(model, None, streamed=True)
    assert (read["reader"], read["bytes"], read["seconds"]) == ("streamer", 3_000_000, None)
    timed = with_streamer_seconds(read, 1.5)
    assert (timed["seconds"], timed["mb_s"]) == (1.5, 2.0)
    assert with_streamer_seconds(read, None) == read, "no weights phase in the log: no figure invented"
    staged = s3_read(model, None)
    assert staged["reader"] == "staged" and with_streamer_seconds(staged, 9.0) == staged
    assert "streamed by vLLM from s3://vol/m" in hf_weights_layer(model, streamed=True).detail


def test_the_weights_line_says_who_read_from_s3():
    from warmstart.report.weights import describe

    skipped = {"status": "skipped", "reason": "vLLM's streamer reads the weights from S3 itself"}
    block = {"source": "s3", "fs": "", "files": 0, "bytes": 0, "prefetch": skipped, "vllm_weights_s": 1.5}
    streamed = {"reader": "streamer", "url": "s3://vol/m", "bytes": 3_000_000, "seconds": 1.5, "mb_s": 2.0}
    line = describe({**block, "read": streamed})
    assert "streamed by vLLM from s3://vol/m: 3.0 MB (2 MB/s)" in line and "before vLLM started" not in line
    unmarked = describe({**block, "vllm_weights_s": None, "read": {**streamed, "seconds": None, "mb_s": None}})
    assert "streamed by vLLM from s3://vol/m: 3.0 MB;" in unmarked and "no marker" in unmarked
    staged = {"reader": "staged", "url": "s3://vol/m", "bytes": 3_000_000, "seconds": 0.5, "mb_s": 6.0}
    assert "read from s3://vol/m before vLLM started: 3.0 MB in 0.5 s (6 MB/s)" in describe({**block, "read": staged})
