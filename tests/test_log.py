"""The progress lines keep the shape users, docs and `warmstart report` read: `warmstart | STAGE    | text`,
the stage padded to 8 characters, written by one helper (log.py)."""

from __future__ import annotations

import ast
import copy
import json
import logging
import pickle
from pathlib import Path

import pytest

from warmstart import log


@pytest.fixture
def records():
    got: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    logger = logging.getLogger("warmstart")
    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # as cli.setup_logging sets it
    yield got
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        ("s3", "warmstart | s3       | x"),
        ("engine", "warmstart | engine   | x"),
        ("why miss", "warmstart | why miss | x"),
        ("settings", "warmstart | settings | x"),
        ("longerstage", "warmstart | longerstage | x"),  # never cut
    ],
)
def test_the_stage_is_padded_as_the_lines_always_were(stage, expected):
    assert log.line(stage, "x") == expected


def test_a_message_is_formatted_with_its_arguments_and_at_its_level(records):
    log.warning("publish", "%s: %d file(s)", "volume", 3)
    log.error("engine", "gone")
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.WARNING, "warmstart | publish  | volume: 3 file(s)"),
        (logging.ERROR, "warmstart | engine   | gone"),
    ]


def test_a_message_without_arguments_is_written_as_is(records):
    log.info("gc", "100% of nothing")  # a literal percent sign is not a format
    assert records[0].getMessage() == "warmstart | gc       | 100% of nothing"


def test_the_record_names_the_caller_not_the_helper(records):
    log.info("key", "k")
    assert records[0].filename == "test_log.py"
    assert records[0].funcName == "test_the_record_names_the_caller_not_the_helper"


def test_no_module_pads_a_stage_by_hand():
    """Every `warmstart | STAGE |` line comes from log.py: no other string in the package starts that way."""
    package = Path(log.__file__).parent
    found = set()  # (an f-string's head is found twice: as its head and as a constant)
    for path in sorted(package.rglob("*.py")):
        if path.name == "log.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.JoinedStr) and node.values:
                node = node.values[0]  # an f-string: its literal head
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("warmstart | "):
                found.add(f"{path.relative_to(package)}:{node.lineno}")
    assert sorted(found) == []


def test_a_stage_warning_is_its_text_and_logs_under_its_stage(records):
    warning = log.StageWarning("volume", "no volume at /v: 100% local")
    assert warning == "no volume at /v: 100% local" and warning.stage == "volume"
    assert json.dumps({"warnings": [warning]}) == '{"warnings": ["no volume at /v: 100% local"]}'  # the report's JSON
    for copied in (copy.deepcopy(warning), pickle.loads(pickle.dumps(warning))):  # dataclasses.asdict deep-copies
        assert (copied, copied.stage, type(copied)) == (warning, "volume", log.StageWarning)
    warning.log()
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.WARNING, "warmstart | volume   | no volume at /v: 100% local")
    ]


def test_the_plans_warnings_carry_the_stage_they_come_from(tmp_path):
    from warmstart.settings import from_env
    from warmstart.store.placement import place_volume

    settings = from_env({"MODEL_NAME": "org/m", "SWAP_SPACE": "4"}, volume=str(tmp_path / "absent"))
    assert [w.stage for w in settings.warnings] == ["settings"]
    assert "SWAP_SPACE" in settings.warnings[0]
    (warning,) = place_volume(settings, mounted=False, not_writable=None).warnings
    assert warning.stage == "volume" and warning.startswith("no volume at")
