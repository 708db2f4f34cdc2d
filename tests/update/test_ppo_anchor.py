"""The PPO anchor: old log-probabilities recomputed by the trainer (on by default where there are several
mini-batch steps per rollout batch), ``optim.mini_batches`` optimizer steps per batch, and the metric that
says which anchor the clipping used."""

import copy

import numpy as np
import pytest
import torch

from tests.update.test_packing import fixed_batch, models  # noqa: F401  (a small Qwen3, random rollouts)
from trace_train.configs import AlgorithmConfig, OptimConfig, PolicyLossConfig, TrainConfig
from trace_train.run.distributed import DistInfo
from trace_train.train import _policy_update
from trace_train.update.packing import build_training_batch


def _update(model, seqs, *, mini_batches=1, recompute=None, lr=0.0):
    cfg = TrainConfig(algorithm=AlgorithmConfig(loss=PolicyLossConfig(kl_coef=0.0), recompute_old_logprobs=recompute),
                      optim=OptimConfig(grad_clip=0.0, micro_batch_size=2, mini_batches=mini_batches))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    steps = []
    step = optimizer.step
    optimizer.step = lambda *a, **k: (steps.append(1), step(*a, **k))[1]
    stats = _policy_update(model, optimizer, seqs, cfg, DistInfo())
    return stats, len(steps)


def _seqs():
    batch = fixed_batch()  # the generator's log-probabilities are random, mostly above the model's (ratio < 1)
    adv = -np.ones(len(batch.forest))  # A < 0: a ratio below 1 - eps clips
    return build_training_batch(batch, adv, packing="leaf", pad_token_id=0, micro_batch_size=2)


def test_the_anchor_is_recomputed_by_default_only_with_several_mini_batches():
    assert not TrainConfig().recomputes_old_logprobs
    assert TrainConfig(optim=OptimConfig(mini_batches=2)).recomputes_old_logprobs
    assert not TrainConfig(optim=OptimConfig(mini_batches=2),
                           algorithm=AlgorithmConfig(recompute_old_logprobs=False)).recomputes_old_logprobs
    assert TrainConfig(algorithm=AlgorithmConfig(recompute_old_logprobs=True)).recomputes_old_logprobs
    with pytest.raises(ValueError, match="`mini_batches` must be a positive integer, got 0"):
        OptimConfig(mini_batches=0)


def test_the_trainers_anchor_makes_the_first_steps_ratio_one(models):  # noqa: F811
    """Against the generator's records (random here) most tokens clip; against the trainer's own log-probs,
    recomputed before the step, the ratio is exactly 1 and nothing clips. The metric names the anchor, and
    the gap it reports is the mean |log pi_trainer - log pi_generator| over trained tokens."""
    policy, _ = models
    seqs = _seqs()
    generator, _ = _update(copy.deepcopy(policy), seqs)
    trainer, _ = _update(copy.deepcopy(policy), seqs, recompute=True)
    assert generator["clip_anchor_trainer"] == 0.0 and "anchor_abs_log_ratio" not in generator
    assert trainer["clip_anchor_trainer"] == 1.0
    assert generator["clip_fraction"] > 0.2 and trainer["clip_fraction"] == 0.0
    mask = seqs.loss_mask > 0
    with torch.no_grad():
        gap = (seqs.logprobs(policy) - seqs.old_logprobs).abs()[mask].mean()
    assert trainer["anchor_abs_log_ratio"] == pytest.approx(float(gap), rel=1e-5)


def test_mini_batches_take_one_step_each_against_the_same_anchor(models):  # noqa: F811
    """4 micro-batches in 2 mini-batches: 2 optimizer steps. The second step's anchor is still the policy
    before the first step, so after a large first step its tokens clip; one mini-batch is one step."""
    policy, _ = models
    seqs = _seqs()
    assert len(seqs.micro_batches()) >= 2
    one, n_one = _update(copy.deepcopy(policy), seqs)
    assert n_one == 1 and one["optimizer_steps"] == 1.0
    two, n_two = _update(copy.deepcopy(policy), seqs, mini_batches=2, lr=50.0)
    assert n_two == 2 and two["optimizer_steps"] == 2.0 and two["clip_anchor_trainer"] == 1.0
    assert 0.0 < two["clip_fraction"]  # the mean over the two steps: the first clips nothing, the second does
    many, n_many = _update(copy.deepcopy(policy), seqs, mini_batches=99)
    assert n_many == many["optimizer_steps"] == len(seqs.micro_batches())  # at most one step per micro-batch
    assert np.isfinite(two["loss"])
