"""The Runpod SDK's import, done while vLLM boots, starts no second Python (issue 37).

runpod 1.12's rp_debugger calls py-cpuinfo's `get_cpu_info()` at import, for the processor string of its
debug output, and py-cpuinfo 9 answers by running `[sys.executable, cpuinfo.py, "--json"]`: about 1.1 s of
CPU taken from vLLM's CPU-bound start-up, and on 2 cores the log reader held 10-20 ms behind it
(`warmstart-dev bench rehearsal`, queue front). warmstart's import answers from /proc/cpuinfo instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from warmstart.worker.serve import processor_brand

PROBE = """
import json, sys
started = []
sys.addaudithook(lambda event, args: started.append([str(a) for a in args[1]]) if event == "subprocess.Popen" else None)
from warmstart.worker.serve import import_sdk
import_sdk()
from runpod.serverless.utils import rp_debugger
print(json.dumps({"started": started, "processor": rp_debugger.PROCESSOR}))
"""


def test_the_sdk_import_starts_no_python_and_still_names_the_processor():
    """What py-cpuinfo's import itself runs stays (`file -b` and `uname -p`, through the platform module: a few
    milliseconds); the interpreter it ran for the answer is gone, and the answer is the same string."""
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    programs = [Path(argv[0]).name for argv in seen["started"]]
    assert programs and not [p for p in programs if p.startswith("python")], seen["started"]
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    assert seen["processor"] == (names[0] if names else "Unable to get processor info.")


def test_the_processor_is_the_kernels_brand_string_or_nothing(tmp_path, monkeypatch):
    from warmstart import hardware

    intel = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    assert processor_brand(intel) == {"brand_raw": "Intel(R) Xeon(R) Platinum 8480+"}
    assert processor_brand("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\n") == {}  # arm64: no brand
    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(hardware, "CPUINFO", info)
    info.write_text(intel)
    assert processor_brand() == {"brand_raw": "Intel(R) Xeon(R) Platinum 8480+"}
    info.unlink()
    assert processor_brand() == {}
