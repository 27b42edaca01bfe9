"""Job payloads never reach the worker's log: the runpod SDK logs every job's input and output at
DEBUG (runpod/serverless/modules/rp_job.py, "Handler output: ..."), and DEBUG is its default level."""

from __future__ import annotations

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
