"""Keeping tokens and keys out of every log line, manifest and report.

Two layers: values of secret-named variables and flags are masked where they are
known to be secrets (argv, env dumps), and any known secret value that still appears
in free text (a vLLM log line, an exception message) is replaced before it is written,
in every spelling it is printed in: as is, percent-encoded (a URL's userinfo), JSON-escaped,
base64 (alone, or inside a Basic auth header's `user:secret`). A URL's password is masked
whether or not its value is known. A short value (an API key of a few characters) is masked
where it stands as a word of its own. Which names and flags are secret, how vLLM reads them and
how a secret is spelt is secrets.py's to say.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

from .secrets import (
    MASK,
    MIN_MASKED_ANYWHERE,
    URL_PASSWORD,
    base64_cores,
    base64_forms,
    base64_runs,
    decodes_to_secret,
    dotted_secret,
    encoded_forms,
    looks_secret,
    secret_env_values,
    secret_json_values,
    secret_values_in,
)
from .secrets import without_secret_fields as _without_secret_fields
from .vllm.argv import parse_argv, values_of
from .vllm.configfile import ConfigFileError, config_file_args


def secret_flag_values(args: Iterable[str]) -> list[str]:
    """The secret values in an argv: every value of a secret flag (`--api-key k1 k2`, `--hf-token=S`)
    and the secret fields of a JSON-valued flag (`--watermark-config '{"key": ...}'`)."""
    return secret_values_in((o.flag, o.values) for o in parse_argv(args))


def _config_args(env: Mapping[str, str], extra: list[str]) -> tuple[str, ...]:
    """The flags of the config file vLLM will read (VLLM_CONFIG_FILE, else `--config FILE` in
    VLLM_EXTRA_ARGS); none where it cannot be read (settings says why, in one line)."""
    named = (env.get("VLLM_CONFIG_FILE") or "").strip() or next(iter(values_of(extra, ("--config",))), "")
    if not named:
        return ()
    try:
        return config_file_args(Path(named))
    except ConfigFileError:
        return ()


_URL_SAFE = bytes.maketrans(b"-_", b"+/")  # how a URL-safe base64 decode reads a run


class Redactor:
    """Replace known secret values in text; mask secret-named entries in argv and env."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))
        long = [s for s in self.secrets if len(s) >= MIN_MASKED_ANYWHERE]
        self._long = tuple(long)
        forms = {s: encoded_forms(s) for s in self.secrets}
        # Every spelling of a long secret, longest first (a form may contain a shorter one).
        self._anywhere = tuple(sorted({f for s in long for f in forms[s]}, key=len, reverse=True))
        # A short one only as a word of its own: inside a word or a number it would mask half the log.
        short = sorted({f for s in self.secrets if len(s) < MIN_MASKED_ANYWHERE for f in forms[s]}, key=len)
        self._words = (
            re.compile(r"(?<![\w-])(?:" + "|".join(map(re.escape, reversed(short))) + r")(?![\w-])") if short else None
        )
        self._base64_run = base64_runs(min((len(s) for s in long), default=0))
        self._base64_cores = tuple(sorted({c.encode() for s in long for c in base64_cores(s)}, key=len, reverse=True))
        # The spellings that are not base64: a text that holds no core holds no base64 spelling either (each
        # holds its secret's offset-0 core, read as a URL-safe decode reads it), so only these are searched then.
        b64 = {f for s in long for f in base64_forms(s)}
        self._plain = tuple(f for f in self._anywhere if f not in b64)
        self._spaced = tuple(f for s in self.secrets for f in forms[s] if " " in f)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Redactor:
        """Every secret the environment gives vLLM or warmstart: values of secret-named variables, of
        secret flags inside VLLM_EXTRA_ARGS (`--api-key S`: vLLM prints its non-default args, S included,
        in its first log line), and inside the config file (VLLM_CONFIG_FILE, or `--config FILE` there),
        and the credential fields of any variable whose value is a JSON object
        (MODEL_LOADER_EXTRA_CONFIG's `s3_secret_access_key`: vLLM prints that config whole)."""
        values = secret_env_values(env)
        try:
            extra = shlex.split(env.get("VLLM_EXTRA_ARGS", ""))
        except ValueError:  # unbalanced quotes: settings reports it; mask every word meanwhile
            extra = env.get("VLLM_EXTRA_ARGS", "").split()
            values += [w for w in extra if not w.startswith("-")]
        for name, value in env.items():
            if value.lstrip().startswith(("{", "[")):  # read as its flag's (WATERMARK_CONFIG: --watermark-config)
                values += secret_json_values("--" + name.lower().replace("_", "-"), value)
        return cls([*values, *secret_flag_values([*_config_args(env, extra), *extra])])

    def text(self, text: str) -> str:
        if "://" in text:  # a URL's password: scanned for only where a URL can be (45 ms per MB otherwise)
            text = URL_PASSWORD.sub(lambda m: m.group(1) + MASK + "@", text)
        encoded = bool(self._long) and self._may_hold_base64(text)
        if encoded:  # first: a run that holds `user:secret` goes whole
            text = self._base64_run.sub(self._masked_run, text)
        for form in self._anywhere if encoded else self._plain:
            if form in text:
                text = text.replace(form, MASK)
        if self._words is not None:
            text = self._words.sub(MASK, text)
        return text

    def head(self, text: str, limit: int) -> str:
        """The start of a long `text` redacted, at most `limit` characters: what the log reader reads of a line
        (issue 37: a 1 MB line cost 3.7 ms to redact whole with two secrets set, the reader waiting). Cut at
        the last space before `limit`, so that a spelling without a space (base64, a URL's password, a
        token) lies whole on one side of the cut, never half in the head; where a spelling with a space
        could cross the cut, or there is no space, the whole text is redacted and cut instead."""
        if len(text) <= limit:
            return self.text(text)[:limit]
        cut = text.rfind(" ", 0, limit)
        if cut > 0 and not any(f in text[max(0, cut - len(f) + 1) : cut + len(f)] for f in self._spaced):
            return self.text(text[:cut])[:limit]
        return self.text(text)[:limit]

    def _may_hold_base64(self, text: str) -> bool:
        """Can a base64 run in `text` decode to one of the long secrets? Only where the text holds one of their
        cores (secrets.base64_cores): decoding every run of a 1 MB line took 0.5-0.7 s, on the thread that
        drains vLLM's pipe (issue 37); this test takes a few milliseconds. Asked of the whole text, then of
        each run in it. On the UTF-8 bytes: the cores are ASCII and so are `-` and `_`, so a core is in the
        bytes exactly where it is in the text, and bytes.translate is a table lookup where str's goes through
        a mapping (a 1 MB config line, two secrets: 3.3 ms as str, 2.6 as bytes)."""
        if not self._base64_cores:
            return False
        data = text.encode("utf-8", "surrogatepass")
        dropped = data.translate(None, b"-_")  # a standard decode skips what is not in its alphabet
        read = data.translate(_URL_SAFE)  # a URL-safe decode reads `-` and `_` as `+` and `/`
        return any(core in dropped or core in read for core in self._base64_cores)

    def _masked_run(self, match: re.Match[str]) -> str:
        run = match.group()
        return MASK if self._may_hold_base64(run) and decodes_to_secret(run, self._long) else run

    def argv(self, args: Iterable[str]) -> list[str]:
        """The argv with every value of a secret-named flag masked (all of them, for `--api-key k1 k2`)."""
        out: list[str] = []
        for o in parse_argv(args):
            if o.flag is not None and looks_secret(o.flag):
                out += [f"{o.written}={MASK}"] if o.inline else [str(o.written), *(MASK for _ in o.values)]
            elif o.flag is not None and dotted_secret(o.flag):
                out += [f"{o.written}={MASK}"] if o.inline else [str(o.written), *(MASK for _ in o.values)]
            elif o.flag is not None and o.values and secret_json_values(o.flag, o.values[0]):
                masked = _without_secret_fields(o.flag, o.values[0])
                out += [f"{o.written}={masked}"] if o.inline else [str(o.written), masked, *o.tokens[2:]]
            else:
                out += [self.text(token) for token in o.tokens]
        return out

    def mapping(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: (MASK if looks_secret(k) else self.text(v)) for k, v in env.items()}
