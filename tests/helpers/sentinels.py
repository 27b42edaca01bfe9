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
}
# Passed as `--api-key` in VLLM_EXTRA_ARGS: on vLLM's command line, and in warmstart's record of it.
API_KEY_SENTINEL = "sentinelAPIKEYflag8c4e"


def secret_env() -> dict[str, str]:
    return {**SENTINELS, "VLLM_EXTRA_ARGS": f"--api-key {API_KEY_SENTINEL}"}


def find_sentinels(texts: dict[str, str], roots: list[Path]) -> list[str]:
    """Every place a sentinel appears: in the given texts, and in every file under `roots`,
    tar members included (published bundles are scanned inside, not only as bytes)."""
    sentinels = [*SENTINELS.values(), API_KEY_SENTINEL]
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
