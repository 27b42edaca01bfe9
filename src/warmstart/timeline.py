"""A picture of boots: one self-contained HTML page of horizontal phase bars.

Input is boot reports as dicts (the lines of a key's boots.jsonl, or `report_from_log`'s
report): phase names are read from the reports themselves, in the order they appear, so a
phase that a later release adds is drawn without a change here. Each boot is one row: its
phases laid end to end on a common time scale (a gap for seconds no phase covers, then the
ready line; `publish`, which runs after the worker is ready, is drawn past it, hatched),
its verdict, and a chip per cache layer with its status. Hovering a bar shows its phase and
seconds (`title` for the browser's tooltip, plus a CSS tooltip that needs no script).

The page loads nothing: no script, no font, no stylesheet from the network.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .vllm.phases import PHASES

# Phases drawn after the ready line (they do not delay the first request).
AFTER_READY = frozenset({"publish"})

_FIXED_COLOURS = {
    "resolve": "#8e9aaf",
    "restore": "#5fa8d3",
    "bootstrap": "#c9ada7",
    "tokenizer": "#b8c0ff",
    "weights": "#f4a261",
    "compile": "#e76f51",
    "kv_cache": "#2a9d8f",
    "cudagraph": "#9b5de5",
    "unlogged": "#dee2e6",  # time the log does not explain: drawn blank-ish, never in a phase's colour
    "api_ready": "#43aa8b",
    "publish": "#577590",
}
_PALETTE = ("#ff6f91", "#ffc75f", "#845ec2", "#00c9a7", "#c34a36", "#4b4453", "#b0a8b9", "#0081cf")
_STATUS_COLOURS = {
    "hit": "#2b9348",
    "miss": "#d00000",
    "load_failed": "#9d0208",
    "unused": "#adb5bd",
    "unknown": "#6c757d",
}
_VERDICT_COLOURS = {"warm": "#2b9348", "partial": "#f48c06", "cold": "#1d4ed8"}

_CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #1f2933;
       background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
.sub { color: #52606d; margin-bottom: 16px; word-break: break-all; }
.legend { display: flex; flex-wrap: wrap; gap: 12px; margin: 8px 0 16px; }
.legend span { display: inline-flex; align-items: center; gap: 4px; }
.legend i { width: 14px; height: 14px; display: inline-block; border-radius: 3px; }
.boot { display: grid; grid-template-columns: 230px 1fr; gap: 4px 12px; padding: 24px 0 10px;
        border-top: 1px solid #e4e7eb; }
.who { font-size: 13px; }
.verdict { display: inline-block; color: #fff; border-radius: 4px; padding: 1px 8px; font-weight: 600; }
.track { position: relative; height: 34px; background: #f5f7fa; border-radius: 4px; }
.bar { position: absolute; top: 3px; height: 28px; min-width: 3px; border-radius: 3px; overflow: visible;
       box-sizing: border-box; border-right: 1px solid #fff; }
.bar .label { position: absolute; left: 4px; top: 5px; font-size: 12px; color: #fff; white-space: nowrap;
              overflow: hidden; max-width: calc(100% - 6px); text-shadow: 0 0 2px rgba(0,0,0,.5); }
.bar.after { background-image: repeating-linear-gradient(45deg, rgba(255,255,255,.35) 0 4px, transparent 4px 8px); }
.bar.gap { background: repeating-linear-gradient(90deg, #d9dee4 0 2px, transparent 2px 6px); }
.bar:hover { outline: 2px solid #1f2933; z-index: 2; }
.bar:hover::after { content: attr(data-tip); position: absolute; bottom: 34px; left: 0; background: #1f2933;
                    color: #fff; padding: 3px 8px; border-radius: 4px; white-space: nowrap; font-size: 12px; }
.ready { position: absolute; top: -4px; bottom: -4px; width: 2px; background: #111; }
.ready span { position: absolute; top: -20px; font-size: 12px; font-weight: 600; white-space: nowrap;
              background: rgba(255,255,255,.85); padding: 0 3px; }
.caches { grid-column: 2; display: flex; flex-wrap: wrap; gap: 6px; font-size: 12px; }
.chip { border-radius: 10px; padding: 0 8px; color: #fff; }
.axis { grid-column: 2; position: relative; height: 16px; font-size: 11px; color: #52606d; }
.axis span { position: absolute; transform: translateX(-50%); white-space: nowrap; }
.summary { margin: 8px 0 16px; }
.summary td, .summary th { padding: 2px 12px 2px 0; text-align: left; }
.empty { color: #52606d; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _rank(name: str, seen: Sequence[str]) -> tuple[float, int]:
    """Where a phase goes on the bar. boots.jsonl stores a report's keys sorted by name, so the
    order of a boot is taken from the pipeline's phase list; a phase it does not know (a later
    vLLM's) goes before api_ready, in the order the reports name it."""
    if name in PHASES:
        return (float(PHASES.index(name)), 0)
    anchor = PHASES.index("api_ready") if "api_ready" in PHASES else len(PHASES)
    return (anchor - 0.5, seen.index(name) if name in seen else 0)


def _ordered(names: Iterable[str]) -> list[str]:
    seen = list(dict.fromkeys(names))
    return sorted(seen, key=lambda n: _rank(n, seen))


def phase_order(boots: Iterable[Mapping[str, Any]]) -> list[str]:
    """The phases any boot measured (vLLM logged a marker for them), in boot order."""
    names: list[str] = []
    for boot in boots:
        phases = boot.get("phases")
        if isinstance(phases, Mapping):
            names += [str(name) for name, value in phases.items() if value is not None]
    return _ordered(names)


def phase_colours(order: Sequence[str]) -> dict[str, str]:
    colours = {}
    spare = iter(_PALETTE * 4)
    for name in order:
        colours[name] = _FIXED_COLOURS.get(name) or next(spare)
    return colours


def _num(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _segments(boot: Mapping[str, Any]) -> tuple[list[tuple[str, float, float]], float | None, float]:
    """(phase, start, seconds) end to end; the ready time; where the row ends."""
    phases = boot.get("phases") if isinstance(boot.get("phases"), Mapping) else {}
    t = 0.0
    before: list[tuple[str, float, float]] = []
    after: list[tuple[str, float]] = []
    for name in _ordered(str(n) for n in phases):
        seconds = _num(phases[name])
        if seconds is None:
            continue
        if name in AFTER_READY:
            after.append((str(name), seconds))
            continue
        before.append((str(name), t, seconds))
        t += seconds
    ready = _num(boot.get("ready_s"))
    end = max(t, ready or 0.0)
    if ready is not None and ready - t > 0.05:
        before.append(("(unaccounted)", t, ready - t))
    segments = list(before)
    for name, seconds in after:
        segments.append((name, end, seconds))
        end += seconds
    return segments, ready, end


def _axis(scale: float) -> str:
    if scale <= 0:
        return ""
    step = next((s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600) if scale / s <= 10), 1200)
    ticks = []
    t = 0.0
    while t <= scale + 1e-9:
        ticks.append(f'<span style="left:{t / scale * 100:.3f}%">{t:g} s</span>')
        t += step
    return f'<div class="axis">{"".join(ticks)}</div>'


def _boot_row(index: int, boot: Mapping[str, Any], scale: float, colours: Mapping[str, str]) -> str:
    segments, ready, _ = _segments(boot)
    verdict = boot.get("verdict") or ("failed" if boot.get("error") else "?")
    colour = _VERDICT_COLOURS.get(str(verdict), "#6c757d")
    when = boot.get("started_at") or ""
    expected = boot.get("expected")
    ready_text = f"ready {ready:.1f} s" if ready is not None else "not ready"
    bars = []
    for name, start, seconds in segments:
        cls = "bar gap" if name == "(unaccounted)" else "bar" + (" after" if name in AFTER_READY else "")
        tip = f"{name}: {seconds:.2f} s"
        style = f"left:{start / scale * 100:.3f}%;width:{seconds / scale * 100:.3f}%"
        if name != "(unaccounted)":
            style += f";background-color:{colours.get(name, '#888')}"
        bars.append(
            f'<div class="{cls}" data-phase="{_esc(name)}" data-seconds="{seconds:.3f}" title="{_esc(tip)}" '
            f'data-tip="{_esc(tip)}" style="{style}"><span class="label">{_esc(name)} {seconds:.1f}s</span></div>'
        )
    if ready is not None:
        at = ready / scale * 100
        side = "right:6px" if at > 70 else "left:6px"  # keep the label inside the page
        bars.append(
            f'<div class="ready" data-ready="{ready:.3f}" style="left:{at:.3f}%">'
            f'<span style="{side}">{_esc(ready_text)}</span></div>'
        )
    chips = []
    caches = boot.get("caches") if isinstance(boot.get("caches"), Mapping) else {}
    for layer, info in caches.items():
        status = info.get("status") if isinstance(info, Mapping) else None
        detail = info.get("detail", "") if isinstance(info, Mapping) else ""
        chips.append(
            f'<span class="chip" data-layer="{_esc(layer)}" data-status="{_esc(status)}" title="{_esc(detail)}" '
            f'style="background:{_STATUS_COLOURS.get(str(status), "#6c757d")}">{_esc(layer)} {_esc(status)}</span>'
        )
    jit = boot.get("compiled_while_serving")
    if isinstance(jit, int) and not isinstance(jit, bool):
        kernels = ", ".join(sorted(set(boot.get("compiled_kernels") or ())))
        chips.append(
            f'<span class="chip" data-layer="compiled_while_serving" data-count="{jit}" title="{_esc(kernels)}" '
            f'style="background:{"#d00000" if jit else "#2b9348"}">{jit} kernel(s) JIT-compiled while serving</span>'
        )
    error = f'<div class="who">error: {_esc(boot["error"])}</div>' if boot.get("error") else ""
    return (
        f'<div class="boot" data-boot="{index}" data-verdict="{_esc(verdict)}">'
        f'<div class="who"><span class="verdict" style="background:{colour}">{_esc(verdict)}</span> '
        f"boot {index + 1}{' (expected ' + _esc(expected) + ')' if expected else ''}<br>"
        f"{_esc(when)}<br><b>{_esc(ready_text)}</b>{error}</div>"
        f'<div class="track">{"".join(bars)}</div>'
        f'<div class="caches">{"".join(chips)}</div></div>'
    )


def _summary(boots: Sequence[Mapping[str, Any]]) -> str:
    """Cold beside warm: the median ready time of each verdict."""
    by: dict[str, list[float]] = {}
    for b in boots:
        ready = _num(b.get("ready_s"))
        if ready is not None and b.get("verdict"):
            by.setdefault(str(b["verdict"]), []).append(ready)
    if not by:
        return ""
    rows = []
    for verdict in ("cold", "partial", "warm"):
        values = sorted(by.get(verdict, []))
        if values:
            median = values[len(values) // 2] if len(values) % 2 else sum(values[len(values) // 2 - 1 :][:2]) / 2
            rows.append(
                f'<tr data-summary="{verdict}"><td>{verdict}</td><td>{len(values)}</td><td>{median:.1f} s</td></tr>'
            )
    return (
        '<table class="summary"><tr><th>verdict</th><th>boots</th><th>median ready</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def render_timeline(boots: Sequence[Mapping[str, Any]], *, title: str, subtitle: str = "") -> str:
    """The whole page for these boots (oldest first)."""
    order = phase_order(boots)
    colours = phase_colours(order)
    scale = max((_segments(b)[2] for b in boots), default=0.0) or 1.0
    legend = "".join(f'<span><i style="background:{colours[n]}"></i>{_esc(n)}</span>' for n in order)
    legend += '<span><i class="bar gap" style="position:static;display:inline-block"></i>(unaccounted)</span>'
    rows = [_boot_row(i, b, scale, colours) for i, b in enumerate(boots)]
    body = "".join(rows) if rows else '<p class="empty">No boots recorded.</p>'
    axis = f'<div class="boot"><div></div>{_axis(scale)}</div>' if rows else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
        f'<h1>{_esc(title)}</h1><div class="sub">{_esc(subtitle)}</div>'
        f'{_summary(boots)}<div class="legend">{legend}</div>{body}{axis}</body></html>\n'
    )
