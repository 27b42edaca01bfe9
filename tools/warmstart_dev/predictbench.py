"""`warmstart-dev bench predict`: how far `warmstart predict` is off on boots it has not seen.

It builds a boot history from real boots (the tiny model on vLLM, several configurations,
each booted cold and then warm on a fresh local disk so the warm one comes from the
volume), then scores the per-phase models by leaving one key out: fit on every other
key's boots, predict each boot of the held-out key, compare with its measured ready time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from warmstart import predict
from warmstart.store.layout import VolumeLayout
from warmstart.store.scan import scan_volume

from .testmodel import write_test_model

BENCH_MODEL = "warmstart/tiny-llama"
# (MAX_MODEL_LEN, MAX_NUM_SEQS): what varies between keys of one model.
CONFIGS = ((256, 4), (512, 4), (256, 2), (1024, 8))


def bench_predict(workdir: Path, configs: tuple[tuple[int, int], ...] = CONFIGS) -> dict[str, Any]:
    if workdir.exists():
        shutil.rmtree(workdir)
    volume = workdir / "volume"
    layout = VolumeLayout(volume, on_volume=True)
    model = write_test_model(layout.hub_cache, BENCH_MODEL)
    warmstart = str(Path(sys.executable).parent / "warmstart")
    boots = []
    for n, (length, seqs) in enumerate(configs):
        for attempt in ("cold", "warm"):
            env = {
                **os.environ,
                "MODEL_NAME": BENCH_MODEL,
                "MAX_MODEL_LEN": str(length),
                "MAX_NUM_SEQS": str(seqs),
                "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                "RUNPOD_VOLUME_PATH": str(volume),
                "WARMSTART_LOCAL_CACHE": str(workdir / f"local-{n}-{attempt}"),
                # Each configuration's own cold boot, not one seeded from the previous configuration.
                "WARMSTART_SEED_SIBLINGS": "off",
            }
            out = subprocess.run([warmstart, "boot", "--json"], env=env, capture_output=True, text=True, check=True)
            report = json.loads(out.stdout)
            boots.append({"config": [length, seqs], "verdict": report["verdict"], "ready_s": report["ready_s"]})
    scan = scan_volume(layout)
    samples = predict.samples_from_history(
        ((k.name, b) for k in scan.keys for b in k.history), lambda _: predict.config_layers(model.snapshot)
    )
    return {
        "benchmark": "predict",
        "history": "real boots of the tiny model (vLLM-cpu), no synthetic lines",
        "model": BENCH_MODEL,
        "boots": boots,
        "evaluation": predict.evaluate(samples),
    }
