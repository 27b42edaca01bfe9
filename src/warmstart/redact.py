"""Keeping tokens and keys out of every log line, manifest and report.

Two layers: values of secret-named variables and flags are masked where they are
known to be secrets (argv, env dumps), and any known secret value that still appears
in free text (a vLLM log line, an exception message) is replaced before it is written.
Which names and flags are secret, and how vLLM reads them, is secrets.py's to say.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping

from .secrets import MASK, SECRET_JSON_FIELDS, looks_secret, secret_env_values, secret_values_in
from .secrets import without_secret_fields as _without_secret_fields
from .vllm.argv import parse_argv


def secret_flag_values(args: Iterable[str]) -> list[str]:
    """The secret values in an argv: every value of a secret flag (`--api-key k1 k2`, `--hf-token=S`)
    and the secret fields of a JSON-valued flag (`--watermark-config '{"key": ...}'`)."""
    return secret_values_in((o.flag, o.values) for o in parse_argv(args))


class Redactor:
    """Replace known secret values in text; mask secret-named entries in argv and env."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Short strings would mask ordinary words; real tokens are long.
        self.secrets = tuple(sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Redactor:
        """Values of secret-named variables, and of secret-named flags inside VLLM_EXTRA_ARGS
        (`--api-key S`: vLLM prints its non-default args, S included, in its first log line)."""
        values = secret_env_values(env)
        try:
            extra = shlex.split(env.get("VLLM_EXTRA_ARGS", ""))
        except ValueError:  # unbalanced quotes: settings reports it; mask every word meanwhile
            extra = env.get("VLLM_EXTRA_ARGS", "").split()
            values += [w for w in extra if not w.startswith("-")]
        return cls([*values, *secret_flag_values(extra)])

    def text(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def argv(self, args: Iterable[str]) -> list[str]:
        """The argv with every value of a secret-named flag masked (all of them, for `--api-key k1 k2`)."""
        out: list[str] = []
        for o in parse_argv(args):
            if o.flag is not None and looks_secret(o.flag):
                out += [f"{o.written}={MASK}"] if o.inline else [str(o.written), *(MASK for _ in o.values)]
            elif o.flag in SECRET_JSON_FIELDS and o.values:
                masked = _without_secret_fields(o.flag, o.values[0])
                out += [f"{o.written}={masked}"] if o.inline else [str(o.written), masked]
            else:
                out += [self.text(token) for token in o.tokens]
        return out

    def mapping(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: (MASK if looks_secret(k) else self.text(v)) for k, v in env.items()}
