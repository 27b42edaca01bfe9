"""`warmstart verify`: the canary against a running server, compared with a key's record on the volume.

A boot checks its own answer before ready (canaryboot.py); this asks any OpenAI-compatible server
(a vLLM, or a load-balancing worker's front) the same canary later, or from outside, and compares it
with the record of the key's newest trusted generation on the volume, by the same rules
(canary.compare). Exit 0: equal; 1: differs; 2: nothing to compare with, or no answer.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from .canary import CanaryFailed, CanaryRecord, ask, compare


def add_verify_parser(sub: Any, with_volume: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    p = with_volume(sub.add_parser("verify", help="ask a running server the canary; compare with a key's record"))
    p.add_argument("--url", required=True, help="base URL of vLLM or a load-balancing worker (http://HOST:PORT)")
    p.add_argument("--key", help="the key whose record to compare with (default: this configuration's)")
    p.add_argument("--api-key", help="the server's API key, if it asks for one (default: this configuration's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    from .plan import plan_boot
    from .settings import from_env
    from .store.volume import StagedStore

    settings = from_env(args.environ, volume=args.volume)
    plan = plan_boot(settings, no_download_reason="`warmstart verify` downloads nothing", write=False)
    key = args.key or plan.key.dirname
    store = StagedStore(plan.layout.key_dir(key) / "staged")
    generation, _ = store.latest()
    record = CanaryRecord.from_json(generation.canary) if generation is not None else None
    out: dict[str, Any] = {"key": key, "generation": generation.number if generation else None, "url": args.url}
    if record is None:
        out |= {"status": "no_record", "detail": "the key's newest trusted generation holds no canary record"}
        return _done(out, args.json, 2)
    try:
        answer, _ = ask(
            args.url.rstrip("/"),
            settings.served_model_name,
            record.prompts,
            api_key=args.api_key or settings.engine_api_key,
        )
    except CanaryFailed as exc:
        return _done(out | {"status": "failed", "detail": str(exc)}, args.json, 2)
    verdict = compare(record, answer)
    out |= {
        "status": verdict.status,
        "detail": verdict.detail,
        "max_logprob_diff": verdict.max_logprob_diff,
        "latency_s": round(answer.latency_s, 4),
        "recorded_latency_s": record.latency_s,
    }
    return _done(out, args.json, 0 if verdict.status == "equal" else 1)


def _done(out: dict[str, Any], as_json: bool, code: int) -> int:
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['status']}: {out['detail']} (key {out['key']}, generation {out['generation']}, {out['url']})")
    return code
