# warmstart: vLLM on Runpod Serverless with its compile and kernel caches on the network volume.
#
#   docker build -t you/warmstart .
#   docker build -t you/warmstart-qwen --build-arg MODEL_NAME=Qwen/Qwen3-8B --secret id=HF_TOKEN .
#   docker build -t you/warmstart-qwen-warm --build-arg MODEL_NAME=Qwen/Qwen3-8B \
#       --build-arg WARMSTART_CACHES=image-caches/qwen.tar --secret id=HF_TOKEN .   # caches too
#
# The vLLM version is pinned by the base image tag; warmstart reads it from vLLM's metadata.
# v0.33.0 is built on CUDA 13.0 with forward compatibility off: hosts need a CUDA 13 driver
# (.runpod/hub.json allows only those). src/warmstart/images.py lists tags and their CUDA;
# for older drivers build with a CUDA 12.9 tag (README: "Hosts, drivers and image tags").
ARG VLLM_IMAGE_TAG=v0.33.0
# Runpod Serverless runs linux/amd64; pinned so that a build on an arm64 machine (the vLLM
# image is published for both) does not produce an image Runpod cannot start.
# hadolint ignore=DL3029
FROM --platform=linux/amd64 vllm/vllm-openai:${VLLM_IMAGE_TAG}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# warmstart gets an environment of its own: runpod's fastapi pin conflicts with vLLM's, and
# the wrapper never imports vLLM. It starts vLLM with the interpreter behind `vllm` on PATH.
COPY pyproject.toml README.md /opt/warmstart-src/
COPY src /opt/warmstart-src/src
RUN python3 -m venv /opt/warmstart \
    && /opt/warmstart/bin/pip install --no-cache-dir /opt/warmstart-src \
    && ln -s /opt/warmstart/bin/warmstart /usr/local/bin/warmstart \
    && warmstart --help > /dev/null

ENV RUNPOD_VOLUME_PATH=/runpod-volume \
    WARMSTART_LOCAL_CACHE=/tmp/warmstart \
    PYTHONUNBUFFERED=1

# Optional: bake a model into the image (worker-vllm's build args). It is read from here
# when the volume's HF cache lacks it; the HF token is a build secret and stays out of layers.
ARG MODEL_NAME=""
ARG MODEL_REVISION=""
# A Hub mirror to download from (huggingface_hub's HF_ENDPOINT); empty: the Hub itself. Not kept in the image.
ARG HF_ENDPOINT=""
ENV WARMSTART_BAKED_HF_CACHE=/opt/warmstart-models/hub
RUN --mount=type=secret,id=HF_TOKEN,required=false \
    if [ -n "${MODEL_NAME}" ]; then \
        if [ -z "${HF_ENDPOINT}" ]; then unset HF_ENDPOINT; fi; \
        HF_TOKEN="$(cat /run/secrets/HF_TOKEN 2>/dev/null || true)" \
        MODEL_NAME="${MODEL_NAME}" MODEL_REVISION="${MODEL_REVISION}" \
        warmstart fetch --hub-cache "${WARMSTART_BAKED_HF_CACHE}"; \
    fi
ENV MODEL_NAME=${MODEL_NAME} \
    MODEL_REVISION=${MODEL_REVISION}

# Optional: bake keys' compile and kernel caches into the image, so that a worker starts warm in any
# datacenter with no volume and no bucket (docs/deploying.md, "Caches baked into the image").
# WARMSTART_CACHES: a folder or a .tar in the build context written by `warmstart export`. The default,
# image-caches/, holds only its README: nothing is baked. Read-only at run time: a restore tier before
# the volume and S3, checked like them; kernels compiled while serving still go to the volume or S3.
# After the model: new caches rebuild a small layer, not the model's.
ARG WARMSTART_CACHES=image-caches
ENV WARMSTART_IMAGE_CACHES=/opt/warmstart-caches
# ADD, not COPY: it unpacks a .tar export (and copies a folder as COPY would).
# hadolint ignore=DL3020
ADD ${WARMSTART_CACHES} ${WARMSTART_IMAGE_CACHES}/

ENTRYPOINT ["warmstart", "serve"]
