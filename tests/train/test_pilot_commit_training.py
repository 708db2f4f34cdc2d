"""``rollout.policy=pilot_commit`` in the trainer: a short run on the tiny model spends the budget, trains and
moves the parameters; its settings are rollout settings, checked where they are read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trace_train.config_loader import load_config
from trace_train.configs import RolloutConfig, TrainConfig
from trace_train.run.checkpoint import latest_checkpoint, load_checkpoint
from trace_train.run.metrics_log import read_metrics
from trace_train.train import main

from .test_trainer import small_config


def test_a_pilot_commit_run_spends_the_budget_and_trains(tmp_path):
    """cpu_demo, small: M (1 + N) = 16 rollouts a step, pilots of 2 for 4 prompts (half the budget), then
    groups of 4 for those whose pilot mixed and the rest on top of them."""
    main(small_config(tmp_path, "rollout.policy=pilot_commit", "steps=2"))
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollouts"] == 16 and r["continuations"] == 0 and np.isfinite(r["loss"])
    ckpt = load_checkpoint(latest_checkpoint(tmp_path), restore_random_state=False)
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny_model").state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in ckpt.policy.items())  # the parameters moved


def test_pilot_settings_are_rollout_settings():
    policy = RolloutConfig(policy="pilot_commit", pilot=3, pilot_band=(0.2, 0.8), pilot_share=0.25).allocation_policy
    assert (policy.pilot, policy.pilot_band, policy.pilot_share, policy.group_size) == (3, (0.2, 0.8), 0.25, 8)
    cfg = load_config(TrainConfig, "cpu_demo", ["rollout.policy=pilot_commit", "rollout.pilot_band=[0.25, 0.75]"])
    assert cfg.rollout.allocation_policy.pilot_band == (0.25, 0.75)
    with pytest.raises(ValueError, match="`pilot` is a setting of Pilot-Commit; policy 'trace' runs no pilot"):
        RolloutConfig(policy="trace", pilot=2)
    with pytest.raises(ValueError, match="policy 'pilot_commit' reads its groups' 0/1 outcomes"):
        RolloutConfig(policy="pilot_commit", binary_rewards=False)


def test_trace_with_the_uniform_prior_control_trains_and_checkpoints_its_counts(tmp_path):
    """``predictor.kind=prompt_mean`` (the arm ``trace+prompt_mean``): TRACE runs on it, and the checkpoint holds
    the prompts' outcome counts and no learned arrays."""
    main(small_config(tmp_path, "predictor.kind=prompt_mean", "steps=2"))
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)
    state = load_checkpoint(latest_checkpoint(tmp_path), restore_random_state=False).extra["predictor"]
    assert state["config"]["kind"] == "prompt_mean" and len(state["count_keys"]) > 0
    assert set(state) == {"config", "count_keys", "counts", "offset_keys", "offsets"}
