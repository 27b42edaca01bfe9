"""Spellings of one configuration that vLLM reads alike, and pairs it reads apart: the key must agree.

tests/test_cachekey.py checks the key on them; tests/vllm/test_vllm_hash.py asks vLLM's own
parser and compile hash that each group is one hash and each pair two. Values fit the tiny
test model (its max_position_embeddings is 2048).
"""

from __future__ import annotations

# Spellings vLLM reads as one value: each group must give one key (tests/vllm/test_vllm_hash.py
# checks with vLLM itself that vLLM gives each group one hash, and each pair below two).
SAME_KEY_GROUPS = {
    "enforce_eager": [
        {"ENFORCE_EAGER": "true"},
        {"ENFORCE_EAGER": "True"},
        {"ENFORCE_EAGER": "1"},
        {"ENFORCE_EAGER": "yes"},
        {"VLLM_EXTRA_ARGS": "--enforce-eager"},
    ],
    "max_model_len": [{"MAX_MODEL_LEN": "512"}, {"MAX_MODEL_LEN": "0512"}, {"VLLM_EXTRA_ARGS": "--max-model-len=512"}],
    "max_num_seqs": [
        {"MAX_NUM_SEQS": "4"},
        {"VLLM_EXTRA_ARGS": "--max-num-seqs 4"},
        {"VLLM_EXTRA_ARGS": "--max-num-seqs=4"},
        {"MAX_NUM_SEQS": "8", "VLLM_EXTRA_ARGS": "--max-num-seqs 4"},  # extra args come last and win
        {"VLLM_EXTRA_ARGS": "--max-num-seqs 2 --max-num-seqs 4"},  # argparse keeps the last
    ],
    "tensor_parallel_size": [
        {"TENSOR_PARALLEL_SIZE": "2"},
        {"VLLM_EXTRA_ARGS": "-tp 2"},
        {"VLLM_EXTRA_ARGS": "--tensor-parallel-size=02"},
    ],
    "hf_overrides": [
        {"HF_OVERRIDES": '{"rms_norm_eps": 0.001, "tie_word_embeddings": false}'},
        {"HF_OVERRIDES": '{"tie_word_embeddings":false,"rms_norm_eps":0.001}'},
        {"VLLM_EXTRA_ARGS": """--hf-overrides='{"tie_word_embeddings": false, "rms_norm_eps": 1e-3}'"""},
    ],
    "api_key_left_out": [{}, {"VLLM_EXTRA_ARGS": "--api-key k1 k2"}, {"VLLM_EXTRA_ARGS": "--api-key=k1"}],
    "serving_flag_any_spelling": [
        {},
        {"SEED": "3"},
        {"VLLM_EXTRA_ARGS": "--seed 3"},
        {"TOKENIZER_MODE": "slow"},
        {"VLLM_EXTRA_ARGS": "--tokenizer-mode=slow"},
    ],
}
# Pairs vLLM hashes apart: two keys each.
DIFFERENT_KEYS = [
    ({"ENFORCE_EAGER": "true"}, {}),
    ({"MAX_MODEL_LEN": "512"}, {"MAX_MODEL_LEN": "1024"}),
    ({"MAX_NUM_SEQS": "4"}, {"MAX_NUM_SEQS": "8", "VLLM_EXTRA_ARGS": "--max-num-seqs 2"}),
    ({"HF_OVERRIDES": '{"rms_norm_eps": 0.001}'}, {"HF_OVERRIDES": '{"rms_norm_eps": 0.01}'}),
    ({"VLLM_EXTRA_ARGS": "--max-num-batched-tokens 4096"}, {"VLLM_EXTRA_ARGS": "--max-num-batched-tokens 2048"}),
]
