"""vLLM image tags and the CUDA they are built on: what a Runpod host's driver must support.

`vllm/vllm-openai` images run with CUDA forward compatibility off
(`ENV VLLM_ENABLE_CUDA_COMPATIBILITY=0` in vLLM's docker/Dockerfile), so torch fails at CUDA
init on a host whose driver supports an older CUDA than the image's. Runpod filters hosts
by the highest CUDA version their driver supports (`allowedCudaVersions`), so the Hub files
must allow exactly the versions at or above the image's. This table is the one place that
says which image is which; tests/test_packaging.py checks the Dockerfile's default tag and
.runpod/*.json against it, and tests/test_releases.py each release's entry against that
release's own docker/Dockerfile.

Only tags read from a source are listed, each with that source. Rules (vLLM PR #39878,
"Switch default CUDA to 13.0", first released in v0.20.0): from v0.20.0 the unsuffixed tag
is CUDA 13.0 and `-cu129` tags are CUDA 12.9; before v0.20.0 the unsuffixed tag was 12.9.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageCuda:
    """One image tag: the CUDA (major.minor) it is built on, and where that was read."""

    cuda: str
    source: str


def _dockerfile(release: str, ubuntu: str) -> ImageCuda:
    """A release whose sdist's docker/Dockerfile builds on CUDA 13.0.3 (checked by tests/test_releases.py)."""
    return ImageCuda(
        "13.0",
        f"vLLM {release} sdist docker/Dockerfile: ARG CUDA_VERSION=13.0.3, UBUNTU_VERSION={ubuntu}, "
        "FINAL_BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}, "
        "ENV VLLM_ENABLE_CUDA_COMPATIBILITY=0; docker/versions.json CUDA_VERSION 13.0.3",
    )


VLLM_IMAGES: dict[str, ImageCuda] = {
    # 0.27.1 is worker-vllm's base today: where users who move to warmstart come from.
    "v0.27.1": _dockerfile("0.27.1", "22.04"),
    "v0.28.0": _dockerfile("0.28.0", "24.04"),
    "v0.29.0": _dockerfile("0.29.0", "24.04"),
    "v0.30.0": _dockerfile("0.30.0", "24.04"),
    "v0.31.0": _dockerfile("0.31.0", "24.04"),
    "v0.32.0": _dockerfile("0.32.0", "24.04"),
    "v0.33.0": _dockerfile("0.33.0", "24.04"),
    "v0.20.2": ImageCuda(
        "13.0",
        "llm-d/llm-d-kv-cache PR #584: 'The plain :v0.20.2 tag now resolves to a cu130 build'; "
        "vLLM PR #39878 (CUDA 13.0 the unsuffixed default)",
    ),
    "v0.20.2-cu129": ImageCuda(
        "12.9",
        "llm-d/llm-d-kv-cache PR #584 pins vllm/vllm-openai:v0.20.2-cu129 for CUDA 12 wheels; "
        "vLLM PR #39878 (-cu129: the CUDA 12.9 variant)",
    ),
}

# Runpod's accepted values for allowedCudaVersions, newest first (Runpod REST API OpenAPI
# schema, runpod/docs api-reference/openapi.json: EndpointUpdateInput.allowedCudaVersions enum).
# A value is the highest CUDA version a host's driver supports.
RUNPOD_CUDA_VERSIONS: tuple[str, ...] = (
    "13.0",
    "12.9",
    "12.8",
    "12.7",
    "12.6",
    "12.5",
    "12.4",
    "12.3",
    "12.2",
    "12.1",
    "12.0",
    "11.8",
)


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def image_cuda(tag: str) -> str:
    """The CUDA version of a listed vLLM image tag. KeyError for a tag nobody checked."""
    return VLLM_IMAGES[tag].cuda


def allowed_cuda_versions(cuda: str) -> list[str]:
    """The Runpod host CUDA versions that can run an image built on `cuda` (no forward compatibility)."""
    floor = _version(cuda)
    return [v for v in RUNPOD_CUDA_VERSIONS if _version(v) >= floor]
