"""What an environment name is, derived from the table in variables.py: one of warmstart's own
settings, a worker-vllm name vLLM has removed, a variable vLLM reads (and may hash), one that must
not reach vLLM's environment, a secret. The table declares the variables; this module answers
questions about any name, declared or not.
"""

from __future__ import annotations

from .secrets import looks_secret
from .variables import BY_NAME, REMOVED_FLAGS, SECRET_VARIABLES, VARIABLES
from .vllm.hashing import VLLM_HASHED_UNPREFIXED

# Worker-vllm variables that name flags vLLM has removed: warn and ignore, as it does (engineflags.py).
REMOVED_VARS = tuple(REMOVED_FLAGS)


def known_variables() -> frozenset[str]:
    """Every variable name the settings read."""
    return frozenset(BY_NAME)


# Variables that configure warmstart and must not reach vLLM's environment. vLLM reads
# `VLLM_PORT` as the first of its internal ports (vllm/envs.py `get_vllm_port`,
# vllm/utils/network_utils.py `get_open_ports_list`), while worker-vllm's VLLM_PORT is the API
# port; other VLLM_* wrapper names are an "Unknown vLLM environment variable" to vLLM
# (platforms/interface.py `validate_environ`, fatal with hard_fail). The engine flags reach vLLM
# as arguments; generic names such as SEED or BLOCK_SIZE have no business in its environment.
# What still passes (`to_vllm`): the Hub token, for a library that fetches a config or
# tokenizer, and HF_HUB_OFFLINE, which the engine environment sets anyway.
WITHHELD_FROM_VLLM: frozenset[str] = known_variables() - {v.env for v in VARIABLES if v.to_vllm}


def is_vllm_variable(name: str) -> bool:
    """A variable vLLM reads (and may hash): VLLM_*, or one of its unprefixed names."""
    return (name.startswith("VLLM_") or name in VLLM_HASHED_UNPREFIXED) and name not in WITHHELD_FROM_VLLM


def is_secret_variable(name: str) -> bool:
    """True for a variable warmstart treats as secret: one the table marks `secret`, or one whose name
    looks secret (secrets.looks_secret, which alone answers for flags)."""
    return name in SECRET_VARIABLES or looks_secret(name)
