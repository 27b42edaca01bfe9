"""Writes src/warmstart/vllm/flagtypes.json from vLLM's own `vllm serve` parser. Runs in vLLM's interpreter.

    .vllm-venv/bin/python tools/warmstart_dev/flagtable.py src/warmstart/vllm/flagtypes.json

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
  `--x` / `--no-x`);
- `str`: anything else (choices included): compared as written.

tests/vllm/test_flagtypes.py runs this again in the installed vLLM and compares.
This file imports nothing from warmstart.
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


def table() -> tuple[str, dict[str, tuple[str, str, str, bool]]]:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm

    try:  # 0.33: vllm/entrypoints/common/cli_args.py
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.32: vllm/entrypoints/launchers/cli_args.py
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    parser = make_arg_parser(FlexibleArgumentParser())
    rows: dict[str, tuple[str, str, str, bool]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        append = isinstance(action, argparse._AppendAction)
        for option in action.option_strings:
            kind = _kind(action)
            if kind == "bool":
                kind = "false" if option.startswith("--no-") else "true"
            rows[option] = (action.dest, kind, _nargs(action), append)
    return vllm.__version__, dict(sorted(rows.items()))


def render(version: str, rows: dict[str, tuple[str, str, str, bool]]) -> str:
    """The JSON document, one row a line (json.dumps of each part: valid JSON, stable diffs)."""
    about = (
        "vLLM's `vllm serve` options: the dest each sets, its kind, its word count. Generated: do not edit. "
        f"Written by tools/warmstart_dev/flagtable.py in vLLM's own interpreter from its parser (`make_arg_parser`, "
        f"vLLM {version}); tests/vllm/test_flagtypes.py regenerates it and compares. Each row: option -> "
        "[dest, kind, nargs, append]. kind: int, float, json, true, false or str; nargs: none, one or many; "
        "append: repeated occurrences add up instead of the last winning."
    )
    lines = [
        "{",
        f'  "about": {json.dumps(about)},',
        f'  "vllm_version": {json.dumps(version)},',
        '  "columns": ["dest", "kind", "nargs", "append"],',
        '  "flags": {',
    ]
    body = [f"    {json.dumps(option)}: {json.dumps(list(row))}" for option, row in rows.items()]
    lines += [",\n".join(body), "  }", "}", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    version, rows = table()
    text = render(version, rows)
    if len(argv) > 1 and argv[1] != "-":
        with open(argv[1], "w") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
