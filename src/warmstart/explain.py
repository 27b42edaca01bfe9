"""`warmstart explain`: will the next boot be cold, and why was the last one?

Without an argument it derives the key for the current environment (as `warmstart key`
does: no vLLM start, no download) and compares it with the keys on the volume. A key that
is absent means a cold boot; the nearest existing keys are named with the factors that
differ, old -> new, in the words a user set them with (`MAX_MODEL_LEN 4096 -> 8192`,
`vLLM 0.32.0 -> 0.33.0`), so the change that split the cache is found before anyone
starts a worker. With a key, or `--last`, it reads the key's last boot and makes its
`miss_reason` readable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .key import factor_diff
from .store.backend import BundleStore
from .store.scan import KeyInfo, VolumeScan
from .store.siblings import SeedPlan, Sibling, choose_seeds

NEAREST = 3

# Flattened factor name -> what a user knows it as. Anything else keeps its dotted name
# (flags.X and vllm_env.X become X: the environment variable the user set; args.X becomes
# the flag, `--x`, however the user spelled it).
_LABELS = {
    "model": "MODEL_NAME",
    "revision": "MODEL_REVISION",
    "engine.vllm": "vLLM",
    "engine.dist": "vLLM build",
    "engine.torch": "torch",
    "engine.triton": "Triton",
    "engine.python": "Python",
    "engine.flashinfer": "FlashInfer",
    "engine.deep_gemm": "DeepGEMM",
    "hardware.kind": "hardware",
    "hardware.name": "GPU/CPU",
    "hardware.capability": "compute capability",
    "hardware.count": "GPU count",
    "hardware.features": "CPU features",
    "extra_args": "VLLM_EXTRA_ARGS",
}


def factor_label(name: str) -> str:
    if name in _LABELS:
        return _LABELS[name]
    if name.startswith("args."):  # a value vLLM's parser sets: named by its flag
        dest = name[len("args.") :].split(".", 1)[0]
        return dest if dest.startswith("-") else "--" + dest.replace("_", "-")
    for prefix in ("flags.", "vllm_env.", "engine."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def factor_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[Any]]:
    """{label: [old, new]} for every factor that differs (None where one side lacks it)."""
    return {factor_label(name): pair for name, pair in factor_diff(old, new).items()}


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)


def describe_differences(differs: Mapping[str, list[Any]]) -> str:
    return ", ".join(f"{name} {_show(old)} -> {_show(new)}" for name, (old, new) in differs.items())


@dataclass(frozen=True)
class Nearest:
    key: str
    differs: dict[str, list[Any]]
    last_verdict: str | None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "differs": self.differs, "last_verdict": self.last_verdict}


@dataclass(frozen=True)
class Explanation:
    """What `explain` found for one key (the current configuration's, or a named one)."""

    key: str
    exists: bool
    next_boot: str | None  # cold | warm-expected, for the current configuration
    reason: str
    nearest: tuple[Nearest, ...] = ()
    last_boot: Mapping[str, Any] | None = None  # verdict, expected, started_at, ready_s
    why: tuple[str, ...] = ()  # readable reasons the last boot missed
    warnings: tuple[str, ...] = ()
    factors: Mapping[str, Any] = field(default_factory=dict)
    seed: SeedPlan | None = None  # a key with no generation of its own: where its boot will seed from

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "exists": self.exists,
            "next_boot": self.next_boot,
            "reason": self.reason,
            "nearest": [n.to_json() for n in self.nearest],
            "last_boot": dict(self.last_boot) if self.last_boot is not None else None,
            "why": list(self.why),
            "warnings": list(self.warnings),
            "seed": self.seed.to_json() if self.seed is not None else None,
        }

    def lines(self) -> list[str]:
        out = [f"key        {self.key} ({'on the volume' if self.exists else 'not on the volume'})"]
        if self.next_boot:
            out.append(f"next boot  {self.next_boot}: {self.reason}")
        elif self.reason:
            out.append(f"           {self.reason}")
        for source in self.seed.sources[:1] if self.seed is not None else ():
            out.append(f"seed from  {source.key} ({source.tier} store): {', '.join(self.seed.layers)}")
            out.append(f"           differs: {describe_differences(labelled(source.differs)) or 'nothing recorded'}")
        for n in self.nearest:
            out.append(f"nearest    {n.key} (last boot {n.last_verdict or '?'})")
            out.append(f"           differs: {describe_differences(n.differs) or 'nothing recorded'}")
        if self.last_boot is not None:
            lb = self.last_boot
            ready = f", ready in {lb['ready_s']:.1f} s" if lb.get("ready_s") is not None else ""
            out.append(
                f"last boot  {lb.get('started_at', '?')}: {lb.get('verdict') or 'failed'} "
                f"(expected {lb.get('expected') or '?'}){ready}"
            )
        for line in self.why:
            out.append(f"why        {line}")
        for w in self.warnings:
            out.append(f"warning    {w}")
        return out


def nearest_keys(factors: Mapping[str, Any], keys: tuple[KeyInfo, ...], limit: int = NEAREST) -> list[Nearest]:
    """Keys with the fewest differing factors (ties: the most recently used first)."""
    scored = [(k, factor_differences(k.factors, factors)) for k in keys if k.factors]
    scored.sort(key=lambda s: (s[0].last_success or "", s[0].last_used or ""), reverse=True)
    scored.sort(key=lambda s: len(s[1]))  # stable: among equals, the most recently used first
    return [Nearest(k.name, differs, k.last_verdict) for k, differs in scored[:limit]]


def _next_boot(key: KeyInfo, mode: str) -> tuple[str, str]:
    if mode == "staged":
        if key.generations:
            return "warm expected", (
                f"the key has {key.generations} published generation(s) to restore "
                f"({key.boots} earlier boot(s), last {key.last_verdict or '?'})"
            )
        return "cold", "the key exists but holds no published generation yet (its first boot did not publish)"
    good = sum(key.verdicts.get(v, 0) for v in ("cold", "partial", "warm"))
    if good:
        return "warm expected", f"{good} earlier boot(s) of this key became ready (last {key.last_verdict or '?'})"
    return "cold", "the key exists but no earlier boot of it became ready"


def labelled(differs: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    """Dotted factor names (store/siblings.py) in the words a user set them with."""
    return {factor_label(name): pair for name, pair in differs.items()}


def volume_seed(key_name: str, factors: Mapping[str, Any], scan: VolumeScan) -> SeedPlan:
    """The siblings on the volume a boot would seed from (the boot's plan adds the S3 store's)."""
    siblings = [Sibling(k.name, k.factors, "volume", k.generations, k.last_used or "") for k in scan.keys if k.factors]
    return choose_seeds(key_name, factors, siblings)


def _seeded(seed: SeedPlan | None, reason: str) -> tuple[str, str]:
    """`partial expected` and why, when a sibling will seed the boot; else cold, as `reason` says."""
    if seed is None or not seed.sources:
        return "cold", reason
    source = seed.sources[0]
    differs = describe_differences(labelled(source.differs)) or "nothing recorded"
    return "partial expected", (
        f"no generation of its own: {', '.join(seed.layers)} will be seeded from {source.key} "
        f"({source.tier} store; it differs in: {differs}); vLLM's own compile cache starts empty"
    )


def explain_current(
    key_name: str,
    factors: Mapping[str, Any],
    mode: str,
    scan: VolumeScan,
    seed: SeedPlan | None = None,
    *,
    seeding: bool = True,
    image: BundleStore | None = None,
) -> Explanation:
    """The current configuration's key against what the volume holds. `seed`: the boot's plan of
    siblings to seed from (staged mode); without it, the volume's siblings are looked at here.
    `seeding` False (WARMSTART_SEED_SIBLINGS=off, direct mode): nothing will be seeded. `image`: the
    image's generation of this key (store/image.py), which the boot restores first."""
    if image is not None:
        reason = (
            f"the image holds a generation of this key ({image.location}): restored first, before the volume and S3"
        )
        exists = scan.key(key_name) is not None
        return Explanation(key_name, exists, "warm expected", reason, warnings=scan.warnings, factors=factors)
    if mode != "staged" or not seeding:
        seed = None
    elif seed is None:
        seed = volume_seed(key_name, factors, scan)
    found = scan.key(key_name)
    if found is not None:
        verdict, reason = _next_boot(found, mode)
        if verdict == "cold" and mode == "staged":
            verdict, reason = _seeded(seed, reason)
        shown = seed if verdict == "partial expected" else None
        return Explanation(key_name, True, verdict, reason, warnings=scan.warnings, factors=factors, seed=shown)
    nearest = nearest_keys(factors, scan.keys)
    if nearest:
        reason = f"no key on the volume matches; the nearest differs in: {describe_differences(nearest[0].differs)}"
    else:
        reason = "the volume holds no key yet: the first boot compiles everything"
    verdict, reason = _seeded(seed, reason)
    shown = seed if verdict == "partial expected" else None
    return Explanation(
        key_name, False, verdict, reason, tuple(nearest), warnings=scan.warnings, factors=factors, seed=shown
    )


_FACTOR_LINE = re.compile(r"^recorded factor differs from the last good boot \(([^)]*)\): ([^:]+): (.*) -> (.*)$")
_VLLM_HASH_LINE = re.compile(r"^vLLM hash factor differs \(([^)]*)\): ([^:]+): (.*) -> (.*)$")


def _literal(text: str) -> Any:
    try:
        return json.loads(text.replace("'", '"'))
    except ValueError:
        return text.strip("'")


def readable_miss_reason(lines: tuple[str, ...] | list[str]) -> list[str]:
    """boot.py's miss_reason lines, worded for a person: 'MAX_NUM_SEQS changed 4 -> 8 since <when>'."""
    out = []
    for line in lines:
        m = _FACTOR_LINE.match(line)
        if m:
            when, name, old, new = m.groups()
            label = factor_label(name.removeprefix("observed.").removeprefix("key_factors."))
            if name.startswith("vllm_env."):
                label = name.removeprefix("vllm_env.")
            elif name == "engine_argv":
                label = "vLLM command line"
            elif name == "engine_python":
                label = "vLLM interpreter"
            elif name == "home":
                label = "HOME"
            out.append(f"{label} changed since the last good boot ({when}): {_literal(old)} -> {_literal(new)}")
            continue
        m = _VLLM_HASH_LINE.match(line)
        if m:
            hashes, name, old, new = m.groups()
            out.append(f"vLLM's own compile hash changed ({hashes}) because {name}: {old} -> {new}")
            continue
        out.append(line)
    return out


def explain_boot(key: KeyInfo, boot: Mapping[str, Any]) -> Explanation:
    """Why this boot of `key` was what it was."""
    summary = {k: boot.get(k) for k in ("started_at", "verdict", "expected", "ready_s", "error", "boot_id")}
    why: list[str] = []
    verdict, expected = boot.get("verdict"), boot.get("expected")
    caches = boot.get("caches") if isinstance(boot.get("caches"), dict) else {}
    missed = [
        f"{name} {layer.get('status')}: {layer.get('detail', '')}"
        for name, layer in caches.items()
        if isinstance(layer, dict) and layer.get("status") in ("miss", "load_failed")
    ]
    if boot.get("error"):
        why.append(f"the boot failed: {boot['error']}")
    elif verdict == "warm":
        why.append("nothing missed: every cache layer was reused")
    elif expected == "miss":
        staged = boot.get("staged") or {}
        if staged.get("restore_problems"):
            why.append("no intact generation could be restored: " + "; ".join(staged["restore_problems"]))
        else:
            why.append("this key had nothing to reuse yet (its first boot, or its first since the caches were removed)")
    else:
        why += readable_miss_reason(list(boot.get("miss_reason") or []))
    why += [f"missed layer: {m}" for m in missed]
    if not why:
        why.append("the report records no reason (an older report, or a layer status without detail)")
    reason = f"{verdict or 'failed'} boot, expected {expected or '?'}"
    return Explanation(key.name, True, None, reason, last_boot=summary, why=tuple(why))


def last_boot(scan: VolumeScan, key_name: str | None) -> tuple[KeyInfo, Mapping[str, Any]] | None:
    """The named key's last boot, or (None) the newest boot on the whole volume that reached ready
    (a failed boot is not the volume's "last" use; with no good boot at all, the newest boot)."""
    best: tuple[tuple[bool, str], KeyInfo, Mapping[str, Any]] | None = None
    for key in scan.keys:
        if key_name is not None and key.name != key_name:
            continue
        if not key.history:
            continue
        boot = key.history[-1]
        if key_name is None:
            boot = next((b for b in reversed(key.history) if _reached_ready(b)), boot)
        stamp = (key_name is None and _reached_ready(boot), str(boot.get("started_at") or ""))
        if best is None or stamp > best[0]:
            best = (stamp, key, boot)
    return (best[1], best[2]) if best else None


def _reached_ready(boot: Mapping[str, Any]) -> bool:
    return boot.get("ready_s") is not None and not boot.get("error")
