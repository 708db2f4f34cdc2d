"""A checkpoint is never rewritten after the fact; a NaN stop resumes with a lower optim.lr; every piece of
state a resumed step reads is in the checkpoint (issue 34)."""

import json

import numpy as np
import pytest
import torch

from trace_train.run.checkpoint import load_checkpoint
from trace_train.train import NonFiniteLossError, main

from tests.train.test_trainer import _same_run, small_config

BLOW_UP = ["optim.lr=1e12", "optim.grad_clip=0", "algorithm.loss.kl_coef=0"]
"""An absurd learning rate: the loss of the second step is not finite."""


def _assert_same_checkpoint(a, b):
    assert a.step == b.step
    for name, tensor in a.policy.items():
        assert torch.equal(tensor, b.policy[name]), name
    assert a.extra["sampler"] == b.extra["sampler"]
    assert a.extra["engine_costs"] == b.extra["engine_costs"]
    pa, pb = a.extra["predictor"], b.extra["predictor"]
    assert pa.keys() == pb.keys()
    for key in pa:
        assert np.array_equal(np.asarray(pa[key]), np.asarray(pb[key])), key
    assert torch.equal(a.rng["torch"], b.rng["torch"]) and a.rng["python"] == b.rng["python"]
    assert all(np.array_equal(x, y) for x, y in zip(a.rng["numpy"][1:2], b.rng["numpy"][1:2]))


@pytest.mark.parametrize("every", [1, 2], ids=["on-disk", "not-yet-saved"])
def test_after_a_non_finite_loss_the_last_good_checkpoint_holds_that_step_only(tmp_path, every):
    """The checkpoint of step 1 after step 2's NaN equals that of a run that stopped after step 1: kept as
    written (every=1) or written from the state captured before step 2's rollout (every=2), never with
    step 2's sampler, predictor, costs or random states."""
    reference = tmp_path / "reference"
    main(small_config(reference, *BLOW_UP, "steps=1", f"checkpoint_every={every}"))
    failed = tmp_path / "failed"
    with pytest.raises(NonFiniteLossError, match=r"step 2: .*checkpoint of step 1 at .*Lower optim.lr"):
        main(small_config(failed, *BLOW_UP, f"checkpoint_every={every}"))
    ckpt = failed / "checkpoints" / "step_00000001"
    if every == 1:
        assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == 1
    _assert_same_checkpoint(load_checkpoint(reference / "checkpoints" / "step_00000001", restore_random_state=False),
                            load_checkpoint(ckpt, restore_random_state=False))
    assert not (failed / "checkpoints" / "step_00000002").exists()


def test_a_nan_stop_resumes_in_the_same_run_dir_with_a_lower_learning_rate(tmp_path, capsys, monkeypatch):
    """Step 2's loss is not finite (injected where the update finds it: no optimiser step is made); the
    same command with a lower optim.lr resumes from the intact checkpoint of step 1 and finishes."""
    import trace_train.train as train

    real, calls = train._policy_update, []

    def update(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise NonFiniteLossError("loss is nan")
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "_policy_update", update)
    with pytest.raises(NonFiniteLossError, match=r"step 2: loss is nan; stopped with a checkpoint of step 1 at .* \(kept as written\)"):
        main(small_config(tmp_path, "checkpoint_every=1"))
    monkeypatch.setattr(train, "_policy_update", real)
    capsys.readouterr()
    done = main(small_config(tmp_path, "checkpoint_every=1", "optim.lr=5e-4", "optim.grad_clip=0.5", "steps=3"))
    err = capsys.readouterr().err
    assert "trace-train: resuming with optim.lr: 0.001 -> 0.0005" in err
    assert "trace-train: resuming with optim.grad_clip: 1.0 -> 0.5" in err
    assert "trace-train: resuming with steps: 4 -> 3" in err
    assert "resuming from step 1 of" in err
    assert np.isfinite(done["loss"])
    last = load_checkpoint(tmp_path / "checkpoints" / "step_00000003", restore_random_state=False)
    assert all(g["lr"] == 5e-4 for g in last.optimizer["param_groups"])


def test_trace_tokens_resumes_exactly(tmp_path):
    """``trace_tokens`` prices rollouts from the engine's turns per rollout: checkpointed, 2 + 2 steps
    equal 4 bitwise (weights, optimiser moments, predictor, metrics)."""
    # lockstep: the same polls each run (under heavy load the concurrent schedule's generate calls can group
    # the turns otherwise, and the left padding changes the sampled tokens' rounding)
    extra = ["rollout.policy=trace_tokens", "rollout.token_budget=600", "rollout.schedule=lockstep"]
    main(small_config(tmp_path / "straight", *extra))
    main(small_config(tmp_path / "resumed", *extra, "steps=2"))
    main(small_config(tmp_path / "resumed", *extra))
    _same_run(tmp_path / "straight", tmp_path / "resumed")
    ckpt = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "step_00000004", restore_random_state=False)
    assert len(ckpt.extra["engine_costs"]) == 3 and ckpt.extra["engine_costs"][2] is not None
