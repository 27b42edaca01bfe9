"""vLLM's command line as the values vLLM's parser sets: the cache key's view of the flags.

The key must not split on spellings vLLM reads alike: `MAX_NUM_SEQS=4`, `--max-num-seqs 4`
and `--max-num-seqs=4` all set `max_num_seqs = 4`; `--max-model-len 0512` is 512;
`ENFORCE_EAGER=true|True|1` all become `--enforce-eager`, which sets `enforce_eager = True`;
`-tp 2` is `--tensor-parallel-size 2`; two JSON texts of one object are one value. So the key
holds `{dest: value}`, the argparse attributes the argv sets, with each value converted the
way its flag's type converts it. Which dest and type a flag has comes from vLLM's own parser
(flagtypes.json, generated in vLLM's interpreter); a flag that table does not know (a newer
vLLM's) keeps its words as written, every occurrence: a needless cold boot is cheaper than a
wrong hit. Conversions only where they are exact: an int is converted only when it is
decimal digits, a float only when Python's float() reads it as the parser's float() does,
a JSON value only when it parses; anything else stays text.

Pure functions; nothing here imports warmstart outside vllm/.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from .argv import parse_argv
from .flagtypes import FLAGS

_DECIMAL = re.compile(r"^[+-]?\d+$")


def convert(kind: str, text: str) -> Any:
    """One value as vLLM's parser converts it, where that is exact; else the text as written."""
    if kind == "int" and _DECIMAL.match(text):
        return int(text)
    if kind == "float":
        try:
            number = float(text)
        except ValueError:
            return text
        return number if math.isfinite(number) else text
    if kind == "json":
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def dest_of(flag: str) -> str:
    """The attribute a flag sets (`-tp` and `--tensor-parallel-size`: tensor_parallel_size); an unknown flag: itself."""
    row = FLAGS.get(flag)
    return row[0] if row else flag


def parsed_values(args: Iterable[str], dropped: Iterable[str] = ()) -> dict[str, Any]:
    """{dest: value} for the flags an argv gives, as vLLM's parser sets them; `dropped` flags left out
    (with every other spelling of the same dest). Unknown flags: {flag: [[words...], ...]}.
    Bare words (no flag takes them) are kept under "" as written."""
    out: dict[str, Any] = {}
    skip = {dest_of(f) for f in dropped}
    for o in parse_argv(args):
        if o.flag is None:
            out.setdefault("", []).append(o.values[0])
            continue
        row = FLAGS.get(o.flag)
        if row is None:
            if o.flag not in skip:
                out.setdefault(o.flag, []).append(list(o.values))
            continue
        dest, kind, nargs, append = row
        if dest in skip:
            continue
        if kind in ("true", "false") and not o.inline:
            value: Any = kind == "true"
        elif nargs == "many":
            value = [convert(kind, v) for v in o.values]
        else:
            value = convert(kind, o.values[0]) if o.values else None
        if append:
            out.setdefault(dest, []).append(value)
        else:
            out[dest] = value  # argparse keeps the last
    return dict(sorted(out.items()))
