"""One `warmstart serve --rp_serve_api` process, driven over Runpod's local API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from helpers.run import WARMSTART, base_env, engine_pid
from warmstart.engine.ports import free_port


class Worker:
    """One `warmstart serve --rp_serve_api` process and its log."""

    def __init__(self, volume: Path, home: Path, vllm_python: str, name: str, **extra_env: str) -> None:
        self.port = free_port()
        self.log_path = home / f"{name}.log"
        env = base_env(
            volume, vllm_python, home, **{"MAX_MODEL_LEN": "512", "WARMSTART_EXIT_GRACE_S": "3", **extra_env}
        )
        self._logfile = open(self.log_path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(
            [WARMSTART, "serve", "--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", str(self.port)],
            env=env,
            stdout=self._logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, path: str, payload: dict, timeout: float = 300) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(payload).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())

    def runsync(self, job_input: dict) -> dict:
        return self.post("/runsync", {"input": job_input})

    def wait_serving(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log[-4000:]}")
            if "taking jobs" in self.log:
                try:
                    self.runsync({"warmstart": "boot_report"})
                    return
                except (urllib.error.URLError, ConnectionError):
                    pass
            time.sleep(0.5)
        raise AssertionError(f"worker not serving after {timeout} s:\n{self.log[-4000:]}")

    def vllm_pgid(self) -> int:
        return engine_pid(self.log)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._logfile.close()
