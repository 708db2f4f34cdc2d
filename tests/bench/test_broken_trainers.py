"""The GPU check fails every broken trainer it can see: each trainer below is the real one with one
deliberate fault (the advantage's sign flipped in the loss, the recorded log-probabilities one token
late, bf16 master weights), and each must fail ``--cpu-smoke``'s ``trainer_step`` section, at the check
that names its fault; the unbroken trainer passes it.

Before the section existed, the check passed all three: weights still moved under a flipped sign, no
section compared the loss's old log-probabilities with the generator's, and bf16 masters read as moved
against the stored fp32 weights (issue 51)."""

import dataclasses
import json

import pytest
import torch

from trace_train import gpu_check, train
from trace_train.bench import gpu_check as check
from trace_train.bench.trainer_step import trainer_step
from trace_train.update import loss as loss_module


def flip_the_advantage_sign(monkeypatch):
    policy_loss = loss_module.policy_loss

    def flipped(logprobs, old_logprobs, advantages, *args, **kwargs):
        return policy_loss(logprobs, old_logprobs, -advantages, *args, **kwargs)

    monkeypatch.setattr(loss_module, "policy_loss", flipped)


def record_logprobs_one_token_late(monkeypatch):
    batch_for = train.training_batch_for

    def late(*args, **kwargs):
        seqs = batch_for(*args, **kwargs)
        old = seqs.inputs.old_logprobs
        shifted = torch.zeros_like(old)
        shifted[:, 1:] = old[:, :-1]  # token t gets the log-probability recorded for token t - 1
        return dataclasses.replace(seqs, inputs=dataclasses.replace(seqs.inputs, old_logprobs=shifted))

    monkeypatch.setattr(train, "training_batch_for", late)


def keep_bf16_master_weights(monkeypatch):
    load_policy = train.load_policy
    monkeypatch.setattr(train, "load_policy", lambda path, device, dtype: load_policy(path, device, torch.bfloat16))


BROKEN = {  # fault -> (how to break the trainer, the compute dtype that shows it, the check that must fail)
    "sign_flipped_advantage": (flip_the_advantage_sign, "float32", "direction"),
    "logprobs_one_token_late": (record_logprobs_one_token_late, "float32", "alignment"),
    "bf16_master_weights": (keep_bf16_master_weights, "bfloat16", "movement"),
}


@pytest.mark.parametrize("fault", sorted(BROKEN))
def test_a_broken_trainer_fails_the_trainer_step_check(fault, monkeypatch):
    breaks, dtype, failing = BROKEN[fault]
    breaks(monkeypatch)
    row = trainer_step("cpu", dtype)
    assert not row["ok"] and not row[failing]["ok"], row


def test_the_unbroken_trainer_passes_it_in_both_dtypes(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--cpu-smoke", "--out", str(out), "--sections", "trainer_step"]) == 0
    rows = json.loads(out.read_text())["trainer_step"]
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"]
    for row in rows:
        assert row["alignment"]["ok"] and row["direction"]["ok"] and row["movement"]["ok"]
        assert row["direction"]["mean_change_positive"] > 0 > row["direction"]["mean_change_negative"]
        assert row["master_dtypes"] == ["float32"] and row["norm_entries_moved"] > 0.5


def test_a_sign_flipped_trainer_fails_the_whole_cpu_smoke_verdict(tmp_path, monkeypatch):
    flip_the_advantage_sign(monkeypatch)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--cpu-smoke", "--out", str(out), "--sections", "training_steps", "trainer_step"]) == 1
    result = json.loads(out.read_text())
    assert result["failed"] == ["trainer_step"]  # weights still move: the old check alone passed it


def test_training_steps_compares_bf16_masters_with_the_weights_they_started_from(monkeypatch):
    """Against the stored fp32 weights, bf16 masters after an export read as moved everywhere; the section
    now reads the masters the trainer holds, and fails them."""
    keep_bf16_master_weights(monkeypatch)
    [row] = check.training_steps("cpu", ("bfloat16",), 1)
    assert not row["ok"] and row["master_dtypes"] == ["bfloat16"] and not row["initial_weights_as_stored"]
