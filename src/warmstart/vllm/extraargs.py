"""VLLM_EXTRA_ARGS checked against vLLM's own flag table before anything starts.

An unknown flag in VLLM_EXTRA_ARGS used to fail only after ~25 s, with vLLM's 300-line usage
text and a junk key left on the volume; the table (flagtypes.json, read from vLLM's parser)
knows every flag and how its value is read, so the check is one line at settings time.
"""

from __future__ import annotations

import difflib

from .argv import parse_argv
from .flagtypes import FLAGS


def extra_args_problems(extra_args: tuple[str, ...]) -> list[str]:
    """VLLM_EXTRA_ARGS checked against vLLM's own flag table (vllm/flagtypes.json) before anything
    starts: an unknown flag or a value vLLM's parser would refuse is one line here, not vLLM's
    300-line usage text ~25 s later with a junk key left on the volume."""
    problems: list[str] = []
    for occurrence in parse_argv(extra_args):
        name = occurrence.flag
        if name is None or name.startswith(
            "-O"
        ):  # -O<level> / -O.field: vLLM's own shorthand for the compilation config
            continue
        # `-cc.field v` / `--compilation-config.field v`: one field of a JSON flag (vLLM's
        # FlexibleArgumentParser reads the dotted form); the flag before the dot must be a JSON one.
        base, dotted, _ = name.partition(".")
        flag = FLAGS.get(base if dotted else name)
        if flag is None and name.startswith("--") and not dotted:
            # argparse takes a unique prefix of a long option (allow_abbrev; test_concurrency's `--max-num-se`).
            prefixed = [option for option in FLAGS if option.startswith(name)]
            flag = FLAGS[prefixed[0]] if len(prefixed) == 1 else None
        if flag is not None and dotted:
            if flag.kind == "json":
                continue
            flag = None
        if flag is None:
            near = difflib.get_close_matches(name, list(FLAGS), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            problems.append(f"VLLM_EXTRA_ARGS: {occurrence.written} is not a flag of vLLM's serve{hint}")
            continue
        for value in occurrence.values:
            if flag.kind in ("int", "float"):
                try:
                    int(value) if flag.kind == "int" else float(value)
                except ValueError:
                    problems.append(f"VLLM_EXTRA_ARGS: {occurrence.written} {value!r}: vLLM expects {flag.kind}")
    return problems
