"""One rollout batch's policy update: the clipped policy-gradient loss accumulated over micro-batches,
normalised by the global batch, then one optimiser step (or ``optim.mini_batches`` of them).

With ``optim.mini_batches`` = k the micro-batches are cut into k consecutive groups; each group is
normalised by its own global weight and followed by its own optimiser step. The PPO anchor (the
``old_logprobs`` the importance ratio divides by) is the generator's log-probabilities, or the
trainer's own, recomputed once before the first step (``algorithm.recompute_old_logprobs``; on by
default where k > 1, so that clipping acts on the policy's change between mini-batch steps rather than
on generator/trainer numerical mismatch). ``clip_anchor_trainer`` says which anchor a step used.

Under FSDP every rank runs every forward and backward (they gather and reduce together), so the ranks
agree on the number of micro-batches and a rank out of data runs a zero-weight pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import torch

from ..backends.base import pad_token_id
from ..run.distributed import DistInfo, global_normaliser, max_over_ranks, reshard_after_forward
from .loss import LOSS_METRICS

__all__ = ["NonFiniteLossError", "compute_precision", "policy_update"]


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the run stopped after checkpointing the last good step."""


def compute_precision(model_dtype: str, info: DistInfo, device: torch.device):
    """Mixed precision on one device: the fp32 master weights compute in ``model.dtype`` under autocast
    (gradients and AdamW's moments stay fp32, so a step of lr 1e-6 is not rounded away). Under FSDP the
    shards' ``MixedPrecisionPolicy`` does the same (``distributed.shard_policy``); fp32 runs need neither."""
    dtype = getattr(torch, model_dtype)
    if info.enabled or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def policy_update(model, optimizer, seqs, cfg, info: DistInfo, ref=None) -> dict:
    """The update of one rollout batch (module docstring); ``seqs``: packed trees or per-leaf rows
    (``trace_train.update.packing.build_training_batch``); ``cfg``: the run's ``TrainConfig``."""
    per_token = cfg.algorithm.loss.aggregation == "token_mean"
    parts = seqs.micro_batches()
    n_micro = max_over_ranks(max(1, len(parts)), info)
    device = next(model.parameters()).device
    sampled = dict(temperature=cfg.rollout.temperature, chunk_tokens=cfg.algorithm.logprob_chunk_tokens,
                   trained_only=True)  # the rollouts' distribution, in chunks (trace_train.update.logprobs)
    inputs = [part.inputs for part in parts]
    extra: dict[str, float] = {"clip_anchor_trainer": float(cfg.recomputes_old_logprobs)}
    if cfg.recomputes_old_logprobs:
        anchors, extra["anchor_abs_log_ratio"] = _trainer_anchors(model, parts, n_micro, cfg, info, device, sampled)
        inputs = [dataclasses.replace(x, old_logprobs=a) for x, a in zip(inputs, anchors)]
    k = min(cfg.optim.mini_batches, n_micro)
    groups = [range(n_micro * j // k, n_micro * (j + 1) // k) for j in range(k)]
    model.train()
    steps = []
    for group in groups:
        local = seqs.normaliser(per_token) if k == 1 else sum(parts[i].normaliser(per_token) for i in group
                                                              if i < len(parts))
        steps.append(_step_on(model, optimizer, parts, inputs, group, global_normaliser(local, info), cfg, info,
                              device, sampled, ref))
    model.eval()
    stats = {key: float(np.mean([st[key] for st in steps])) for key in steps[0]}
    stats.update(extra)
    stats["optimizer_steps"] = float(len(steps))
    stats["train_forward_tokens"], stats["train_unique_tokens"] = seqs.forward_tokens, seqs.unique_tokens
    return stats


def _zero_pass(model, ref, cfg, info: DistInfo, device, *, backward: bool) -> None:
    """A rank out of micro-batches joins the others' collectives with a zero-weight forward (and backward)."""
    ids = torch.full((1, 2), pad_token_id(model.config), dtype=torch.long, device=device)
    with compute_precision(cfg.model.dtype, info, device), torch.set_grad_enabled(backward):
        zero = model(input_ids=ids).logits.sum() * 0.0
        if ref is not None and info.enabled and backward:  # the sharded reference's forward is a collective too
            with torch.no_grad():
                ref(input_ids=ids)
            reshard_after_forward(ref)
    if backward:
        zero.backward()


def _trainer_anchors(model, parts, n_micro: int, cfg, info: DistInfo, device, sampled) -> tuple:
    """The trainer's log-probabilities of every micro-batch's tokens before any step (no gradient, in
    ``model.dtype`` as the update computes), and the mean |log ratio| to the generator's over trained tokens."""
    anchors, gap, count = [], 0.0, 0.0
    model.eval()
    for i in range(n_micro):
        if i >= len(parts):
            _zero_pass(model, None, cfg, info, device, backward=False)
            continue
        part = parts[i]
        with torch.no_grad(), compute_precision(cfg.model.dtype, info, device):
            logp = part.logprobs(model, **sampled).detach().float()
        mask = part.loss_mask.to(device) > 0
        anchors.append(torch.where(mask, logp, torch.zeros_like(logp)).cpu())
        gap += float((logp - part.old_logprobs.to(device).float()).abs()[mask].sum())
        count += float(mask.sum())
    return anchors, gap / max(count, 1.0)


def _step_on(model, optimizer, parts, inputs, group, total: float, cfg, info: DistInfo, device, sampled,
             ref) -> dict:
    """Accumulate the loss of the micro-batches ``group`` (normalised by ``total``, their global weight), then
    one optimiser step: the stats of that step (the loss's own metrics, ``LOSS_METRICS``, among them)."""
    loss_cfg = cfg.algorithm.loss
    per_token = loss_cfg.aggregation == "token_mean"
    optimizer.zero_grad(set_to_none=True)
    stats: dict[str, float] = {"loss": 0.0}
    loss_metrics = dict.fromkeys(LOSS_METRICS, 0.0)  # whatever the loss reports, weighted as the loss is
    weight = 0.0  # this rank's share of the normaliser
    bad_loss = None  # a non-finite loss of this rank
    for i in group:
        if i >= len(parts):
            _zero_pass(model, ref, cfg, info, device, backward=True)
            continue
        part = parts[i]
        layouts: dict = {}  # the attention layout: built by the policy's forward, reused by the reference's
        with compute_precision(cfg.model.dtype, info, device):
            logp = part.logprobs(model, layouts=layouts, **sampled)
            ref_logp = None
            if ref is not None:
                with torch.no_grad():
                    ref_logp = part.logprobs(ref, layouts=layouts, **sampled)
                reshard_after_forward(ref)  # FSDP2 keeps a root gathered for a backward the reference never runs
        loss, m = inputs[i].loss(logp, loss_cfg, ref_logprobs=ref_logp)  # clipped PG (update.loss.LossInputs)
        share = part.normaliser(per_token) / max(total, 1e-12)
        scaled = loss * share * info.world_size  # FSDP averages gradients over ranks
        if not torch.isfinite(loss) and bad_loss is None:
            bad_loss = float(loss.detach())  # raised below, once every rank knows: FSDP's backward is a collective
        scaled.backward()
        stats["loss"] += float(loss.detach()) * share * info.world_size
        for key, value in m.items():  # weighted as the loss is, so packing cannot change them
            loss_metrics[key] = loss_metrics.get(key, 0.0) + value * share
        weight += share
    stats.update({key: v / max(weight, 1e-12) for key, v in loss_metrics.items()})
    if max_over_ranks(bad_loss is not None, info):  # all ranks stop together, none is left in a collective
        raise NonFiniteLossError(f"loss is {bad_loss}" if bad_loss is not None else "loss is not finite on another rank")
    clip = cfg.optim.grad_clip or float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
    if not math.isfinite(grad_norm):
        raise NonFiniteLossError(f"gradient norm is {grad_norm}")
    optimizer.step()
    stats["grad_norm"] = grad_norm
    return stats
