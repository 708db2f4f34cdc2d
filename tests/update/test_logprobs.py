"""Chunked log-probabilities of the sampled tokens: equal to the full log-softmax (values and gradients, at
a temperature, in both layouts) and within the peak-memory bound of ``trace_train.update.logprobs``."""

import numpy as np
import pytest
import torch

from tests.update.test_packing import fixed_batch, models  # noqa: F401  (the random Qwen3 pair)
from trace_train.update.logprobs import sampled_logprobs
from trace_train.update.packing import build_training_batch
from trace_train.bench.peak_memory import PeakMemory


def _grads(model, fn):
    model.zero_grad(set_to_none=True)
    out = fn()
    (out * torch.linspace(-1.0, 2.0, out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packing", ["leaf", "tree"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_equal_the_full_log_softmax(models, packing, temperature):
    policy, _ = models
    batch = fixed_batch()
    seqs = build_training_batch(batch, np.ones(len(batch.forest)), packing=packing, pad_token_id=0,
                                micro_batch_size=8, token_budget=4096)
    full, g_full = _grads(policy, lambda: seqs.logprobs(policy, temperature=temperature, chunk_tokens=0))
    for chunk in (1, 3, 1024):
        got, g = _grads(policy, lambda: seqs.logprobs(policy, temperature=temperature, chunk_tokens=chunk))
        torch.testing.assert_close(got, full, rtol=0, atol=2e-6)
        assert g.keys() == g_full.keys()
        for name in g_full:  # fp32 sums in another order: absolute error ~1e-6 of the gradient's scale (~10 here)
            scale = float(g_full[name].abs().max())
            torch.testing.assert_close(g[name], g_full[name], rtol=1e-4, atol=1e-6 * max(scale, 1.0), msg=name)
    # trained_only: the same values where the loss reads them, zero elsewhere
    only = seqs.logprobs(policy, temperature=temperature, trained_only=True).detach()
    mask = seqs.loss_mask > 0
    torch.testing.assert_close(only[mask], full[mask], rtol=0, atol=2e-6)
    assert (only[~mask] == 0).all()


def test_the_temperature_is_that_of_the_sampling_distribution(models):
    policy, _ = models
    ids = torch.randint(2, 40, (2, 9))
    r, t = torch.meshgrid(torch.arange(2), torch.arange(1, 9), indexing="ij")
    src, tgt = (r * 9 + t - 1).reshape(-1), ids[:, 1:].reshape(-1)
    with torch.no_grad():
        logits = policy(input_ids=ids).logits[:, :-1].float()
        want = torch.log_softmax(logits / 0.7, -1).gather(-1, ids[:, 1:, None]).reshape(-1)
        got = sampled_logprobs(policy, ids, src, tgt, temperature=0.7, chunk_tokens=5)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="`temperature` must be a positive finite number"):
        sampled_logprobs(policy, ids, src, tgt, temperature=0.0)
    with pytest.raises(ValueError, match="`chunk_tokens` must be a non-negative integer"):
        sampled_logprobs(policy, ids, src, tgt, chunk_tokens=-1)


_PEAKS = """
import gc, json, sys
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from trace_train.bench.peak_memory import PeakMemory
from trace_train.update.logprobs import sampled_logprobs

vocab, hidden = 32768, 32
config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=48, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                     tie_word_embeddings=False, attn_implementation="sdpa")
torch.manual_seed(0)
model = Qwen3ForCausalLM(config)
ids = torch.randint(0, vocab, (4, 257))
rows, width = ids.shape
r, t = torch.meshgrid(torch.arange(rows), torch.arange(1, width), indexing="ij")
src, tgt = (r * width + t - 1).reshape(-1), ids[:, 1:].reshape(-1)

def peak(chunk):
    gc.collect()
    with PeakMemory("cpu") as measured:
        out = sampled_logprobs(model, ids, src, tgt, temperature=0.7, chunk_tokens=chunk)
        out.sum().backward()
        del out
    model.zero_grad(set_to_none=True)
    return measured.bytes, measured.supported

peak(int(sys.argv[1]))  # warm up (first-call allocations, thread pools)
chunked, supported = peak(int(sys.argv[1]))
full, _ = peak(0)
print(json.dumps({"chunked": chunked, "full": full, "supported": supported}))
"""


def test_peak_memory_of_the_chunked_head_stays_under_the_stated_bound():
    """At a 32k vocabulary and 1,024 positions the full log-softmax needs about 3 x 128 MB; the chunked one
    stays under C V (s + 4) bytes plus the per-position terms (and 24 MB for the decoder and allocator).
    Measured in a fresh interpreter: in a long test process, memory that earlier tests freed but the
    process kept can serve the full computation without raising its resident peak. With glibc's fixed
    mmap threshold every tensor over 128 kB is mapped and unmapped by itself, so the resident size tracks
    the live tensors: with its default sliding threshold the same run measured -1 to 58 MB (17 MB fixed)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    if not PeakMemory("cpu").supported:
        pytest.skip("no /proc/self/status on this platform: peak RSS is not measurable")
    vocab, hidden, chunk, positions = 32768, 32, 64, 4 * 256
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run([sys.executable, "-c", _PEAKS, str(chunk)], env=env, cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["supported"], "/proc/self/clear_refs was not writable: the resident peak could not be reset"
    bound = chunk * vocab * (4 + 4) + positions * (8 + 4 * 2 * hidden) + 24 * 2**20
    assert got["chunked"] <= bound, (got["chunked"], bound)
    assert got["full"] > positions * vocab * 4 > 3 * bound  # the old computation: (rows, width, vocab) in float32
