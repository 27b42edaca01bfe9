"""vLLM's `vllm serve` options: the dest each sets, its kind, its word count, read from flagtypes.json.

The table is data, generated in vLLM's own interpreter from its parser by
tools/warmstart_dev/flagtable.py (`make_arg_parser`; tests/vllm/test_flagtypes.py regenerates it
and compares), and shipped beside this module as package data (pyproject's package-data). It
grows with vLLM's parser; as data it neither needs editing by hand nor counts against a module's
line cap. Regenerate it with:

    .vllm-venv/bin/python tools/warmstart_dev/flagtable.py src/warmstart/vllm/flagtypes.json
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Literal, NamedTuple

Kind = Literal["int", "float", "json", "true", "false", "str"]  # what vLLM's parser makes of the value
Nargs = Literal["none", "one", "many"]  # how many words follow the option
TABLE = "flagtypes.json"


class Flag(NamedTuple):
    """One row: the argparse `dest` an option sets, and how vLLM's parser reads its value."""

    dest: str
    kind: Kind
    nargs: Nargs
    append: bool  # repeated occurrences add up instead of the last winning


def load(data: dict[str, Any]) -> tuple[str, dict[str, Flag]]:
    """(vLLM version, option -> Flag) from the table's JSON document."""
    return str(data["vllm_version"]), {option: Flag(*row) for option, row in data["flags"].items()}


VLLM_VERSION, FLAGS = load(json.loads(resources.files("warmstart.vllm").joinpath(TABLE).read_text(encoding="utf-8")))
