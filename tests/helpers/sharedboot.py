"""One real cold boot of the default configuration per test run, shared by every xdist worker.

Several vLLM tests begin the same way: the tiny model on a fresh volume, one cold `warmstart boot` with
`base_env`'s settings, then what the test is about (the canary's faults, the volume tools, a reference
completion). Each of those boots cost 30-40 s of CPU on the 2-core machine, so the run makes it once,
under a file lock in the directory the workers share, and each test gets a copy of its volume
(`ColdBoot.copy_to`) with the report's paths moved to the copy. The boot is what `warmstart boot --json`
runs (`run_boot`, `stop`, the report), plus the greedy completions of `PROMPTS` asked while vLLM serves,
after the boot published. Its users: the canary's first boot, the volume tools' configuration a, the S3
model's reference completion, the siblings' strict-math reference, the S3 tier's datacenter A (which
publishes the copy to the bucket) and the weights prefetch's volume. The test that needs a cold boot of its
own, or checks the cold boot itself (test_boot_vllm.py, the worker fronts, staged mode's racing pair), keeps
its own.

Run as a script it is the boot itself: `python sharedboot.py OUT` in the environment to boot with."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Prompts whose greedy completions the tests compare against (prompt -> max_tokens).
PROMPTS = {"The bucket holds": 12}


@dataclass(frozen=True)
class ColdBoot:
    """The shared boot: its volume (never written to: copy it), report, log and completions."""

    volume: Path
    report: dict[str, Any]
    log: str
    completions: dict[str, str]

    def copy_to(self, target: Path) -> tuple[Path, dict[str, Any]]:
        """A copy of the volume at `target` (the HF cache's links kept as links), and the report with
        every path under the shared volume moved under `target`."""
        shutil.copytree(self.volume, target, symlinks=True)
        moved = json.dumps(self.report).replace(json.dumps(str(self.volume))[1:-1], json.dumps(str(target))[1:-1])
        return target, json.loads(moved)


def shared_cold_boot(root: Path, env: dict[str, str]) -> ColdBoot:
    """The run's cold boot under `root` (made by whichever worker asks first; the others wait on the
    lock). `env` is the boot's environment with `RUNPOD_VOLUME_PATH` and the local cache under `root`.
    A boot that failed fails every test that asks, with its log, instead of booting again."""
    root.mkdir(parents=True, exist_ok=True)
    done, failed = root / "boot.json", root / "failed.log"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists() and not failed.exists():
            _boot(root, env, done, failed)
    if failed.exists():
        raise AssertionError("the run's shared cold boot failed:\n" + failed.read_text()[-4000:])
    made = json.loads(done.read_text())
    return ColdBoot(Path(env["RUNPOD_VOLUME_PATH"]), made["report"], made["log"], made["completions"])


def _boot(root: Path, env: dict[str, str], done: Path, failed: Path) -> None:
    from warmstart_dev.testmodel import write_test_model

    write_test_model(Path(env["RUNPOD_VOLUME_PATH"]) / "huggingface-cache" / "hub", env["MODEL_NAME"])
    out = root / "boot.partial.json"
    run = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=1500)
    if run.returncode != 0 or not out.exists():
        failed.write_text(f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr}")
        return
    made = json.loads(out.read_text())
    done.write_text(json.dumps({**made, "log": run.stderr}))


def main() -> None:
    import urllib.request

    from warmstart.boot import run_boot
    from warmstart.plan import plan_boot
    from warmstart.redact import Redactor
    from warmstart.settings import from_env

    env = dict(os.environ)
    plan = plan_boot(from_env(env))
    boot, report = run_boot(plan, Redactor.from_env(env))
    completions = {}
    try:
        assert boot.engine is not None, report.to_dict().get("error")
        for prompt, tokens in PROMPTS.items():
            body = {"model": plan.settings.served_model_name, "prompt": prompt, "max_tokens": tokens, "temperature": 0}
            request = urllib.request.Request(
                boot.engine.base_url + "/v1/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=300) as response:
                completions[prompt] = json.loads(response.read())["choices"][0]["text"]
    finally:
        boot.stop()
    Path(sys.argv[1]).write_text(json.dumps({"report": report.to_dict(), "completions": completions}))


if __name__ == "__main__":
    main()
