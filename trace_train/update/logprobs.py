"""Log-probabilities of the sampled tokens, in chunks: never the whole (rows, width, vocab) log-softmax.

For N selected logit positions with hidden states h_i (the model's last hidden state, after its final
norm), output embedding W (V x H, bias b) and sampled tokens y_i, at temperature T:

    z_i = (W h_i + b) / T,        log pi(y_i) = z_i[y_i] - logsumexp(z_i),
    d log pi(y_i) / d z_i = onehot(y_i) - softmax(z_i).

The model runs its ordinary forward (so FSDP's hooks, attention masks and position ids are untouched),
but its output layer is asked for no positions: a hook takes the hidden states and computes log pi(y_i)
``chunk_tokens`` positions at a time (a custom autograd function). The backward recomputes each chunk's
logits from h and W instead of keeping them, so neither pass holds more than one chunk of logits.

**Peak memory of the output layer** (beyond the hidden states, which the model holds anyway), with N
the positions asked for (the trainer asks only for trained tokens: ``trained_only``), C =
``chunk_tokens``, V the vocabulary and s the bytes of the compute dtype (2 for bf16, 4 for fp32):

    chunked:  min(C, N) V (s + 4) bytes   one chunk's logits in the compute dtype and in float32 (the
                                          backward's softmax and logit gradient reuse the float32 buffer)
              + N (8 + 2 H s_h) bytes     per position: lse and output; gathered rows of h, their gradient
    full:     P V (s + 8) bytes           P = rows x width positions, every one of them: the logits, their
                                          float32 copy and the float32 log-softmax saved for the backward

With C = 1024 and Qwen3's V = 151,936 the chunked head needs at most 1024 x 151936 x 6 bytes = 0.93 GB in
bf16 (1.24 GB in fp32), whatever the micro-batch, where the full one needs 1.5 MB per position (bf16):
49 GB at 32k positions. The rest of an update's peak (weights, gradients, optimizer state, the decoder's
activations: L layers x positions x H x a few) does not depend on V. ``python -m trace_train.bench.packing
--logprob-memory`` measures both at V = 151,936; ``tests/update/test_logprobs.py`` checks values, gradients
and the bound.

**Weight gradient.** dW accumulates over chunks in W's dtype (float32 master weights: exact to rounding;
bf16 weights: a sum of N / C bf16 partial products, as any chunked head gives).

Models whose logits are not ``output_embeddings(hidden)`` (a logit soft-cap or scale in their config, or
an output layer that is not ``nn.Linear``) fall back to the full computation (``chunk_tokens=0`` asks
for it everywhere: the reference the tests compare with).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["sampled_logprobs", "supports_chunking"]


def supports_chunking(model) -> bool:
    """Whether ``model``'s logits are exactly ``output_embeddings(last hidden state)``."""
    config = model.config
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) not in (None, 1.0):
        return False
    head = model.get_output_embeddings()
    return type(head) is torch.nn.Linear


def sampled_logprobs(model, input_ids: torch.Tensor, source: torch.Tensor, target: torch.Tensor, *,
                     temperature: float = 1.0, chunk_tokens: int = 1024, **forward) -> torch.Tensor:
    """log pi(target[i]) from the logits at flat position ``source[i]`` (row * width + column), shape (N,).

    ``forward``: the model's other inputs (attention_mask, position_ids). ``chunk_tokens=0``: the full
    (rows, width, vocab) log-softmax (the reference); otherwise chunks of that many positions.
    """
    if not (temperature > 0 and temperature < float("inf")):
        raise ValueError(f"`temperature` must be a positive finite number, got {temperature!r}")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 0:
        raise ValueError(f"`chunk_tokens` must be a non-negative integer, got {chunk_tokens!r}")
    if chunk_tokens == 0 or not supports_chunking(model):
        logits = model(input_ids=input_ids, **forward).logits
        logp = torch.log_softmax(logits.float() / temperature, dim=-1).reshape(-1, logits.shape[-1])
        return logp[source, target]
    head = model.get_output_embeddings()
    held: dict = {}

    def take_hidden(module, args):
        held["hidden"] = args[0]
        return (args[0][..., :0, :],)  # the output layer computes no logits

    def chunked(module, args, output):
        hidden = held.pop("hidden")
        flat = hidden.reshape(-1, hidden.shape[-1])
        return _ChunkedLogprob.apply(flat, module.weight, module.bias, source, target, float(temperature),
                                     chunk_tokens)

    hooks = [head.register_forward_pre_hook(take_hidden), head.register_forward_hook(chunked)]
    try:
        return model(input_ids=input_ids, **forward).logits
    finally:
        for h in hooks:
            h.remove()


def _compute_dtype(h: torch.Tensor, w: torch.Tensor) -> torch.dtype:
    kind = h.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return torch.promote_types(h.dtype, w.dtype)


class _ChunkedLogprob(torch.autograd.Function):
    """log softmax(W h / T)[y] over chunks of positions; the backward recomputes each chunk's logits."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, source, target, temperature, chunk):
        dtype = _compute_dtype(hidden, weight)
        out = torch.empty(source.numel(), dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            for lo in range(0, source.numel(), chunk):
                at = slice(lo, lo + chunk)
                z = F.linear(hidden[source[at]].to(dtype), w, b).float().div_(temperature)
                lse[at] = torch.logsumexp(z, dim=-1)
                out[at] = z.gather(-1, target[at, None]).squeeze(-1) - lse[at]
                del z
        ctx.save_for_backward(hidden, weight, bias, source, target, lse)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, source, target, lse = ctx.saved_tensors
        t, dtype = ctx.temperature, ctx.dtype
        grad_h = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_b = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            for lo in range(0, source.numel(), ctx.chunk):
                at = slice(lo, lo + ctx.chunk)
                h = hidden[source[at]].to(dtype)
                g = grad_out[at].float() / t
                z = F.linear(h, w, b).float().div_(t)
                # d out / d z = onehot(y) - softmax(z); d z / d logits = 1 / T
                dz = z.sub_(lse[at, None]).exp_().mul_(-g[:, None])
                dz.scatter_add_(-1, target[at, None], g[:, None])
                dz = dz.to(dtype)
                if grad_h is not None:
                    grad_h.index_add_(0, source[at], (dz @ w).to(hidden.dtype))
                if grad_w is not None:
                    grad_w.add_((dz.t() @ h).to(weight.dtype))
                if grad_b is not None:
                    grad_b.add_(dz.sum(0).to(bias.dtype))
                del z, dz
        return grad_h, grad_w, grad_b, None, None, None, None
