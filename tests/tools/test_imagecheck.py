"""The stand-in base of `make image-check` copies vLLM 0.33.0's `vllm-openai` stage where warmstart depends on it.

`make image-check` itself builds and runs images (about 20 min): it is not part of `make test`. What can drift
without it noticing is the stand-in's claim to look like the real image; that is checked here against the real
`docker/Dockerfile` of the vLLM sdist (cached as tests/vllm/test_releases.py caches it).
"""

from __future__ import annotations

import re

from helpers.vllm_sources import dockerfile
from warmstart_dev import imagecheck

STANDIN = (imagecheck.HERE / "standin.Containerfile").read_text()


def stage(text: str, name: str) -> str:
    """The lines of one stage of a multi-stage Dockerfile (`FROM ... AS name` up to the next FROM)."""
    match = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", text, flags=re.M | re.S)
    assert match, name
    return match.group(1)


def test_the_standin_has_the_real_images_entrypoint_workdir_and_variables():
    upstream = dockerfile("0.33.0")
    openai = stage(upstream, "vllm-openai")
    runtime = stage(upstream, "vllm-runtime-base")
    assert 'ENTRYPOINT ["vllm", "serve"]' in openai and 'ENTRYPOINT ["vllm", "serve"]' in STANDIN
    assert "WORKDIR /vllm-workspace" in runtime and "WORKDIR /vllm-workspace" in STANDIN
    assert "ENV VLLM_ENABLE_CUDA_COMPATIBILITY=0" in runtime and "VLLM_ENABLE_CUDA_COMPATIBILITY=0" in STANDIN
    assert re.search(r"^ENV VLLM_USAGE_SOURCE production-docker-image", upstream, flags=re.M)
    assert "VLLM_USAGE_SOURCE=production-docker-image" in STANDIN
    # vLLM goes into the system Python, whose pip guard is removed: `vllm` on PATH names that Python in its shebang,
    # which is how warmstart finds vLLM's interpreter (vllm/install.py find_vllm_python).
    assert "uv pip install --system dist/*.whl" in upstream
    assert "rm -f /usr/lib/python${PYTHON_VERSION}/EXTERNALLY-MANAGED" in runtime
    assert "rm -f /usr/lib/python3*/EXTERNALLY-MANAGED" in STANDIN and "test -x /usr/local/bin/vllm" in STANDIN
    assert "USER" not in re.sub(r"^#.*$", "", openai, flags=re.M)  # the default target runs as root


def test_the_project_dockerfile_is_built_on_the_standin_unchanged():
    # `buildah bud --from` replaces the first FROM only; everything else in the Dockerfile is what users build.
    text = (imagecheck.REPO / "Dockerfile").read_text()
    froms = re.findall(r"^FROM .*$", text, flags=re.M)
    assert froms == ["FROM --platform=linux/amd64 vllm/vllm-openai:${VLLM_IMAGE_TAG}"]
    assert 'ENTRYPOINT ["warmstart", "serve"]' in text
