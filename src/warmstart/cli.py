"""`warmstart`: one command in front of every stage (`warmstart --help` lists them; docs/commands.md says more).

Human-readable progress goes to stderr; with --json, stdout holds only the JSON document.
Only what a user of the image needs is here: the test model and the benchmarks are
`warmstart-dev` (tools/, never installed into the image).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from . import __version__, log
from .errors import EXIT_CONFIG, SettingsError, WarmstartError
from .imagecmd import add_image_parsers, ls_image_only, print_image
from .imagecmd import size_words as _size
from .redact import Redactor
from .settings import from_env, process_environment
from .verify import add_verify_parser


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("warmstart")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def _settings(args: argparse.Namespace):  # noqa: ANN202 - Settings, imported lazily
    return from_env(args.environ, volume=getattr(args, "volume", None))


def cmd_key(args: argparse.Namespace) -> int:
    from warmstart.key import flatten
    from warmstart.plan import plan_boot

    settings = _settings(args)
    plan = plan_boot(
        settings, no_download_reason="`warmstart key` downloads nothing; run `warmstart fetch`", write=False
    )
    described = plan.describe(Redactor.from_env(settings.environ))
    if args.json:
        print(json.dumps(described, indent=2))
    else:
        print(described["key"])
        print(f"  dir: {described['key_dir']}")
        # The factors the key is the digest of, one per line (docs/commands.md), secrets masked (key.py).
        for name, value in flatten(described["factors"]).items():
            print(f"  factor {name} = {json.dumps(value) if not isinstance(value, str) else value}")
        for name, value in described["env"].items():
            print(f"  {name}={value}")
        # What a boot would warn about (a variable that changes nothing, a removed flag): someone
        # checking the key before a deploy wants them here, not first in the worker's log.
        for warning in described["warnings"]:
            print(f"  warning: {warning}")
    return 0


def cmd_boot(args: argparse.Namespace) -> int:
    from warmstart.boot import exit_on_signals, run_boot
    from warmstart.plan import plan_boot

    exit_on_signals()  # a SIGTERM at any stage still stops vLLM's group and cleans up (run_boot)
    settings = _settings(args)
    plan = plan_boot(settings)
    # vLLM that exits or never becomes ready raises EngineFailed: dispatch writes its line, exit 3.
    boot, report = run_boot(plan, Redactor.from_env(settings.environ))
    boot.stop()
    if args.json:
        print(report.to_json())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report.fromlog import report_from_log

    try:
        with open(args.logfile, encoding="utf-8", errors="replace") as handle:
            report = report_from_log(handle)
    except OSError as exc:
        log.error("report", "cannot read %s: %s", args.logfile, exc.strerror or exc)
        return EXIT_CONFIG
    if args.html:
        from .timeline import render_timeline

        page = render_timeline(
            [report.to_dict()], title=f"Boot from {Path(args.logfile).name}", subtitle=f"vLLM {report.vllm_version}"
        )
        Path(args.html).write_text(page)
        log.info("timeline", "wrote %s", args.html)
    if args.json:
        print(report.to_json())
    else:
        print("\n".join(report.lines()))
    return 0


# --------------------------------------------------------------------------- the volume: ls, explain, gc, ...


def _layout(args: argparse.Namespace):  # noqa: ANN202 - VolumeLayout, imported lazily
    """The volume named by --volume, $RUNPOD_VOLUME_PATH or $BASE_PATH (no other setting needed)."""
    from .settings import volume_root
    from .store.layout import VolumeLayout

    root = volume_root(args.environ, args.volume)
    if not root.is_dir():
        raise SettingsError([f"no volume at {root}: pass --volume DIR or set RUNPOD_VOLUME_PATH"])
    return VolumeLayout(root, on_volume=True)


def _price(args: argparse.Namespace) -> float | None:
    from .store.scan import price_from_env

    if getattr(args, "price_gb_month", None) is not None:
        return float(args.price_gb_month)
    try:
        return price_from_env(args.environ)
    except ValueError as exc:
        raise SettingsError([str(exc)]) from exc


def cmd_ls(args: argparse.Namespace) -> int:
    from .store.scan import scan_volume

    if (image := ls_image_only(args)) is True:
        return 0
    scan = scan_volume(_layout(args))
    data = scan.to_json(_price(args)) | ({"image": image} if image else {})
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"Keys on {scan.layout.root} ({len(scan.keys)}):")
    for k in scan.keys:
        counts = "/".join(str(k.verdicts.get(v, 0)) for v in ("cold", "partial", "warm", "failed"))
        # A boot that never reached ready is "failed", not "0/0/0": its report has an error or no verdict.
        failed_last = bool(k.history) and (k.history[-1].get("error") or k.history[-1].get("verdict") is None)
        last = "failed" if failed_last else (k.last_verdict or "-")
        ready = f"{k.last_ready_s:.1f} s" if k.last_ready_s is not None else "-"
        print(f"  {k.name}")
        print(
            f"      {k.model}@{(k.revision or '?')[:12]}  {k.hardware}  vLLM {k.vllm}  {k.mode or '-'}  "
            f"{_size(k.bytes)} (bundles {_size(k.bytes_by_kind['bundles'])}, cache {_size(k.bytes_by_kind['cache'])})"
        )
        print(
            f"      {k.generations} generation(s)"
            + (f" (distrusted: {', '.join(map(str, k.distrusted))})" if k.distrusted else "")
            + f", {k.boots} boot(s) cold/partial/warm/failed {counts}, "
            f"last {last} ready {ready}, created {k.created or '-'}, last used {k.last_used or '-'}"
            + (f"  IN USE: {'; '.join(k.in_use)}" if k.in_use else "")
        )
    print(f"HF snapshots ({len(scan.models)}):")
    for m in scan.models:
        print(f"  {m.name}@{m.revision[:12]}  {_size(m.bytes)}  keys: {', '.join(m.keys) or 'none'}")
    rate = f"flat ${data['price_gb_month']:.3f}/GB" if data["price"] == "flat" else "Runpod's $0.07/GB (first TB)"
    trash = f", {_size(scan.trash_bytes)} left by an interrupted gc" if scan.trash_bytes else ""
    cost = data["monthly_cost_usd"]
    print(
        f"Total {_size(data['total_bytes'])} (keys {_size(data['keys_bytes'])}, "
        f"HF cache {_size(data['hf_cache_bytes'])}"
        f"{trash}): about ${cost:.{2 if cost >= 0.01 else 4}f} per month at {rate}"
    )
    for w in scan.warnings:
        print(f"warning: {w}")
    print_image(image)  # nothing without an image
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from . import explain
    from .store.scan import scan_volume

    if args.key or args.last:
        scan = scan_volume(_layout(args))
        found = explain.last_boot(scan, None if args.last else args.key)
        if found is None:
            what = "no boot recorded on the volume" if args.last else f"no key {args.key} with a recorded boot"
            log.error("explain", "%s", what)
            return EXIT_CONFIG
        result = explain.explain_boot(*found)
    else:
        from warmstart.plan import plan_boot

        settings = _settings(args)
        plan = plan_boot(
            settings, no_download_reason="`warmstart explain` downloads nothing; run `warmstart fetch`", write=False
        )
        scan = scan_volume(plan.layout)
        on, key, image = settings.seed_siblings == "auto", plan.key, plan.image
        result = explain.explain_current(key.dirname, key.factors, plan.mode, scan, plan.seed, seeding=on, image=image)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print("\n".join(result.lines()))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from .settings import read_one
    from .store.gc import GcOptions, parse_size, plan_or_say

    try:
        max_bytes = parse_size(args.max_bytes) if args.max_bytes else None
    except ValueError as exc:
        raise SettingsError([f"--max-bytes {exc}"]) from exc
    if args.keep_last is not None and args.keep_last < 0:
        raise SettingsError(["--keep-last must be 0 or more"])
    ttl = read_one(args.environ, "WARMSTART_LEASE_TTL_S")
    options = GcOptions(args.older_than, args.keep_last, max_bytes, args.models)
    if (plan := plan_or_say(_layout(args), options, ttl)) is None:
        return 1
    if not args.dry_run and not args.yes:
        if not sys.stdin.isatty():
            log.error("gc", "refusing to delete without --yes (or look first with --dry-run)")
            return EXIT_CONFIG
        names = [k.name for k in plan.remove_keys] + [f"{m.name}@{m.revision[:12]}" for m in plan.remove_models]
        print("Will remove:\n  " + ("\n  ".join(names) or "(no key or snapshot)"), file=sys.stderr)
        if input(f"Free {_size(plan.freed_bytes)}? [y/N] ").strip().lower() not in ("y", "yes"):
            return 1
        # The answer may have taken minutes: a boot may have begun meanwhile. Plan again, and
        # remove only what was confirmed and is still unused (keys and snapshots alike).
        if (plan := plan_or_say(_layout(args), options, ttl, within=plan)) is None:
            return 1
    data = plan.to_json(dry_run=True) if args.dry_run else plan.execute(ttl_s=ttl).to_json(plan)
    errors = data.get("errors", [])
    for error in errors:
        log.error("gc", "%s (the other steps ran)", error)
    if args.json:
        print(json.dumps(data, indent=2))
        return 1 if errors else 0
    verb = "would remove" if args.dry_run else "removed"
    for name in data["removed_keys"]:
        print(f"{verb} key {name}")
    for name in data["removed_models"]:
        print(f"{verb} HF snapshot {name}")
    for g in data["staged_garbage"]:
        print(f"{verb} {len(g['generations'])} old generation(s), {len(g['bundles'])} bundle(s) of {g['key']}")
    for name, why in data["kept_because"].items():
        print(f"kept {name}: {why}")
    print(f"{'would free' if args.dry_run else 'freed'} {_size(data['freed_bytes'])} ({data['freed_bytes']} bytes)")
    return 1 if errors else 0


def cmd_timeline(args: argparse.Namespace) -> int:
    from .store.scan import scan_volume
    from .timeline import render_timeline

    scan = scan_volume(_layout(args))
    if args.key:
        key = scan.key(args.key)
    else:  # the key that last booted to ready (a failed boot is not "last used"), else the last touched
        key = max(scan.keys, key=lambda k: (k.last_success or "", k.last_used or ""), default=None)
    if key is None:
        log.error("timeline", "%s", f"no key {args.key} on the volume" if args.key else "no key on the volume")
        return EXIT_CONFIG
    subtitle = f"{key.model}@{(key.revision or '?')[:12]} on {key.hardware}, vLLM {key.vllm}, {key.mode} mode"
    Path(args.html).write_text(render_timeline(list(key.history), title=key.name, subtitle=subtitle))
    log.info("timeline", "%d boot(s) of %s -> %s", len(key.history), key.name, args.html)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from . import predict
    from .limits import RUNPOD_INIT_TIMEOUT_S
    from .plan import plan_boot

    plan = None
    if not args.evaluate:
        plan = plan_boot(_settings(args), no_download_reason="`warmstart predict` downloads nothing", write=False)
    layout = _layout(args) if plan is None else plan.layout
    samples = predict.volume_samples(layout)
    if args.evaluate:
        data = predict.evaluate(samples)
        keep = ("all", "cold", "warm", "baseline_mean_of_other_keys")
        print(json.dumps(data, indent=2) if args.json else json.dumps({k: data[k] for k in keep}))
        return 0
    assert plan is not None
    if not samples:
        log.error("predict", "no completed boot recorded on %s: nothing to fit", layout.root)
        return EXIT_CONFIG
    x = predict.features_of(plan.key.factors, plan.model.bytes, predict.config_layers(plan.model.path))
    timeout = plan.settings.runpod_init_timeout_s
    data = predict.prediction(
        predict.PhaseModels.fit(samples),
        x,
        init_timeout_s=timeout or RUNPOD_INIT_TIMEOUT_S,
        timeout_from_env=timeout is not None,
    )
    data["key"] = plan.key.dirname
    for w in data["warnings"]:
        log.warning("predict", "%s", w)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print("\n".join(predict.text_lines(data)))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    """Put MODEL_NAME's snapshot into an HF cache (the volume's, or --hub-cache: a model baked into an image)."""
    from warmstart.plan import model_summary

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
        hub_endpoint=settings.hub_endpoint,
    )
    summary = model_summary(model)
    if args.to:  # s3upload.py: the snapshot just pinned, copied into S3-compatible storage
        from .s3upload import upload_model

        summary["uploaded"] = upload_model(model, args.to, settings.s3_endpoint_url, settings.s3_region)
    print(json.dumps(summary))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warmstart", description="vLLM on Runpod Serverless, caches on the volume.")
    # The wrapper's own version; vLLM's is the image's (`warmstart key` prints it, read from vLLM's metadata).
    parser.add_argument("--version", action="version", version=f"warmstart {__version__}")
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
    p.add_argument(
        "--to",
        metavar="S3_URL",
        help="then copy the snapshot to s3://BUCKET/PREFIX as real files with a manifest (for MODEL_NAME=s3://...)",
    )
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser("report", help="boot report from a vLLM log file")
    p.add_argument("logfile")
    p.add_argument("--json", action="store_true")
    p.add_argument("--html", metavar="FILE", help="also draw the boot's phases into a self-contained HTML page")
    p.set_defaults(func=cmd_report)

    p = with_volume(sub.add_parser("ls", help="keys and HF snapshots on the volume, sizes, boots, monthly cost"))
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--price-gb-month",
        type=float,
        metavar="USD",
        help="flat USD per GB and month (default: $WARMSTART_VOLUME_PRICE_GB_MONTH, else Runpod's tiers)",
    )
    p.set_defaults(func=cmd_ls)
    add_image_parsers(sub, with_volume, ls=p)
    add_verify_parser(sub, with_volume)

    p = with_volume(sub.add_parser("explain", help="will the next boot be cold, and why; why a key's last boot missed"))
    p.add_argument("key", nargs="?", help="a key directory name: explain its last boot")
    p.add_argument("--last", action="store_true", help="explain the newest boot on the volume")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explain)

    p = with_volume(sub.add_parser("gc", help="remove old keys (and unused HF snapshots); never one in use"))
    p.add_argument("--older-than", type=float, metavar="DAYS", help="remove keys last used more than DAYS ago")
    p.add_argument("--keep-last", type=int, metavar="N", help="always keep the N most recently used keys")
    p.add_argument("--max-bytes", metavar="SIZE", help="remove the oldest keys until the volume holds at most SIZE")
    p.add_argument("--models", action="store_true", help="also remove HF snapshots that no kept key uses")
    p.add_argument("--dry-run", action="store_true", help="plan and print; change nothing")
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gc)

    p = with_volume(sub.add_parser("timeline", help="a key's boots as phase bars in one HTML file"))
    p.add_argument("key", nargs="?", help="key directory name (default: the key used last)")
    p.add_argument("--html", required=True, metavar="FILE")
    p.set_defaults(func=cmd_timeline)

    p = with_volume(sub.add_parser("predict", help="predict this configuration's cold and warm ready time"))
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--evaluate", action="store_true", help="instead: leave-one-key-out error of the models on the volume's boots"
    )
    p.set_defaults(func=cmd_predict)

    return parser


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args, rest = build_parser().parse_known_args(argv)
    if rest and args.command != "serve":  # serve hands --rp_* options to the Runpod SDK
        build_parser().error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    try:
        code = dispatch(args)
        sys.stdout.flush()  # a pipe closed early shows here, not in the interpreter's exit
    except BrokenPipeError:  # `report LOG | head`: quiet, as any Unix tool (Python's docs, "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE: what a shell shows for a writer whose reader left
    return code


def dispatch(args: argparse.Namespace) -> int:
    """Run `args.func`. An error meant for the user (settings, model, hardware, vLLM) becomes one readable
    `warmstart | STAGE | ...` line, redacted, and its class's exit status (errors.py holds the table);
    any other error keeps its traceback.

    The process's environment is read here, once, for every command (`warmstart` and `warmstart-dev`
    alike): a command reads it from `args.environ`."""
    args.environ = process_environment()
    redactor = Redactor.from_env(args.environ)
    try:
        return int(args.func(args) or 0)
    except WarmstartError as exc:
        if exc.exit_code is None:  # the store's and a job's errors are handled where raised: this is a bug
            raise
        log.error(exc.stage, "%s", exc.user_text(redactor.text))
        return exc.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
