"""`warmstart predict`: this configuration's cold and warm ready time, from the volume's history.

After the start-up study "Breaking the Ice": a boot is a few phases, each near-linear in a
few factors (checkpoint bytes for loading weights; layers and the number of batch sizes to
capture for compile and graph capture; context length and sequences for the KV cache). So
one small linear model per phase is fitted on every recorded boot on the volume, across
keys, separately for cold boots (the compile cache missed) and warm ones, and the phases
are summed. Phase names are read from the reports (data, not a fixed list): a phase without
an entry in PHASE_FEATURES is fitted on all features.

Plain Python least squares (ridge-regularised normal equations on standardised features),
no numpy: the wrapper's environment stays light. Ridge keeps the fit defined when there
are fewer distinct configurations than features, and shrinks toward the mean boot.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .vllm.phases import PHASES

if TYPE_CHECKING:
    from .store.layout import VolumeLayout

FEATURES = ("model_gb", "layers", "max_model_len", "max_num_seqs")
PHASE_FEATURES: Mapping[str, tuple[str, ...]] = {
    "resolve": ("model_gb",),
    "restore": (),
    "bootstrap": (),
    "tokenizer": (),
    "weights": ("model_gb",),
    "compile": ("layers", "max_num_seqs"),
    "kv_cache": ("max_model_len", "max_num_seqs", "model_gb"),
    "cudagraph": ("layers", "max_num_seqs"),
    "api_ready": (),
}
UNACCOUNTED = "unaccounted"
SKIP_PHASES = frozenset({"publish"})  # after ready: not part of the time to the first request
RIDGE = 1.0


# --------------------------------------------------------------------------- least squares


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a is small and, with ridge, well conditioned)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            continue
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] if abs(m[i][i]) >= 1e-12 else 0.0 for i in range(n)]


@dataclass(frozen=True)
class LinearModel:
    """y = intercept + sum(weight * (x - mean) / scale), fitted by ridge least squares."""

    features: tuple[str, ...]
    intercept: float
    weights: tuple[float, ...]
    means: tuple[float, ...]
    scales: tuple[float, ...]
    n: int

    def predict(self, x: Mapping[str, float]) -> float:
        y = self.intercept
        for name, w, mu, s in zip(self.features, self.weights, self.means, self.scales, strict=True):
            y += w * (x.get(name, mu) - mu) / s
        return max(0.0, y)

    @classmethod
    def fit(cls, rows: Sequence[tuple[Mapping[str, float], float]], features: Sequence[str]) -> LinearModel:
        n = len(rows)
        ys = [y for _, y in rows]
        mean_y = sum(ys) / n
        used, means, scales = [], [], []
        for f in features:
            values = [x[f] for x, _ in rows]
            mu = sum(values) / n
            sd = math.sqrt(sum((v - mu) ** 2 for v in values) / n)
            if sd > 1e-12:  # a feature that never varied in the history says nothing
                used.append(f)
                means.append(mu)
                scales.append(sd)
        k = len(used)
        z = [[(x[f] - mu) / s for f, mu, s in zip(used, means, scales, strict=True)] for x, _ in rows]
        ata = [[sum(zr[i] * zr[j] for zr in z) + (RIDGE if i == j else 0.0) for j in range(k)] for i in range(k)]
        aty = [sum(zr[i] * (y - mean_y) for zr, y in zip(z, ys, strict=True)) for i in range(k)]
        weights = _solve(ata, aty) if k else []
        return cls(tuple(used), mean_y, tuple(weights), tuple(means), tuple(scales), n)


# --------------------------------------------------------------------------- boots -> rows


def config_layers(snapshot: Path) -> float | None:
    try:
        data = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    value = text.get("num_hidden_layers") if isinstance(text, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def features_of(factors: Mapping[str, Any], model_bytes: float | None, layers: float | None) -> dict[str, float | None]:
    flags = (
        factors.get("flags") if isinstance(factors.get("flags"), Mapping) else {}
    )  # keys recorded before the `args` factor
    args = factors.get("args") if isinstance(factors.get("args"), Mapping) else {}

    def num(name: str) -> float | None:
        try:
            return float(args[name.lower()] if name.lower() in args else flags[name])
        except (KeyError, TypeError, ValueError):
            return None

    return {
        "model_gb": model_bytes / 1e9 if model_bytes is not None else None,
        "layers": layers,
        "max_model_len": num("MAX_MODEL_LEN"),
        "max_num_seqs": num("MAX_NUM_SEQS"),
    }


@dataclass(frozen=True)
class Sample:
    """One recorded boot, as the models see it."""

    key: str
    cold: bool
    x: Mapping[str, float | None]
    phases: Mapping[str, float]  # including UNACCOUNTED
    ready_s: float


def seeded_from(boot: Mapping[str, Any]) -> str | None:
    """The sibling key a boot's caches were seeded from (report `staged.seeded.from`), if any."""
    staged = boot.get("staged")
    seeded = staged.get("seeded") if isinstance(staged, Mapping) else None
    return seeded.get("from") if isinstance(seeded, Mapping) else None


def samples_from_history(
    boots: Iterable[tuple[str, Mapping[str, Any]]], layers_of: Callable[[Mapping[str, Any]], float | None]
) -> list[Sample]:
    """Completed boots -> samples. `layers_of(report)` finds the model's layer count."""
    out = []
    for key, boot in boots:
        ready = boot.get("ready_s")
        phases = boot.get("phases")
        if ready is None or boot.get("error") or not isinstance(phases, Mapping) or not boot.get("verdict"):
            continue
        if seeded_from(boot):  # compiled part of its kernels, seeded the rest: a sample of neither model
            continue
        factors = (boot.get("observed") or {}).get("key_factors") or {}
        model = boot.get("model") if isinstance(boot.get("model"), Mapping) else {}
        x = features_of(factors, model.get("bytes"), layers_of(boot))
        values = {str(k): float(v) for k, v in phases.items() if v is not None and k not in SKIP_PHASES}
        values[UNACCOUNTED] = max(0.0, float(ready) - sum(values.values()))
        out.append(Sample(key, boot.get("verdict") == "cold", x, values, float(ready)))
    return out


def _impute(samples: Sequence[Sample], x: Mapping[str, float | None]) -> dict[str, float]:
    """A missing feature takes the history's mean (so it pulls the prediction nowhere)."""
    out = {}
    for f in FEATURES:
        value = x.get(f)
        if value is None:
            known = [s.x[f] for s in samples if s.x.get(f) is not None]
            value = sum(known) / len(known) if known else 0.0  # type: ignore[arg-type]
        out[f] = float(value)  # type: ignore[arg-type]
    return out


@dataclass(frozen=True)
class PhaseModels:
    """Per phase, one linear model for cold boots and one for warm."""

    models: Mapping[tuple[str, bool], LinearModel]
    phases: tuple[str, ...]
    samples: tuple[Sample, ...]

    @classmethod
    def fit(cls, samples: Sequence[Sample]) -> PhaseModels:
        phases: list[str] = []
        for s in samples:
            for p in s.phases:
                if p not in phases:
                    phases.append(p)
        # boots.jsonl stores phases sorted by name: show them in the pipeline's order.
        known = {name: i for i, name in enumerate(PHASES)}
        phases.sort(key=lambda p: known.get(p, len(known) + (1 if p == UNACCOUNTED else 0)))
        models = {}
        for cold in (True, False):
            group = [s for s in samples if s.cold == cold]
            if not group:
                continue
            for phase in phases:
                rows = [(_impute(samples, s.x), s.phases[phase]) for s in group if phase in s.phases]
                if rows:
                    features = PHASE_FEATURES.get(phase, FEATURES)
                    models[(phase, cold)] = LinearModel.fit(rows, features)
        return cls(models, tuple(phases), tuple(samples))

    def has(self, cold: bool) -> bool:
        return any(c == cold for _, c in self.models)

    def predict(self, x: Mapping[str, float | None], cold: bool) -> tuple[float, dict[str, float]] | None:
        if not self.has(cold):
            return None
        full = _impute(self.samples, x)
        phases = {p: round(self.models[(p, cold)].predict(full), 3) for p in self.phases if (p, cold) in self.models}
        return round(sum(phases.values()), 3), phases


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class HeldOut:
    key: str
    cold: bool
    actual_s: float
    predicted_s: float

    @property
    def error_s(self) -> float:
        return self.predicted_s - self.actual_s


def evaluate(samples: Sequence[Sample]) -> dict[str, Any]:
    """Leave one key out: fit on every other key's boots, predict each boot of the held-out key.

    That is the question `predict` answers (a configuration the volume has not booted yet)."""
    results: list[HeldOut] = []
    baseline: list[HeldOut] = []  # the mean ready time of the other keys' boots (cold or warm alike)
    for key in sorted({s.key for s in samples}):
        train = [s for s in samples if s.key != key]
        models = PhaseModels.fit(train) if train else None
        for s in samples:
            if s.key != key or models is None:
                continue
            got = models.predict(s.x, s.cold)
            if got is not None:
                results.append(HeldOut(key, s.cold, s.ready_s, got[0]))
                same = [t.ready_s for t in train if t.cold == s.cold]
                baseline.append(HeldOut(key, s.cold, s.ready_s, sum(same) / len(same)))

    def stats(rows: list[HeldOut]) -> dict[str, Any]:
        if not rows:
            return {"n": 0}
        abs_err = [abs(r.error_s) for r in rows]
        return {
            "n": len(rows),
            "mae_s": round(sum(abs_err) / len(rows), 2),
            "max_abs_error_s": round(max(abs_err), 2),
            "mape_pct": round(100 * sum(abs(r.error_s) / r.actual_s for r in rows) / len(rows), 1),
            "mean_actual_s": round(sum(r.actual_s for r in rows) / len(rows), 2),
        }

    return {
        "method": "leave one key out",
        "keys": len({s.key for s in samples}),
        "boots": len(samples),
        "all": stats(results),
        "cold": stats([r for r in results if r.cold]),
        "warm": stats([r for r in results if not r.cold]),
        "baseline_mean_of_other_keys": {
            "all": stats(baseline),
            "cold": stats([r for r in baseline if r.cold]),
            "warm": stats([r for r in baseline if not r.cold]),
        },
        "held_out": [
            {"key": r.key, "cold": r.cold, "actual_s": r.actual_s, "predicted_s": round(r.predicted_s, 2)}
            for r in results
        ],
    }


LABELS = {"model_gb": "the model's size (GB)", "layers": "layers", "max_model_len": "MAX_MODEL_LEN",
          "max_num_seqs": "MAX_NUM_SEQS"}  # fmt: skip


def extrapolation(samples: Sequence[Sample], x: Mapping[str, float | None]) -> list[str]:
    """Why a prediction for `x` is an extrapolation: a feature outside every recorded boot's range
    (with one configuration on record, any change), or [] when it lies within them."""
    out = []
    configurations = {tuple(sorted(s.x.items())) for s in samples}
    for name in FEATURES:
        value = x.get(name)
        seen = sorted({v for s in samples if (v := s.x.get(name)) is not None})
        if value is None or not seen or seen[0] <= value <= seen[-1]:
            continue
        recorded = f"{seen[0]:g}" if len(seen) == 1 else f"{seen[0]:g} to {seen[-1]:g}"
        out.append(f"{LABELS[name]} {value:g} is outside what was recorded ({recorded})")
    if out and len(configurations) == 1:
        out.append(
            "one configuration is on record: each phase is predicted as it took there, whatever the settings; "
            "boot this configuration once (or a few others) for a fit that can tell"
        )
    return out


def prediction(
    models: PhaseModels, x: Mapping[str, float | None], *, init_timeout_s: float, timeout_from_env: bool
) -> dict[str, Any]:
    """The `predict --json` document for features `x`."""
    out: dict[str, Any] = {
        "features": dict(x),
        "boots_used": len(models.samples),
        "keys_used": len({s.key for s in models.samples}),
        "init_timeout_s": init_timeout_s,
        "warnings": [],
    }
    source = (
        "RUNPOD_INIT_TIMEOUT" if timeout_from_env else "Runpod's default cold-start limit (RUNPOD_INIT_TIMEOUT unset)"
    )
    out["extrapolating"] = outside = extrapolation(models.samples, x)
    if outside:
        out["warnings"].append("extrapolating: " + "; ".join(outside))
    for name, cold in (("cold", True), ("warm", False)):
        got = models.predict(x, cold)
        if got is None:
            out[name] = None
            out["warnings"].append(f"no {name} boot recorded on the volume: no {name} prediction")
            continue
        ready, phases = got
        out[name] = {"ready_s": ready, "phases": phases}
        if ready >= init_timeout_s:
            out["warnings"].append(
                f"predicted {name} ready time {ready:.0f} s crosses the {init_timeout_s:.0f} s of {source}: "
                f"set RUNPOD_INIT_TIMEOUT={int(ready * 1.5 + 60)} before deploying (the prediction times 1.5, "
                "plus 60 s: a worker's boot varies with its machine and its network volume's speed, and Runpod "
                "kills a worker that has not answered within the limit)"
            )
    out["crosses_init_timeout"] = any(
        out[n] is not None and out[n]["ready_s"] >= init_timeout_s for n in ("cold", "warm")
    )
    return out


def volume_samples(layout: VolumeLayout) -> list[Sample]:
    """Every completed boot recorded on the volume, as samples; a model's layers read from its snapshot."""
    from .store.scan import scan_volume

    scan = scan_volume(layout)

    def layers_of(report: dict) -> float | None:
        model = report.get("model") or {}
        if model.get("path") and (found := config_layers(Path(model["path"]))) is not None:
            return found
        snapshot = layout.hub_cache / ("models--" + str(model.get("name", "")).replace("/", "--"))
        return config_layers(snapshot / "snapshots" / str(model.get("revision", "")))

    return samples_from_history(((k.name, b) for k in scan.keys for b in k.history), layers_of)


def text_lines(data: Mapping[str, Any]) -> list[str]:
    """`warmstart predict`'s text: the key, then each of cold and warm with its phases."""
    out = [f"key {data['key']} ({data['boots_used']} boot(s) of {data['keys_used']} key(s) fitted)"]
    for name in ("cold", "warm"):
        if (got := data[name]) is not None:
            phases = ", ".join(f"{p} {v:.1f}s" for p, v in got["phases"].items())
            out.append(f"  {name}: ready in {got['ready_s']:.1f} s ({phases})")
    return out
