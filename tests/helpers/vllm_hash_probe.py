"""Runs inside vLLM's own interpreter: vLLM's compile-cache hash for many command lines at once.

Input (stdin, JSON): {"cases": [{"name": str, "argv": [str, ...], "env": {str: str}}]}. Each
`argv` is what follows the module in the command warmstart starts (`--model PATH --max-model-len
...`). For each case the probe parses it with vLLM's own server parser (`make_arg_parser`, the one
`vllm serve` and the deprecated api_server module use), builds the engine config the way the
server does (`AsyncEngineArgs.from_cli_args(args).create_engine_config(...)`) without starting an
engine, and reports the two hashes that name vLLM's compile caches:

- `config_hash`: `VllmConfig.compute_hash()` (vllm/config/vllm.py, same name in 0.32 and 0.33);
- `env_hash`: `hash_factors(envs.compile_factors())` (vllm/envs.py + vllm/config/utils.py).

Both enter `torch_compile_cache/<hash>` (compilation/backends.py `factors = [env_hash, config_hash,
code_hash, compiler_hash]`) and the AOT directory (compilation/caching.py
`aot_compile_hash_factors`). A case that vLLM refuses reports its error instead.

A case may also carry "link": [PATH, TARGET]: PATH is (re)pointed at TARGET before the case is
built, as warmstart's boot does with the stable model path.

With "profile" (and "captureprobe": the directory of tools/warmstart_dev/captureprobe.py) the configs are
built on vLLM's own CUDA platform for that GPU profile, stood in for exactly as `bench capture` does
(captureprobe.set_platform): run with a release's wheel sources first on PYTHONPATH, this is that release's
CUDA config code and hash on a machine without a GPU. Its "stage" "inspect" (vLLM's CPU platform, once per
VLLM_CACHE_ROOT) leaves vLLM's model inspection in the cache for the "profile" stage.

Output: JSON written to the path given as the only argument (vLLM logs to stdout):
{"vllm": version, "cases": {name: {"config_hash", "env_hash", "max_num_seqs", "error"}}, "env_names": [...],
"env_ignored": [...]}; env_ignored is the ignore list read from `envs.compile_factors`'s source.

This file imports nothing from warmstart: it runs where only vLLM is installed.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys


def _ignored_env(envs: object) -> list[str]:
    """`ignored_factors` in envs.compile_factors, read from its source (a local set literal)."""
    tree = ast.parse(inspect.getsource(envs.compile_factors))  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "ignored_factors" and isinstance(node.value, ast.Set):
                return sorted(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    raise RuntimeError("ignored_factors not found in envs.compile_factors")


def _platform(request: dict) -> str | None:
    """The CUDA profile's stage, where the request names one (see the module doc); None: the installed platform."""
    if not request.get("profile"):
        return None
    sys.path.insert(0, request["captureprobe"])
    from captureprobe import set_platform  # type: ignore[import-not-found]

    stage = request.get("stage", "profile")
    set_platform(stage, request["profile"])
    return stage


def main() -> None:
    request = json.load(sys.stdin)
    stage = _platform(request)
    from vllm.config.utils import hash_factors
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm
    from vllm import envs

    try:  # 0.33: vllm/entrypoints/common/cli_args.py
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.32: vllm/entrypoints/launchers/cli_args.py
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    parser = make_arg_parser(FlexibleArgumentParser())
    results: dict[str, dict[str, str | None]] = {}
    if stage == "inspect":  # vLLM's model inspection only, left in VLLM_CACHE_ROOT/modelinfos
        args = parser.parse_args(request["cases"][0]["argv"])
        args.model = getattr(args, "model_tag", None) or args.model
        AsyncEngineArgs.from_cli_args(args).create_model_config()
        request["cases"] = []
    for case in request["cases"]:
        saved = {k: os.environ.get(k) for k in case.get("env", {})}
        os.environ.update(case.get("env", {}))
        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()
        try:
            if "link" in case:
                path, target = case["link"]
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.symlink(target, path + ".tmp")
                os.replace(path + ".tmp", path)
            args = parser.parse_args(case["argv"])
            if getattr(args, "model_tag", None):  # `vllm serve MODEL` puts the model first
                args.model = args.model_tag
            config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
                usage_context=UsageContext.OPENAI_API_SERVER
            )
            results[case["name"]] = {
                "config_hash": config.compute_hash(),
                "env_hash": hash_factors(envs.compile_factors()),
                "max_num_seqs": config.scheduler_config.max_num_seqs,  # what the argv set, or vLLM's default
                "error": None,
            }
        except (Exception, SystemExit) as exc:  # vLLM refuses the case: say why
            results[case["name"]] = {"config_hash": None, "env_hash": None, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    with open(sys.argv[1], "w") as out:
        json.dump(
            {
                "vllm": vllm.__version__,
                "cases": results,
                "env_names": sorted(envs.environment_variables),
                "env_ignored": _ignored_env(envs),
            },
            out,
        )


if __name__ == "__main__":
    main()
