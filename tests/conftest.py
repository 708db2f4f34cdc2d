"""Test configuration shared by every test folder: Hypothesis profiles, and the trainer's model fixtures.

``dev`` (default) keeps property tests quick while editing and draws new examples every run, to find
new counterexamples; ``ci`` (``make test`` sets HYPOTHESIS_PROFILE=ci) runs more examples from a fixed
seed, so a CI result is reproducible. Neither has a deadline: timings belong in benchmarks.

The fixtures of the trainer's tests (one tiny warm-started model on disk and one vLLM engine per session,
shared by ``tests/train``, ``tests/backends``, ``tests/rollout``, ``tests/update``, ...) are defined here so
that every folder mirroring a ``trace_train`` subpackage gets the same session objects. The model is a
randomly initialised tiny Qwen3 with a locally trained tokenizer, warm-started for a few seconds on
guess-the-number transcripts so that it plays well-formed multi-turn games (numbers followed by
``<|im_end|>``). Nothing is downloaded; torch loads only when a fixture is used.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


BLOCK_SIZE = 32  # vLLM's CPU attention needs multiples of 32


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> str:
    from trace_train.tiny import save_tiny

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
    import torch

    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    start = len(prompt_ids) - 1
    return [float(logp[start + i, t]) for i, t in enumerate(completion_ids)]


@pytest.fixture(scope="session")
def reference_logprobs():
    """``f(model, prompt_ids, completion_ids)``: log-probabilities by a plain transformers forward pass."""
    return _reference_logprobs
