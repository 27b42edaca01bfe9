"""The configuration reference's tables, rendered from the variable table (variables.py).

docs/configuration.md holds warmstart's own variables and the curated engine flags; docs/compatibility.md
the worker-vllm compatibility table: every `vllm serve` option as its variable (the same rows that
settings.from_env parses, derived from vLLM's parser table), the variables that are ignored because vLLM
removed their flag, and what each enters in the key. Each table sits between `<!-- generated: NAME -->`
and `<!-- end: NAME -->`; `python -m warmstart.settings FILE` rewrites a file's blocks, and a test fails
when a file and the table disagree.
"""

from __future__ import annotations

import re

from .variables import CURATED_FLAGS, ENGINE_FLAGS, REMOVED_FLAGS, WRAPPER, Variable


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def shown_default(var: Variable) -> str:
    """The reference's default column: `shown`, else the default as code, else empty."""
    if var.shown is not None:
        return var.shown
    return f"`{var.default}`" if var.default else ""


def off_flag(var: Variable) -> str | None:
    """The flag a boolean variable's `false` gives: None for a store-true flag (nothing is given)."""
    if var.kind != "pair_bool":
        return None
    return var.off_flag or f"--no-{str(var.flag)[2:]}"


def _flag_cell(var: Variable) -> str:
    off = off_flag(var)
    return f"`{var.flag} / {off}`" if off else f"`{var.flag}`"


_GIVES = {
    "bool": "`true`: the flag; `false`: nothing",
    "pair_bool": "`true` / `false`: either side",
    "argv": "the flag and the words of the value",
}


def compatibility_tables() -> dict[str, str]:
    """docs/compatibility.md's blocks: every engine-flag variable, and the removed ones."""
    flags = ["| variable | vLLM flag | value | key |", "|---|---|---|---|"]
    for v in sorted(ENGINE_FLAGS, key=lambda v: v.env):
        gives = _GIVES.get(v.kind, f"the flag and the value ({v.kind})")
        flags.append(f"| `{v.env}` | {_flag_cell(v)} | {gives} | {'yes' if v.in_key else ''} |")
    removed = ["| variable | ignored, with a warning: what to use instead |", "|---|---|"]
    removed += [f"| `{name}` | {_cell(note)} |" for name, note in sorted(REMOVED_FLAGS.items())]
    return {"vllm-flags": "\n".join(flags), "removed-flags": "\n".join(removed)}


def reference_tables() -> dict[str, str]:
    """Every generated block, by block name: docs/configuration.md's and docs/compatibility.md's."""
    wrapper = ["| variable | default | meaning |", "|---|---|---|"]
    wrapper += [f"| `{v.env}` | {shown_default(v)} | {_cell(v.doc)} |" for v in WRAPPER]
    engine = ["| variable | vLLM flag | key | meaning |", "|---|---|---|---|"]
    engine += [f"| `{v.env}` | {_flag_cell(v)} | {'yes' if v.in_key else ''} | {_cell(v.doc)} |" for v in CURATED_FLAGS]
    return {"wrapper": "\n".join(wrapper), "engine": "\n".join(engine), **compatibility_tables()}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end: {name} -->)", re.S)


def render_reference(text: str) -> str:
    """`text` (a docs file) with every generated block it holds replaced by the table's rendering."""
    found = False
    for name, table in reference_tables().items():
        pattern = _block(name)
        if pattern.search(text):
            found = True
            text = pattern.sub(lambda m, t=table: m.group(1) + t + "\n" + m.group(2), text)
    if not found:
        raise ValueError("no generated block (<!-- generated: NAME --> ... <!-- end: NAME -->)")
    return text
