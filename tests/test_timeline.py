"""The timeline page, rendered by a real headless browser (Debian's chromium, `make test` installs it).

The DOM that chromium builds is checked (one bar per measured phase, labels, the ready line,
a chip per cache layer), and its screenshot must show the bars: pixels of the compile
phase's colour, not a blank page.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from helpers.browser import bars, colour_count, dump_dom, screenshot
from helpers.run import FIXTURES, WARMSTART
from warmstart.timeline import phase_colours, phase_order, render_timeline


@pytest.mark.browser
def test_report_html_draws_one_bar_per_phase_of_a_log(tmp_path):
    page = tmp_path / "cold.html"
    out = subprocess.run(
        [WARMSTART, "report", str(FIXTURES / "gpu-0.33-aot-cold.log"), "--json", "--html", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    measured = [name for name, value in report["phases"].items() if value is not None]
    assert {"bootstrap", "weights", "compile", "kv_cache", "cudagraph", "api_ready"} <= set(measured)
    html = page.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html  # nothing fetched
    dom = dump_dom(page, tmp_path)
    drawn = bars(dom)
    assert [p for p, _ in drawn if p != "(unaccounted)"] == measured
    for phase, label in drawn:
        if phase in report["phases"]:
            assert label == f"{phase} {report['phases'][phase]:.1f}s"
            assert f'title="{phase}: {report["phases"][phase]:.2f} s"' in dom  # the hover text
    assert f'data-ready="{report["ready_s"]:.3f}"' in dom
    assert 'data-layer="vllm_compile" data-status="miss"' in dom

    png = screenshot(page, tmp_path)
    compile_colour = phase_colours(measured)["compile"]
    hits, non_white = colour_count(png, compile_colour)
    assert hits > 2000, f"no compile bar in the screenshot ({hits} pixels of {compile_colour})"
    assert non_white > 10000


def _boot(verdict: str, ready: float, compile_s: float, extra: dict | None = None) -> dict:
    phases = {"resolve": 0.2, "restore": 0.3, "bootstrap": 20.0, "tokenizer": None, "weights": 0.4}
    phases.update({"compile": compile_s, "kv_cache": 2.0, "cudagraph": None, "api_ready": 1.0, "publish": 0.5})
    phases.update(extra or {})
    phases = dict(sorted(phases.items()))  # as boots.jsonl stores them (json.dumps sort_keys)
    status = "miss" if verdict == "cold" else "hit"
    return {
        "verdict": verdict,
        "expected": "miss" if verdict == "cold" else "hit",
        "ready_s": ready,
        "phases": phases,
        "started_at": "2026-12-01T00:00:00+00:00",
        "caches": {"inductor": {"status": status, "detail": "files"}, "hf_weights": {"status": "hit", "detail": "x"}},
    }


@pytest.mark.browser
def test_timeline_puts_cold_beside_warm_and_draws_new_phases(tmp_path):
    boots = [_boot("cold", 60.0, 35.0), _boot("warm", 28.5, 3.0, {"startup_plan": 0.7})]
    page = tmp_path / "key.html"
    page.write_text(render_timeline(boots, title="tiny-llama--key", subtitle="test"))
    dom = dump_dom(page, tmp_path)
    rows = re.findall(r'<div class="boot" data-boot="(\d+)" data-verdict="(\w+)"', dom)
    assert rows == [("0", "cold"), ("1", "warm")]
    per_row = dom.split('<div class="boot" data-boot=')[1:3]
    cold_bars = [p for p, _ in bars(per_row[0])]
    warm_bars = [p for p, _ in bars(per_row[1])]
    base = ["resolve", "restore", "bootstrap", "weights", "compile", "kv_cache", "api_ready"]
    assert cold_bars == [*base, "(unaccounted)", "publish"]
    # A phase the code never heard of goes before api_ready; publish comes after the ready line.
    assert warm_bars == [*base[:-1], "startup_plan", "api_ready", "(unaccounted)", "publish"]
    assert '<tr data-summary="cold"><td>cold</td><td>1</td><td>60.0 s</td></tr>' in dom
    assert 'data-layer="inductor" data-status="hit"' in dom
    png = screenshot(page, tmp_path)
    hits, _ = colour_count(png, phase_colours(base)["compile"])
    assert hits > 2000


def test_warmstarts_canary_is_drawn_after_api_ready_and_an_unknown_phase_before_it():
    """The canary runs once vLLM serves and before the worker is ready (canaryboot.py): after api_ready.
    Drawn before it (as an unknown vLLM phase), a real boot's bars disagreed with its record."""
    boot = _boot("warm", 28.5, 3.0, {"startup_plan": 0.7, "canary": 0.3})
    order = phase_order([boot])
    assert order[order.index("api_ready") - 1 :] == ["startup_plan", "api_ready", "canary", "publish"]
