"""A scripted stand-in for `python -m vllm.entrypoints.openai.api_server`, for fault injection.

It is installed as the `vllm` package of a throw-away environment (see conftest) and
behaves as FAKE_VLLM_MODE says:

    ok             print vLLM-like log lines, "compile" into TORCHINDUCTOR_CACHE_DIR, serve
    crash          print a few lines and a traceback, exit 1 before serving
    hang           print a few lines and never serve
    die_after=N    serve, then exit 1 after N seconds (an engine death while serving)
    engine_dead_after=N  serve; after N seconds the engine core dies and the API server lives on, as
                   with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1: /health answers 503 (vLLM 0.32 and 0.33,
                   entrypoints/serve/instrumentator/health.py: `except EngineDeadError: ... 503`)
    odd            serve, after log lines that look almost like vLLM's markers

FAKE_VLLM_ARTIFACTS=COUNT:BYTES:TAG adds COUNT compiled files of BYTES each (staged tests).
FAKE_VLLM_JIT_AFTER=SECONDS: SECONDS after it serves, "JIT-compile" a kernel while serving: write
TORCHINDUCTOR_CACHE_DIR/fake/jit/kernel.so and print vLLM 0.19+'s warning
(`Triton kernel JIT compilation during inference: <kernel>`, utils/jit_monitor.py).
FAKE_VLLM_CHUNK_DELAY_S=SECONDS: wait this long before each stream chunk (a request in flight).
A non-streaming answer echoes the request's body, route and headers; one that asks for `logprobs`
(warmstart's canary) gets greedy tokens with logprobs in vLLM's CompletionResponse shape, computed
from the first byte of the "compiled" TORCHINDUCTOR_CACHE_DIR/fake-kernel.so (an altered artifact
answers otherwise: a cache fault) plus FAKE_VLLM_CANARY_SHIFT (a model fault, cold or warm).
FAKE_VLLM_POOLING=1: /v1/completions answers 501 as vLLM does for a pooling model.

It also starts a child process ("EngineCore"), like vLLM, and writes both pids to
FAKE_VLLM_PIDFILE, so tests can check that stopping the server leaves no orphan.
FAKE_VLLM_ENVFILE: it writes the environment it was started with there (JSON), for the tests of
what reaches vLLM's environment.
Never used as proof that warmstart works: only real vLLM is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def say(text: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) INFO {stamp} [fake.py:1] {text}", flush=True)


API_KEY: str | None = None  # --api-key: /v1 routes want "Authorization: Bearer KEY", /health does not (as vLLM)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _unauthorized(self) -> bool:
        if API_KEY and self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self._json(401, {"error": "Unauthorized"})
            return True
        return False

    def _json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self._unauthorized():
            return
        if self.path == "/health":
            self._json(503 if engine_dead.is_set() else 200, {})
        elif self.path == "/v1/models":
            self._json(
                200, {"object": "list", "data": [{"id": os.environ.get("FAKE_SERVED", "fake"), "object": "model"}]}
            )
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        if self._unauthorized():
            return
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path not in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if body.get("model") not in (None, os.environ.get("FAKE_SERVED", "fake")):
            self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
            return
        if body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            delay = float(os.environ.get("FAKE_VLLM_CHUNK_DELAY_S") or 0)
            for i in range(3):
                time.sleep(delay)
                chunk = {"object": "chunk", "choices": [{"index": 0, "text": f"t{i}"}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            return
        if os.environ.get("FAKE_VLLM_POOLING") and self.path == "/v1/completions":  # vLLM: no completion handler
            self._json(501, {"error": {"message": "The model does not support Completions API"}})
            return
        if body.get("logprobs") and self.path == "/v1/completions":
            self._json(200, canary_answer(body))
            return
        self._json(
            200,
            {
                "object": "text_completion",
                "echo": body,
                "route": self.path,
                "headers": dict(self.headers.items()),
                "choices": [{"index": 0, "text": "fake"}],
            },
        )


def canary_answer(body: dict) -> dict:
    """A greedy answer with logprobs, as vLLM's /v1/completions gives it with `return_token_ids` and
    `return_tokens_as_token_ids` (vllm/entrypoints/openai/completion/protocol.py)."""
    kernel = os.path.join(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or ".", "fake-kernel.so")
    try:
        with open(kernel, "rb") as handle:
            computes = handle.read(1)[0]
    except (OSError, IndexError):
        computes = 0
    shift = int(os.environ.get("FAKE_VLLM_CANARY_SHIFT") or 0)
    prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
    choices = []
    for n, prompt in enumerate(prompts):
        seed = sum(prompt.encode()) + computes + shift
        ids = [(seed + 7 * i) % 512 for i in range(int(body.get("max_tokens") or 16))]
        lps = [-0.5 - 0.01 * i for i in range(len(ids))]
        top = [{f"token_id:{t}": lp, f"token_id:{(t + 1) % 512}": lp - 1.0} for t, lp in zip(ids, lps, strict=True)]
        logprobs = {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": lps, "top_logprobs": top}
        choices.append({"index": n, "text": "", "token_ids": ids, "logprobs": logprobs, "finish_reason": "length"})
    return {"object": "text_completion", "model": body.get("model"), "choices": choices}


serving = threading.Event()
engine_dead = threading.Event()


def main() -> None:
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    host = args[args.index("--host") + 1]
    global API_KEY
    # As vLLM: --api-key, else VLLM_API_KEY (vllm/entrypoints/serve/middleware/register.py).
    API_KEY = (args[args.index("--api-key") + 1] if "--api-key" in args else None) or os.environ.get("VLLM_API_KEY")
    say("fake vLLM starting with args " + " ".join(args))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])

    def on_term(*_: object) -> None:  # like vLLM: take the engine core down too
        if not serving.is_set():  # vLLM 0.32 during its init (api_server/entry.py `_interrupt_init`)
            print(
                'Traceback (most recent call last):\n  File "entry.py", line 172, in _interrupt_init\n'
                '    raise KeyboardInterrupt("terminated")\nKeyboardInterrupt: terminated',
                flush=True,
            )
        child.kill()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    if envfile := os.environ.get("FAKE_VLLM_ENVFILE"):
        with open(envfile, "w") as handle:
            json.dump(dict(os.environ), handle)
    if pidfile := os.environ.get("FAKE_VLLM_PIDFILE"):
        with open(pidfile, "w") as handle:
            handle.write(f"{os.getpid()} {child.pid}\n")
    print(
        f"(EngineCore pid={child.pid}) INFO 11-29 10:00:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) "
        "with config: model='fake'",
        flush=True,
    )
    if mode == "crash":
        print("Traceback (most recent call last):\nRuntimeError: fake engine crashed on purpose", flush=True)
        child.kill()
        sys.exit(1)
    if mode == "hang":
        time.sleep(3600)
    if mode == "odd":
        print("Loading weights took a long time", flush=True)
        print("torch.compile took forever s in total", flush=True)
        print("\x00\xff binary noise \u2603", flush=True)
    say("Starting to load model fake...")
    say("Loading weights took 0.01 seconds")
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache:
        os.makedirs(cache, exist_ok=True)
        artifact = os.path.join(cache, "fake-kernel.so")
        if not os.path.exists(artifact):
            with open(artifact, "wb") as handle:
                handle.write(b"\0" * 4096)
        # FAKE_VLLM_ARTIFACTS=COUNT:BYTES:TAG "compiles" COUNT more files of BYTES each.
        if spec := os.environ.get("FAKE_VLLM_ARTIFACTS"):
            count, size, tag = spec.split(":")
            os.makedirs(os.path.join(cache, "fake", tag), exist_ok=True)
            for i in range(int(count)):
                with open(os.path.join(cache, "fake", tag, f"kernel-{i}.so"), "wb") as handle:
                    handle.write(os.urandom(int(size)))
    say("init engine (profile, create kv cache, warmup model) took 0.10 s")
    server = ThreadingHTTPServer((host, port), Handler)
    if mode.startswith("die_after="):
        delay = float(mode.split("=", 1)[1])

        def die() -> None:
            time.sleep(delay)
            print("fake engine died while serving", flush=True)
            child.kill()
            os._exit(1)

        threading.Thread(target=die, daemon=True).start()
    if mode.startswith("engine_dead_after="):
        delay_dead = float(mode.split("=", 1)[1])

        def engine_dies() -> None:
            time.sleep(delay_dead)
            print("fake engine core died; the API server stays up", flush=True)
            child.kill()
            engine_dead.set()

        threading.Thread(target=engine_dies, daemon=True).start()
    if jit_after := os.environ.get("FAKE_VLLM_JIT_AFTER"):

        def jit() -> None:
            time.sleep(float(jit_after))
            folder = os.path.join(cache or ".", "fake", "jit")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "kernel.so"), "wb") as handle:
                handle.write(os.urandom(2048))
            print(
                f"(EngineCore pid={child.pid}) WARNING 11-29 10:00:09 [jit_monitor.py:112] Triton kernel JIT "
                "compilation during inference: _fake_decode_kernel (grid=(4, 1, 1)). This causes a latency spike; "
                "consider extending warmup to cover this shape/config.",
                flush=True,
            )

        threading.Thread(target=jit, daemon=True).start()
    say(f"Starting vLLM server on http://{host}:{port}")
    serving.set()
    print("INFO:     Application startup complete.", flush=True)
    try:
        server.serve_forever()
    finally:
        child.kill()


if __name__ == "__main__":
    main()
