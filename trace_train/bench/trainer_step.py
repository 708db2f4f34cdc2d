"""The GPU check's ``trainer_step`` section: one step of the trainer's own ``main``, judged from outside it.

``trace-train --config cpu_demo`` runs one step (``steps=1``, the presets' ``optim.lr`` 1e-6, ``model.dtype``
as asked) while spies record, without changing anything: the policy's parameters right before the step's
rollout (the initial weights as the trainer holds them) and right after its update (``train._sync_weights``,
called next), the step's rollout batch (``train._rollout``), and what the loss received in its first call,
before any optimiser step (``update.loss.LossInputs.loss``). Then, with a plain transformers forward of
each trained turn's exact tokens (the path's context, then its action; no code of the update):

* ``alignment``: the loss's old log-probabilities equal its new ones at the first call, at every trained
  position (the CPU demo's generator shares the policy's weights, so the ratio must be 1), and the
  generator's recorded log-probability of each action token equals the plain forward's at the same
  position. ok: the largest difference of each within ``ALIGNMENT_TOLERANCE[dtype]``. Recorded
  log-probabilities one token late fail it.
* ``direction``: the change of each trained token's log-probability over the step, Delta = log pi_after -
  log pi_before, against its turn's advantage A (``trace_theory.compute_advantages`` of the batch's
  forest, the estimator the config names): ok when sum(A Delta) > 0 (the surrogate the step ascends rose;
  to first order AdamW's step raises it), the mean Delta of positive-advantage tokens is above 0 and that
  of negative-advantage tokens below 0. The advantage's sign flipped anywhere in the trainer fails it.
* ``movement``: every parameter is float32 (the master dtype) and held exactly as stored in the model's
  files before the step; after it, the share of weight-matrix and of norm entries that differ from those
  initial fp32 values. ok: more than half of both moved. Master weights in bf16 fail it (they differ
  from the stored weights by rounding, and a step of 1e-6 rounds away on most entries); comparing against
  the stored fp32 weights after an export would count that rounding as movement.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time

import numpy as np

__all__ = ["ALIGNMENT_TOLERANCE", "trainer_step"]

ALIGNMENT_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}
"""Largest |old - new| log-probability at the first loss call, and |recorded - forward|, per compute dtype:
the generator and the trainer compute the same distribution, batched differently (bf16 rounds each
logit to 3 significant digits). A log-probability one token late is off by the gap between two tokens'
log-probabilities (several nats on the CPU demo's numbers)."""


@contextlib.contextmanager
def _spies(record: dict, *, last: bool = False):
    """Wrap ``train._rollout``, ``train._sync_weights`` and ``LossInputs.loss`` to record, and put them back.
    ``after``: the weights after the first update (``last``: after the last one)."""
    from .. import train
    from ..update import loss as loss_module

    rollout, sync, loss = train._rollout, train._sync_weights, loss_module.LossInputs.loss

    def snapshot(policy) -> dict:
        return {name: p.detach().clone() for name, p in policy.named_parameters()}

    def spy_rollout(run, step):
        if "before" not in record:
            record["before"] = snapshot(run.policy)
        batch = rollout(run, step)
        record.setdefault("batch", batch)
        return batch

    def spy_sync(run):
        if "before" in record and ("after" not in record or last):
            record["after"] = snapshot(run.policy)
        return sync(run)

    def spy_loss(self, logprobs, config, **kwargs):
        if "loss_inputs" not in record:
            record["loss_inputs"] = {"new": logprobs.detach().float().cpu(),
                                     "old": self.old_logprobs.detach().float().cpu(),
                                     "mask": self.loss_mask.detach().cpu() > 0}
        return loss(self, logprobs, config, **kwargs)

    train._rollout, train._sync_weights, loss_module.LossInputs.loss = spy_rollout, spy_sync, spy_loss
    try:
        yield record
    finally:
        train._rollout, train._sync_weights, loss_module.LossInputs.loss = rollout, sync, loss


def _forward_logprobs(model, state: dict, ids: list[int], positions: range, temperature: float) -> np.ndarray:
    """log pi(ids[t] | ids[:t]) at ``positions`` under ``state`` loaded into ``model`` (fp32, plain forward)."""
    import torch

    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    x = torch.tensor([ids])
    logits = model(input_ids=x).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return np.array([float(logp[t - 1, ids[t]]) for t in positions])


def _no_grad(items):
    """``items``, iterated with autograd off."""
    import torch

    with torch.no_grad():
        yield from items


def _trained_tokens(batch, advantages, trained) -> list[tuple[list[int], range, float, tuple]]:
    """(context + action ids, the action's positions, its turn's advantage, recorded log-probs) per trained turn."""
    out = []
    for node in np.flatnonzero(trained).tolist():
        payload = batch.nodes[node]
        if not payload.action_ids:
            continue
        context = batch.context_ids(batch.parent_of(node)) if batch.parent_of(node) >= 0 else []
        ids = context + list(payload.action_ids)
        out.append((ids, range(len(context), len(ids)), float(advantages[node]), payload.action_logprobs))
    return out


def _movement(before: dict, after: dict, stored: dict) -> dict:
    """Master dtypes, whether the initial weights are the stored fp32 ones, and the share of entries moved."""
    moved = {"matrices": [], "norms": []}
    for name, w in before.items():
        kind = "norms" if w.dim() == 1 else "matrices"
        moved[kind].append(float((after[name].float() != w.float()).float().mean()))
    dtypes = sorted({str(w.dtype).replace("torch.", "") for w in before.values()})
    as_stored = all(name in stored and stored[name].dtype == w.dtype and bool((stored[name] == w.cpu()).all())
                    for name, w in before.items())
    return {"master_dtypes": dtypes, "initial_weights_as_stored": as_stored,
            "matrix_entries_moved": float(np.mean(moved["matrices"])),
            "norm_entries_moved": float(np.mean(moved["norms"]))}


def trainer_step(device: str, dtype: str, *, lr: float = 1e-6, seed: int = 0) -> dict:
    """One step of ``main`` on the CPU demo in compute dtype ``dtype``; the row of the three checks."""
    import torch
    from transformers import AutoModelForCausalLM

    from trace_theory import compute_advantages

    from ..config_loader import load_config
    from ..train import TrainConfig, main as train

    record: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(TrainConfig, "cpu_demo", [
            f"run_dir={tmp}/run", "steps=1", f"device={device}", f"model.dtype={dtype}", f"seed={seed}",
            "eval.every=0", "tensorboard=false", "checkpoint_every=1", "quiet=true", "rollout.pool_size=8",
            "rollout.roots=16", "rollout.group_size=4", f"optim.lr={lr}", "max_length_cut_share=1"])
        t0 = time.perf_counter()
        with _spies(record):
            metrics = train(cfg)
        seconds = time.perf_counter() - t0
        stored = AutoModelForCausalLM.from_pretrained(f"{tmp}/run/tiny_model", dtype=torch.float32).eval()
    stored_state = dict(stored.named_parameters())
    row = {"dtype": dtype, "lr": lr, "seconds": seconds, "loss": metrics.get("loss"),
           **_movement(record["before"], record["after"], {k: v.detach() for k, v in stored_state.items()})}
    batch = record["batch"]
    advantages = compute_advantages(batch.forest, cfg.algorithm.advantage)
    turns = _trained_tokens(batch, advantages, batch.trained_nodes())
    temperature = cfg.rollout.temperature
    recorded_gap, a_delta, positive, negative = 0.0, 0.0, [], []
    for ids, positions, adv, recorded in _no_grad(turns):
        before = _forward_logprobs(stored, record["before"], ids, positions, temperature)
        after = _forward_logprobs(stored, record["after"], ids, positions, temperature)
        recorded_gap = max(recorded_gap, float(np.abs(before - np.asarray(recorded)).max()))
        delta = after - before
        a_delta += adv * float(delta.sum())
        (positive if adv > 0 else negative if adv < 0 else []).extend(delta.tolist())
    seen = record["loss_inputs"]
    first_call_gap = float((seen["new"] - seen["old"]).abs()[seen["mask"]].max()) if seen["mask"].any() else math.inf
    tol = ALIGNMENT_TOLERANCE[dtype]
    row["alignment"] = {"first_loss_call_max_abs_log_ratio": first_call_gap,
                        "recorded_vs_forward_max_abs": recorded_gap, "tolerance": tol,
                        "ok": bool(first_call_gap <= tol and recorded_gap <= tol)}
    row["direction"] = {"advantage_weighted_change": a_delta, "positive_tokens": len(positive),
                        "negative_tokens": len(negative),
                        "mean_change_positive": float(np.mean(positive)) if positive else None,
                        "mean_change_negative": float(np.mean(negative)) if negative else None}
    row["direction"]["ok"] = bool(positive and negative and a_delta > 0 and np.mean(positive) > 0 > np.mean(negative))
    row["movement"] = {"ok": bool(row["master_dtypes"] == ["float32"] and row["initial_weights_as_stored"]
                                  and row["matrix_entries_moved"] > 0.5 and row["norm_entries_moved"] > 0.5)}
    row["ok"] = bool(row["alignment"]["ok"] and row["direction"]["ok"] and row["movement"]["ok"]
                     and math.isfinite(row["loss"] if row["loss"] is not None else math.nan))
    print(f"trainer step {dtype}: {row}", flush=True)
    return row
