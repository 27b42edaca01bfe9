"""Secrets set to sentinels, and a search for them in texts and files (tar members included)."""

from __future__ import annotations

import tarfile
from pathlib import Path

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
FLAG_SENTINELS = (API_KEY_SENTINEL, API_KEY_SENTINEL_2)


def secret_env() -> dict[str, str]:
    return {**SENTINELS, "VLLM_EXTRA_ARGS": f"--api-key {API_KEY_SENTINEL} {API_KEY_SENTINEL_2}"}


def all_sentinels() -> list[str]:
    return [*SENTINELS.values(), *FLAG_SENTINELS]


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
            if path.suffix == ".tar":
                with tarfile.open(path) as tar:
                    for member in tar:
                        if member.isfile() and (handle := tar.extractfile(member)) is not None:
                            scan(f"{path}!{member.name}", handle.read())
    return found
