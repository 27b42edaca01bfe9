"""What the worker's log says about taking jobs: job payloads never reach it (the runpod SDK logs every
job's input and output at DEBUG, runpod/serverless/modules/rp_job.py "Handler output: ...", and DEBUG is
its default level), and `taking jobs` is said only once jobs can be sent."""

from __future__ import annotations

import socket
import time

from helpers.worker import Worker
from warmstart.worker.serve import drop_verbose_rp_log_level, quiet_runpod_level

SENTINEL = "warmstart-sentinel-prompt-7f3a9c"


def test_a_sentinel_prompt_is_in_no_log_line(tmp_path, volume, tiny_model, fake_vllm_python):
    # RUNPOD_LOG_LEVEL=DEBUG asks for the payload dumps; they are refused all the same.
    worker = Worker(
        volume,
        tmp_path,
        fake_vllm_python,
        "payloads",
        FAKE_VLLM_MODE="ok",
        FAKE_SERVED=tiny_model.repo_id,
        RUNPOD_LOG_LEVEL="DEBUG",
    )
    try:
        worker.wait_serving(timeout=120)
        out = worker.runsync({"prompt": SENTINEL, "sampling_params": {"max_tokens": 2}})
        streamed = worker.runsync({"prompt": SENTINEL, "stream": True})
    finally:
        worker.stop()
    # The scripted engine echoes the body: the sentinel is in the output, so a dumped output would show it.
    assert SENTINEL in str(out) and streamed
    assert SENTINEL not in worker.log
    assert "taking jobs" in worker.log  # the log is the worker's own, not an empty file


def test_runpod_levels_that_log_payloads_are_raised_to_info():
    assert quiet_runpod_level("DEBUG") == quiet_runpod_level("trace") == "INFO"
    assert quiet_runpod_level("WARN") == "WARN"
    assert drop_verbose_rp_log_level(["--rp_serve_api", "--rp_log_level", "DEBUG", "--x"]) == ["--rp_serve_api", "--x"]
    assert drop_verbose_rp_log_level(["--rp_log_level=debug"]) == []
    assert drop_verbose_rp_log_level(["--rp_log_level", "ERROR"]) == ["--rp_log_level", "ERROR"]


def test_taking_jobs_is_said_once_the_local_api_server_listens(tmp_path, volume, tiny_model, fake_vllm_python):
    """It was printed before `import runpod` and uvicorn's start (about 5 s before the port listened)."""
    worker = Worker(
        volume, tmp_path, fake_vllm_python, "listening", FAKE_VLLM_MODE="ok", FAKE_SERVED=tiny_model.repo_id
    )
    try:
        deadline = time.monotonic() + 120
        while "taking jobs" not in worker.log:
            assert worker.proc.poll() is None and time.monotonic() < deadline, worker.log[-3000:]
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", worker.port), timeout=2):  # refused before the fix
            pass
        lines = [line for line in worker.log.splitlines() if "| serve " in line]
        assert "taking jobs" in lines[-2] and "send a job with: curl" in lines[-1], lines
    finally:
        worker.stop()
