"""The docs' GPU boots are illustrations, and they print what warmstart prints for the fixture logs."""

from __future__ import annotations

import pytest

from helpers.run import FIXTURES, REPO
from warmstart.report.fromlog import report_from_log


@pytest.mark.parametrize(
    ("doc", "fixture"),
    [("docs/boot-report.md", "gpu-0.33-aot-cold.log"), (".runpod/README.md", "gpu-0.33-aot-warm.log")],
)
def test_gpu_sample_boot_is_labelled_and_matches_the_report(doc, fixture):
    text = (REPO / doc).read_text()
    assert "an illustration, not a measurement" in " ".join(text.lower().split())
    assert f"gpu-0.33-{fixture.split('gpu-0.33-')[1]}" in text
    printed = report_from_log((FIXTURES / fixture).read_text().splitlines()).lines()
    prefixes = ("warmstart | phases", "warmstart | cache    | vllm", "warmstart | cache    | startup_plan")
    block = text[text.lower().index("illustration") :].split("```")[1]  # the sample that the label introduces
    shown = [line for line in block.splitlines() if line.startswith(prefixes)]
    assert shown, doc
    for line in shown:
        assert line in printed, line
