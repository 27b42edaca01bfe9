"""`warmstart-dev bench s3-weights`: a sized model read from a distant S3 store, three ways, alternated.

The model is `bench weights`'s (testmodel.write_test_model at `--size`, 1-4 GiB), put on a local
S3 server (s3rver by default, as `bench s3`; moto with `--server moto`) by `warmstart fetch --to`'s
own code (s3upload.upload_snapshot), untimed. Reads go through `dev.throttle`: `latency_ms` per
request, `mbps` per stream (what one GET stream gets from a distant endpoint) and `total_mbps` for
all streams together (the worker's link): the floor is `bytes / total_mbps`.

    single_s    one GET stream per file, one file after another: what a Hub-style download does
    staged_s    warmstart's read (s3model.plan_s3 + S3Read.run: one listing, parallel ranged GETs
                pinned by ETag, checked, to local disk): the default for MODEL_NAME=s3://
    streamer_s  Run:ai's streamer (runai-model-streamer, as vLLM's `--load-format runai_streamer`
                calls it: SafetensorsStreamer.stream_files, every tensor to CPU memory), run by
                vLLM's interpreter; skipped where that environment lacks it

Each repeat runs the sides in another order (load drifts). Goals (issue 40): the faster of staged
and streamer at least 5x faster than single, and within 1.3x of the floor.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from warmstart.s3model import MANIFEST, plan_s3, streamer_env
from warmstart.s3upload import upload_snapshot
from warmstart.s3url import parse_s3_url
from warmstart.store.s3client import make_client

from .s3server import moto_server, s3rver_server
from .testmodel import parse_size, write_test_model
from .throttle import throttled
from .volumebench import spread

BUCKET = "warmstart-bench"
REGION = "us-east-1"
MODEL = "warmstart/bench-s3-weights"
READ = 8 * 1024 * 1024

# Run by vLLM's interpreter: stream every safetensors file of the prefix to CPU, as vLLM's runai loader does.
STREAMER = """
import json, sys, time
from runai_model_streamer import SafetensorsStreamer, list_safetensors
t = time.perf_counter()
files = list_safetensors(sys.argv[1])
n = 0
with SafetensorsStreamer() as s:
    s.stream_files(files, device="cpu")
    for _name, tensor in s.get_tensors():
        n += tensor.numel() * tensor.element_size()
print(json.dumps({"seconds": time.perf_counter() - t, "tensor_bytes": n, "files": len(files)}))
"""


def _single(client: Any, prefix: str, dest: Path) -> int:
    """One GET stream per object, one after another."""
    dest.mkdir(parents=True)
    total = 0
    for page in client.get_paginator("list_objects").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/" + MANIFEST):
                continue
            body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"]
            with open(dest / obj["Key"].rsplit("/", 1)[-1], "wb") as handle:
                while chunk := body.read(READ):
                    handle.write(chunk)
                    total += len(chunk)
    return total


def _streamer(python: str, url: str, endpoint: str) -> dict[str, Any]:
    env = {**os.environ, **streamer_env(endpoint, REGION)}
    done = subprocess.run([python, "-c", STREAMER, url], env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the streamer failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def has_streamer(python: str | None) -> bool:
    if not python or not Path(python).exists():
        return False
    probe = subprocess.run([python, "-c", "import runai_model_streamer_s3"], capture_output=True)
    return probe.returncode == 0


def bench_s3_weights(
    workdir: Path,
    *,
    size: str = "1GiB",
    latency_ms: float = 20.0,
    mbps: float = 25.0,
    total_mbps: float = 200.0,
    server: str = "s3rver",
    repeats: int = 3,
    vllm_python: str | None = None,
) -> dict[str, Any]:
    os.environ["AWS_ACCESS_KEY_ID"] = "S3RVER"  # s3rver's built-in account (moto takes anything)
    os.environ["AWS_SECRET_ACCESS_KEY"] = "S3RVER"
    shutil.rmtree(workdir, ignore_errors=True)
    models = Path(os.environ.get("WARMSTART_BENCH_MODELS", ".bench/models")).resolve()
    sized = None if size == "tiny" else parse_size(size)  # "tiny": testmodel's tiny Llama (--quick)
    model = write_test_model(models / "hub", MODEL if sized else MODEL + "-tiny", size_bytes=sized)
    streamer = has_streamer(vllm_python)
    url = parse_s3_url(f"s3://{BUCKET}/models/bench")
    result: dict[str, Any] = {
        "benchmark": "s3-weights",
        "store": {
            "kind": f"{server} behind dev.throttle (asyncio TCP proxy)",
            "latency_ms_per_request": latency_ms,
            "bandwidth_mbps_per_stream": mbps,
            "bandwidth_mbps_total": total_mbps,
        },
        "repeats": repeats,
    }
    serving = s3rver_server(workdir / "s3rver") if server == "s3rver" else moto_server()
    with serving as near:
        client = make_client(near, REGION)
        client.create_bucket(Bucket=BUCKET)
        uploaded = upload_snapshot(client, url, model.snapshot, {"repo_id": MODEL, "revision": model.commit})
        total = uploaded.bytes
        result["model"] = {"size": size, "files": uploaded.files, "bytes": total}
        sides = ["single", "staged", *(["streamer"] if streamer else [])]
        runs: dict[str, list[float]] = {k: [] for k in sides}
        failures: list[str] = []
        with throttled(near, latency_ms=latency_ms, mbps=mbps, total_mbps=total_mbps) as far_url:
            far = make_client(far_url, REGION)
            for i in range(repeats):
                for side in sides[i % len(sides) :] + sides[: i % len(sides)]:
                    local = workdir / f"{side}-{i}"
                    t = time.perf_counter()
                    took = None
                    if side == "single":
                        assert _single(far, url.prefix, local) == total
                    elif side == "staged":
                        planned, read = plan_s3(url.url, local, endpoint_url=far_url, region=REGION, client=far)
                        assert read.run().bytes == total == planned.bytes
                    else:
                        try:
                            got = _streamer(vllm_python or "", url.url, far_url)
                        except RuntimeError as exc:  # recorded, and the other sides go on
                            failures.append(str(exc).strip().splitlines()[-1][:300])
                            continue
                        assert got["files"] >= 1, got
                        took = got["seconds"]  # from its listing on: torch's import is vLLM's, not the read's
                    runs[side].append(took if took is not None else time.perf_counter() - t)
                    shutil.rmtree(local, ignore_errors=True)  # keep the disk for the next side
    if failures:  # Run:ai's streamer failed: its errors, and it is left out of the comparison
        sides.remove("streamer")
        result["streamer_failures"] = failures
    for side in sides:
        result[f"{side}_s"] = spread(runs[side])
    if not streamer:
        result["streamer_s"] = {"skipped": f"no runai-model-streamer-s3 in {vllm_python or 'vLLM environment'}"}
    floor = total / (total_mbps * 1e6)
    result["floor_s"] = round(floor, 3)
    medians = {s: result[f"{s}_s"]["median"] for s in sides}
    best = min((s for s in sides if s != "single"), key=lambda s: medians[s])
    result["default"] = "staged"
    result["fastest"] = best
    result["ratios"] = {
        **{f"single_over_{s}": round(medians["single"] / medians[s], 2) for s in sides if s != "single"},
        **{f"{s}_over_floor": round(medians[s] / floor, 2) for s in sides},
    }
    result["goals"] = s3_weights_goals(medians["single"], medians[best], floor)
    return result


def s3_weights_goals(single_s: float, best_s: float, floor_s: float) -> dict[str, bool]:
    """Issue 40's goals for the faster way to read: 5x a single stream, within 1.3x of the link's floor."""
    return {"5x_faster_than_single": single_s / best_s >= 5, "within_1.3x_of_floor": best_s / floor_s <= 1.3}
