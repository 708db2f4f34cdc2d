"""The transformers back end's prefix cache: whole blocks keyed by their prefix, least recently used
first out, and a back end that serves multi-turn histories from it without changing a sample."""

from __future__ import annotations

import pytest
import torch

from trace_train.backends import GenerationRequest, Sampling
from trace_train.backends.prefix_cache import BLOCK, PrefixCache

SAMPLE = Sampling(temperature=1.0, max_new_tokens=12)


def _kv(tokens, layers=2):
    """Keys and values that name their token and layer: shape (layers, 2, 1 head, len(tokens), 2)."""
    t = torch.tensor(tokens, dtype=torch.float32)
    per_layer = [torch.stack([t, t + layer], -1) for layer in range(layers)]
    return torch.stack([torch.stack([x, -x]) for x in per_layer])[:, :, None]


def _add(cache, tokens):
    calls = []

    def gather(start, stop):
        calls.append((start, stop))
        return _kv(tokens[start:stop])

    cache.add(tokens, gather)
    return calls


def test_lookup_returns_the_longest_cached_prefix_in_whole_blocks_within_the_limit():
    cache = PrefixCache(2**20)
    seq = list(range(100, 100 + 3 * BLOCK + 5))
    assert _add(cache, seq) == [(0, 3 * BLOCK)]  # whole blocks only
    n, kv = cache.lookup(seq + [1, 2], limit=len(seq) + 1)
    assert n == 3 * BLOCK and torch.equal(kv, _kv(seq[:n]))
    assert cache.lookup(seq, limit=3 * BLOCK - 1)[0] == 2 * BLOCK  # the limit keeps a prompt's last token
    assert cache.lookup(seq[:BLOCK - 1] + [7] + seq[BLOCK:], limit=10**6) == (0, None)


def test_a_block_is_shared_only_by_prompts_that_share_everything_before_it():
    cache = PrefixCache(2**20)
    a = list(range(2 * BLOCK))
    b = [999] + a[1:]  # the same second block behind a different first one
    _add(cache, a)
    assert cache.lookup(b + [5], limit=10**6) == (0, None)
    assert _add(cache, b) == [(0, 2 * BLOCK)]
    assert _add(cache, a + list(range(500, 500 + BLOCK))) == [(2 * BLOCK, 3 * BLOCK)]  # only what is missing


def test_the_least_recently_used_blocks_go_first_once_the_cache_is_full():
    one_block = _kv(list(range(BLOCK))).nbytes
    cache = PrefixCache(3 * one_block)
    a, b = list(range(2 * BLOCK)), list(range(1000, 1000 + 2 * BLOCK))
    _add(cache, a)
    _add(cache, b)  # four blocks: a's first goes
    assert len(cache) == 3 and cache.bytes == 3 * one_block
    assert cache.lookup(a + [1], limit=10**6) == (0, None)  # its second block is unreachable without it
    assert cache.lookup(b + [1], limit=10**6)[0] == 2 * BLOCK
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0
    assert _add(PrefixCache(0), a) == []  # size 0 keeps nothing and gathers nothing


def test_a_negative_size_is_refused():
    with pytest.raises(ValueError, match="at least 0 bytes"):
        PrefixCache(-1)


# ---- the transformers back end -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def game(tokenizer):
    from trace_train.chat import ChatFormat
    from trace_train.envs import GuessNumberEnv, make_rows

    chat = ChatFormat(tokenizer)
    return tuple(chat.prompt_ids(GuessNumberEnv().reset(make_rows(1, seed=3)[0])))


def _turns(backend, first, answer, turns=3, n=2):
    """A multi-turn game: each turn's prompt is the last prompt, sample 0's completion and ``answer``."""
    out, prompt = [], first
    for t in range(turns):
        [samples] = backend.generate([GenerationRequest(prompt, n=n, seed=10 * t)], SAMPLE)
        out.append(samples)
        prompt = prompt + samples[0].token_ids + answer
    return out


def test_a_multi_turn_history_comes_from_the_cache_and_no_sample_changes(tiny_dir, game, tokenizer):
    from trace_train.backends.hf_backend import HFBackend

    cached = HFBackend.from_pretrained(tiny_dir)
    plain = HFBackend.from_pretrained(tiny_dir, prefix_cache_bytes=0)
    answer = tuple(tokenizer.encode(" Higher. Guess again."))
    with_cache, without = _turns(cached, game, answer), _turns(plain, game, answer)
    for a, b in zip(with_cache, without):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        for ca, cb in zip(a, b):
            assert ca.logprobs == pytest.approx(cb.logprobs, abs=1e-5)
    prompt = game
    for t, samples in enumerate(with_cache):
        # sample 0 of turn t > 0 finds the last turn's prompt and completion (but its last token), in
        # whole blocks
        known = len(prompt) - len(answer) - 1 if t else 0
        assert samples[0].cached_prompt_tokens == min(known, len(prompt) - 1) // BLOCK * BLOCK
        assert [c.cached_prompt_tokens for c in without[t]] == [0, len(prompt)]
        prompt = prompt + samples[0].token_ids + answer
    assert with_cache[2][0].cached_prompt_tokens > 0


def test_new_weights_empty_the_cache(tiny_dir, game):
    from trace_train.backends.hf_backend import HFBackend

    backend = HFBackend.from_pretrained(tiny_dir)
    backend.generate([GenerationRequest(game, seed=1)], SAMPLE)
    assert len(backend.prefix_cache) > 0
    again = backend.generate([GenerationRequest(game + (5,), seed=1)], SAMPLE)[0][0]
    assert again.cached_prompt_tokens > 0
    g = torch.Generator().manual_seed(0)
    backend.update_weights({k: v + 0.2 * torch.randn(v.shape, generator=g)
                            for k, v in backend.model.state_dict().items()})
    assert len(backend.prefix_cache) == 0
    after = backend.generate([GenerationRequest(game + (5,), seed=1)], SAMPLE)[0][0]
    fresh = HFBackend(backend.model, backend.tokenizer, prefix_cache_bytes=0)
    expected = fresh.generate([GenerationRequest(game + (5,), seed=1)], SAMPLE)[0][0]
    assert after.cached_prompt_tokens == 0 and after.token_ids == expected.token_ids


def test_a_trainer_that_shares_its_model_empties_the_cache_after_each_update(tiny_dir, game):
    """fp32 in one process: the back end generates from the policy itself, which the optimiser changes in
    place (fused AdamW does not even bump the tensors' version counters): the sync empties the cache."""
    from types import SimpleNamespace

    from trace_train.backends.hf_backend import HFBackend
    from trace_train.train import _sync_weights

    backend = HFBackend.from_pretrained(tiny_dir)
    backend.generate([GenerationRequest(game, seed=1)], SAMPLE)
    assert len(backend.prefix_cache) > 0
    _sync_weights(SimpleNamespace(backend=backend, policy=backend.model))
    assert len(backend.prefix_cache) == 0


def test_weights_changed_in_place_empty_the_cache_at_the_next_call(tiny_dir, game):
    from trace_train.backends.hf_backend import HFBackend

    backend = HFBackend.from_pretrained(tiny_dir)
    backend.generate([GenerationRequest(game, seed=1)], SAMPLE)
    assert backend.generate([GenerationRequest(game + (5,), seed=1)], SAMPLE)[0][0].cached_prompt_tokens > 0
    with torch.no_grad():
        next(backend.model.parameters()).add_(0.1)
    assert backend.generate([GenerationRequest(game + (5,), seed=1)], SAMPLE)[0][0].cached_prompt_tokens == 0


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_bf16_generator_at_temperature_0_7_samples_the_same_with_the_cache(tiny_dir, game, tokenizer, attention):
    """What a GPU generator runs: bf16 weights, a temperature below 1, either attention kernel; the cached
    keys and values are bf16 too, so the cache must change no token there either."""
    from transformers import AutoModelForCausalLM

    from trace_train.backends.hf_backend import HFBackend

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.bfloat16, attn_implementation=attention)
    cached, plain = HFBackend(model, tokenizer), HFBackend(model, tokenizer, prefix_cache_bytes=0)
    answer = tuple(tokenizer.encode(" Lower. Guess again."))
    warm = Sampling(temperature=0.7, max_new_tokens=12)
    out = {}
    for name, backend in (("cached", cached), ("plain", plain)):
        prompt, turns = game, []
        for t in range(3):
            [samples] = backend.generate([GenerationRequest(prompt, n=2, seed=5 * t)], warm)
            turns.append(samples)
            prompt = prompt + samples[0].token_ids + answer
        out[name] = turns
    for a, b in zip(out["cached"], out["plain"]):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        for ca, cb in zip(a, b):
            assert ca.logprobs == pytest.approx(cb.logprobs, abs=0.05)  # bf16 rounding of recomputed keys
    assert out["cached"][2][0].cached_prompt_tokens > 0


def test_a_model_with_sliding_window_layers_generates_without_the_cache_and_its_buffers(
        tiny_dir, tokenizer, game, reference_logprobs):
    """A cache that is not plain full attention (here a sliding window of 8 on the first layer) runs on
    transformers' own cache: no prefix cache, no shared prefix spliced in, no preallocated buffers; its
    samples' log-probabilities are still the model's own, prompts sharing a long prefix included."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trace_train.backends.hf_backend import HFBackend

    config = AutoConfig.from_pretrained(tiny_dir, use_sliding_window=True, sliding_window=8, max_window_layers=1,
                                        layer_types=["sliding_attention", "full_attention"])
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, config=config, dtype=torch.float32).eval()
    backend = HFBackend(model, tokenizer)
    assert backend.prefix_cache.max_bytes == 0
    prompts = [game + tuple(tokenizer.encode(f" {n} guesses left.")) for n in (1, 2, 3)]
    for _ in range(2):  # a second call would find the first's prompts, were they cached
        results = backend.generate([GenerationRequest(p, n=2, seed=3 * i) for i, p in enumerate(prompts)], SAMPLE)
        for prompt, samples in zip(prompts, results):
            for c in samples:
                assert c.cached_prompt_tokens == (len(prompt) if c is samples[1] else 0)
                assert c.logprobs == pytest.approx(reference_logprobs(model, prompt, c.token_ids), abs=1e-4)
