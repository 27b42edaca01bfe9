"""Runs inside vLLM's interpreter: vLLM's own `vllm serve` parser reads many command lines, one call.

    python vllm_parser_probe.py cpu < cases.json > parsed.json
    PYTHONPATH=<0.33 wheel sources> python vllm_parser_probe.py '{"name": "NVIDIA H200", ...}' < ...

stdin: a JSON list of argvs (the api_server form, `--model PATH ...`: FlexibleArgumentParser puts a config
file's flags first for it, as for `serve MODEL`). stdout: per argv, {"error": text} where vLLM's parser
refuses it, else what it set: the dests warmstart decides (host, port, model, revision, download_dir), the
secrets (api_key, hf_token) and the repr of every other attribute that holds a mapping or an object (the
JSON-valued flags, whose credentials are searched for by the caller). Imports nothing from warmstart.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

DECIDED = ("host", "port", "model", "revision", "download_dir", "api_key", "hf_token")


def main() -> None:
    platform = sys.argv[1]
    if platform != "cpu":  # a CUDA release's parser on this machine, as tools/warmstart_dev/flagtable.py builds it
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "warmstart_dev"))
        from captureprobe import set_platform

        set_platform("profile", json.loads(platform))
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # 0.33: vllm/entrypoints/common/cli_args.py
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.32: vllm/entrypoints/launchers/cli_args.py
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    import vllm

    out = []
    for argv in json.load(sys.stdin):
        parser = make_arg_parser(FlexibleArgumentParser())
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err:
                ns = parser.parse_args(argv)
        except SystemExit:
            out.append({"error": err.getvalue().strip().splitlines()[-1:]})
            continue
        except Exception as exc:  # vLLM's own refusals (ValueError, AssertionError)
            out.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        seen = vars(ns)
        parsed = {name: seen.get(name) for name in DECIDED}
        parsed["objects"] = {
            k: repr(v)
            for k, v in seen.items()
            if k not in DECIDED and v is not None and not isinstance(v, (str, int, float, bool, list))
        }
        out.append(parsed)
    json.dump({"vllm": vllm.__version__, "parsed": out}, sys.stdout, default=repr)


if __name__ == "__main__":
    main()
