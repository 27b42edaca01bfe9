"""Hostile input, as hypothesis strategies shared by the fuzz tests of both fronts (the queue
handler, tests/worker/test_fuzz.py; the HTTP front, tests/worker/test_front_fuzz.py), and by the tests
of the variables-to-argv path (hostile configuration, at the end)."""

from __future__ import annotations

import json
import shlex

from hypothesis import strategies as st

from warmstart.worker.routes import ROUTES

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=30,
)
# Field values inside the shaped inputs: smaller, so that a case costs little to generate.
small_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)

# Unicode look-alikes of the characters routes are made of: fullwidth and other slashes,
# Cyrillic and Greek letters that render like Latin ones, dots, and invisible characters.
LOOKALIKES = {
    "/": ["／", "∕", "⁄", "\\", "%2f", "%2F", "%252f", "//", "/./"],
    ".": ["．", "%2e", "%2E", "。"],
    "o": ["о", "ο", "０", "ｏ"],
    "e": ["е", "ε", "ｅ"],
    "c": ["с", "ｃ"],
    "p": ["р", "ρ"],
    "a": ["а", "α"],
    "i": ["і", "ı"],
    "s": ["ѕ"],
    "v": ["ν", "ѵ"],
    "1": ["１", "l", "I"],
}
INSERTS = [
    "/..",
    "/../sleep",
    "/%2e%2e/sleep",
    "/%2E%2E/collective_rpc",
    "/..%2fsleep",
    "?x=1",
    "?",
    "#frag",
    ";param",
    "%00",
    "\x00",
    "\r\n",
    " ",
    "\t",
    "\u200b",
    "\ufeff",
    "/",
    "//",
    "\\..\\sleep",
    "%20",
    "@evil",
]


@st.composite
def mutated_route(draw: st.DrawFn) -> str:
    """An allowlisted route, changed in one to three ways: encoded, dotted, doubled, suffixed,
    case-changed, look-alike characters, prefixed with a scheme or host."""
    route = draw(st.sampled_from(sorted(ROUTES)))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["insert", "lookalike", "case", "prefix", "percent", "strip"]))
        if how == "insert":
            at = draw(st.integers(0, len(route)))
            route = route[:at] + draw(st.sampled_from(INSERTS)) + route[at:]
        elif how == "lookalike":
            spots = [i for i, ch in enumerate(route) if ch in LOOKALIKES]
            if spots:
                i = draw(st.sampled_from(spots))
                route = route[:i] + draw(st.sampled_from(LOOKALIKES[route[i]])) + route[i + 1 :]
        elif how == "case":
            route = draw(st.sampled_from([route.upper(), route.title(), route.swapcase(), route.capitalize()]))
        elif how == "prefix":
            route = draw(st.sampled_from(["http://127.0.0.1:9", "//evil", "http:", "file://", ".", "~"])) + route
        elif how == "percent":
            i = draw(st.integers(0, len(route) - 1))
            route = route[:i] + f"%{ord(route[i]):02x}" + route[i + 1 :]
        else:
            route = route.strip("/") if draw(st.booleans()) else route + "/"
    return route


# Bodies that are JSON in all but one way, or legal and costly: NaN/Infinity (Python's json reads
# them, JSON does not), nesting at and past MAX_DEPTH, and many small containers (each costs a parse).
@st.composite
def hostile_json_bodies(draw: st.DrawFn) -> bytes:
    how = draw(st.sampled_from(["constant", "deep", "wide"]))
    if how == "constant":
        constant = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity"]))
        return draw(st.sampled_from([b'{"a": %s}', b"[1, %s]", b'{"p": {"q": [%s]}}'])) % constant
    if how == "deep":
        depth = draw(st.integers(60, 70))
        return b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    return b'{"prompt": [' + b",".join([b"[[]]"] * draw(st.integers(1, 5000))) + b"]}"


# --------------------------------------------------------------------------- hostile configuration
# Issue 38: variables that smuggle vLLM flags past warmstart's checks, and secrets hidden where vLLM reads
# them. Cases for tests/test_flag_smuggling.py and tests/vllm/test_flag_parser_property.py: each is
# {"env": variables, "config": a YAML config file's mapping or None, "config_how": "VLLM_CONFIG_FILE" or
# "--config"}. Secrets are SECRET_WORDS, put only where vLLM reads a secret (a secret flag, a credential
# field of a JSON flag); anywhere else they are smuggled, and must be refused.

SECRET_WORDS = tuple(f"sentinelHOSTILE{i}q7" for i in range(8))
SECRET_NUMBERS = tuple(str(7319462850 + i) for i in range(4))  # --watermark-config's key is an int
secret_words = st.sampled_from(SECRET_WORDS)


@st.composite
def flag_fragment(draw: st.DrawFn) -> list[str]:
    """A flag and its values as VLLM_EXTRA_ARGS words, of one kind: refused (warmstart sets it), secret,
    JSON with a credential (whole or one dotted field), or plain. Refused ones are rarer, so that many
    cases are accepted and reach vLLM's parser."""
    s = draw(secret_words)
    number = draw(st.sampled_from(SECRET_NUMBERS))
    kv = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"secondary_tiers": [{"secret_key": s}]}}
    kinds = {
        "refused": [
            ("--host", "0.0.0.0"),
            ("--port", "9"),
            ("--revision", "other"),
            ("--model", "/other"),
            ("--download-dir", "/x"),
        ],
        "secret": [("--api-key", s), ("--api-key", s, draw(secret_words)), ("--hf-token", s)],
        "json": [
            ("--model-loader-extra-config", json.dumps({"s3_secret_access_key": s, "num_readers": 2})),
            ("--model-loader-extra-config", json.dumps({"tensorizer_config": {"s3_access_key_id": s}})),
            ("--kv-transfer-config", json.dumps(kv)),
            ("--watermark-config", json.dumps({"key": int(number)})),
            ("--model-loader-extra-config.s3_secret_access_key", s),
            ("--watermark-config.key", number),
        ],
        "plain": [
            ("--max-num-seqs", "4"),
            ("--enforce-eager",),
            ("--seed", "3"),
            ("--served-model-name", "a", "b"),
            ("--allowed-media-domains", "a.example"),
        ],
    }
    kind = draw(st.sampled_from(["refused", "secret", "secret", "json", "json", "plain"]))
    return list(draw(st.sampled_from(kinds[kind])))


@st.composite
def spelt(draw: st.DrawFn, fragment: list[str]) -> list[str]:
    """The fragment's flag as vLLM's parser also takes it: whole, abbreviated (argparse's allow_abbrev),
    with underscores (FlexibleArgumentParser), or with its first value after `=`."""
    flag, *values = fragment
    how = draw(st.sampled_from(["whole", "whole", "abbreviated", "underscores", "equals"]))
    if how == "abbreviated" and flag.startswith("--") and "." not in flag:
        flag = flag[: draw(st.integers(3, len(flag) - 1))] if len(flag) > 3 else flag
    elif how == "underscores":
        flag = "--" + flag[2:].partition(".")[0].replace("-", "_") + "".join(flag[2:].partition(".")[1:])
    elif how == "equals" and values:
        return [f"{flag}={values[0]}", *values[1:]]
    return [flag, *values]


CONFIG_ENTRIES = [
    {"host": "0.0.0.0"},
    {"hos": "0.0.0.0"},
    {"max-num-seqs": 4},
    {"enforce-eager": True},
    {"api-key": ["SECRET", "SECRET"]},
    {"hf-token": "SECRET"},
    {"allowed-media-domains": ["a.example", "--host", "0.0.0.0"]},
    {"api-key": "SECRET"},
    {"api_key": ["SECRET"]},
    {"api-ke": "SECRET"},
    {"model-loader-extra-config": {"tensorizer_config": {"s3_secret_access_key": "SECRET"}}},
]


@st.composite
def hostile_configuration(draw: st.DrawFn) -> dict:
    """Variables (and maybe a config file) a hostile or careless user sets: flags in VLLM_EXTRA_ARGS in every
    spelling vLLM takes, flags inside a list variable's value or a single value, JSON variables with
    credentials, a config file by VLLM_CONFIG_FILE or `--config FILE`."""
    env: dict[str, str] = {}
    words = [w for _ in range(draw(st.integers(0, 3))) for w in draw(spelt(draw(flag_fragment())))]
    if draw(st.integers(0, 3)) == 0:
        env["ALLOWED_MEDIA_DOMAINS"] = " ".join(["a.example", *draw(spelt(draw(flag_fragment())))])
    if draw(st.integers(0, 4)) == 0:
        env["TOKENIZER_NAME"] = draw(spelt(draw(flag_fragment())))[0]
    if draw(st.booleans()):
        loader = {"s3_secret_access_key": draw(secret_words), "s3_endpoint": "http://s3.invalid"}
        env["MODEL_LOADER_EXTRA_CONFIG"] = json.dumps(loader)
    if draw(st.integers(0, 3)) == 0:
        env["VLLM_API_KEY"] = draw(secret_words)
    config = None
    if draw(st.booleans()):
        config = {}
        for entry in draw(st.lists(st.sampled_from(CONFIG_ENTRIES), max_size=3)):
            config.update(json.loads(json.dumps(entry).replace("SECRET", draw(secret_words))))
    how = draw(st.sampled_from(["VLLM_CONFIG_FILE", "--config"]))
    if words:
        env["VLLM_EXTRA_ARGS"] = shlex.join(words)
    return {"env": env, "config": config, "config_how": how}
