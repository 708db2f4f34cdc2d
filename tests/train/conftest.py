"""Shared fixtures: one tiny warm-started model on disk, one vLLM engine per test session.

The model is a randomly initialised tiny Qwen3 with a locally trained tokenizer, warm-started for a few
seconds on guess-the-number transcripts so that it plays well-formed multi-turn games (numbers followed
by ``<|im_end|>``). Nothing is downloaded.
"""

from __future__ import annotations

import pytest
import torch

from trace_train.tiny import save_tiny

BLOCK_SIZE = 32  # vLLM's CPU attention needs multiples of 32


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("tiny-qwen3"), seed=0, warm_steps=60)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def vllm_backend(tiny_dir):
    from trace_train.backends.vllm_backend import VLLMBackend

    return VLLMBackend(
        tiny_dir,
        dtype="float32",
        enforce_eager=True,
        block_size=BLOCK_SIZE,
        kv_cache_memory_bytes=256 * 2**20,
        max_model_len=2048,
        seed=0,
    )


@pytest.fixture
def hf_backend(tiny_dir):
    from trace_train.backends.hf_backend import HFBackend

    return HFBackend.from_pretrained(tiny_dir)


@pytest.fixture(params=["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def backend(request):
    """Each back end in turn (the vLLM one is shared by the session)."""
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture(scope="session")
def block_size() -> int:
    return BLOCK_SIZE


def _reference_logprobs(model, prompt_ids, completion_ids):
    """Raw log-probabilities of ``completion_ids`` after ``prompt_ids`` by one transformers forward pass."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    start = len(prompt_ids) - 1
    return [float(logp[start + i, t]) for i, t in enumerate(completion_ids)]


@pytest.fixture(scope="session")
def reference_logprobs():
    """``f(model, prompt_ids, completion_ids)``: log-probabilities by a plain transformers forward pass."""
    return _reference_logprobs
