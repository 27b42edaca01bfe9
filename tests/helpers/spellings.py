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
        {"VLLM_EXTRA_ARGS": "--enforce_eager"},
    ],
    # vLLM's default for these is False (engine/arg_utils.py): false is the same as unset.
    "off_by_default": [
        {},
        {"ENFORCE_EAGER": "false"},
        {"ENFORCE_EAGER": "0", "TRUST_REMOTE_CODE": "no", "ENABLE_LORA": "false"},
    ],
    "max_model_len": [{"MAX_MODEL_LEN": "512"}, {"MAX_MODEL_LEN": "0512"}, {"VLLM_EXTRA_ARGS": "--max-model-len=512"}],
    "max_num_seqs": [
        {"MAX_NUM_SEQS": "4"},
        {"VLLM_EXTRA_ARGS": "--max-num-seqs 4"},
        {"VLLM_EXTRA_ARGS": "--max-num-seqs=4"},
        {"MAX_NUM_SEQS": "8", "VLLM_EXTRA_ARGS": "--max-num-seqs 4"},  # extra args come last and win
        {"VLLM_EXTRA_ARGS": "--max-num-seqs 2 --max-num-seqs 4"},  # argparse keeps the last
        {"VLLM_EXTRA_ARGS": "--max_num_seqs 4"},  # utils/argparse_utils.py: `_` -> `-` before the first `.`
        {"VLLM_EXTRA_ARGS": "--max_num-seqs=4"},
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

# The fit to MAX_CONCURRENCY (engine/concurrency.py) yields to each of these: tests/vllm/test_concurrency.py
# checks the argv, tests/vllm/test_vllm_hash.py that vLLM's parser reads the user's value from it.
# Every way to choose max_num_seqs: (variables, the value vLLM ends up with).
USER_SEQS = [
    ({"MAX_NUM_SEQS": "8"}, 8),
    ({"VLLM_EXTRA_ARGS": "--max-num-seqs 8"}, 8),
    ({"VLLM_EXTRA_ARGS": "--max-num-seqs=8"}, 8),
    ({"VLLM_EXTRA_ARGS": "--max_num_seqs 8"}, 8),  # utils/argparse_utils.py: `_` -> `-` before the first `.`
    ({"VLLM_EXTRA_ARGS": "--max_num-seqs=8"}, 8),
    ({"MAX_NUM_SEQS": "4", "VLLM_EXTRA_ARGS": "--max-num-seqs 8"}, 8),  # extra args last: they win
]
# argparse's unambiguous prefix (allow_abbrev) would choose it too, but warmstart refuses abbreviations
# (vllm/extraargs.py `abbreviated`; tests/test_flag_smuggling.py): `--max-num-se 8` is a settings error.
# Every way to choose the capture sizes (or their largest).
USER_SIZES = [
    {"COMPILATION_CONFIG": '{"cudagraph_capture_sizes": [1, 2, 4]}'},
    {"COMPILATION_CONFIG": '{"max_cudagraph_capture_size": 8, "mode": 3}'},
    {"VLLM_EXTRA_ARGS": """-cc '{"cudagraph_capture_sizes": [1, 2, 4]}'"""},
    {"VLLM_EXTRA_ARGS": """--compilation-config='{"max_cudagraph_capture_size": 8}'"""},
    {"VLLM_EXTRA_ARGS": """--compilation_config '{"cudagraph_capture_sizes": [4]}'"""},
    {"VLLM_EXTRA_ARGS": "-cc.cudagraph_capture_sizes [1,2,4]"},
    {"VLLM_EXTRA_ARGS": "--compilation-config.max_cudagraph_capture_size=8"},
    {"VLLM_EXTRA_ARGS": "-cc.cudagraph_capture_sizes+ 1,2,4"},
    {"VLLM_EXTRA_ARGS": "--cudagraph-capture-sizes 1 2 4"},
    {"VLLM_EXTRA_ARGS": "--cudagraph_capture_sizes 1 2 4"},
    {"VLLM_EXTRA_ARGS": "--max-cudagraph-capture-size 8"},
    {"VLLM_EXTRA_ARGS": "--max_cudagraph_capture_size=8"},
]
