"""``rollout.expansion=pipelined`` in the trainer: the pipeline fills and drains, and a run resumes exactly."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from trace_theory.pipelined import Pending
from trace_train.config_loader import load_config
from trace_train.configs import TrainConfig
from trace_train.run.checkpoint import latest_checkpoint, load_checkpoint
from trace_train.run.metrics_log import read_metrics
from trace_train.train import main

from .test_trainer import _same_run, _torchrun, small_config

PIPELINED = ("rollout.expansion=pipelined",)


def test_the_first_step_fills_the_last_drains_and_every_tree_is_trained(tmp_path, capsys):
    main(small_config(tmp_path, *PIPELINED, "checkpoint_every=1", "keep_checkpoints=4"))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["pipeline_fill"] == 1.0 and "loss" not in rows[0] and "rollouts" not in rows[0]
    assert "step 1/4  pipeline fill" in capsys.readouterr().out
    for r in rows[1:]:  # steps 2..4 train steps 1..3's trees, each the barrier's M (1 + N) rollouts
        assert r["rollouts"] == 16 and r["continuations"] + r["rollouts_at_depth_0"] == 16
        assert np.isfinite(r["loss"]) and 0 < r["stale_token_share"] < 1 and r["clip_anchor_trainer"] == 0.0
    assert rows[-1]["wave_tokens"] < rows[-1]["generated_tokens"]  # the drain grows continuations only
    pending = [load_checkpoint(tmp_path / "checkpoints" / f"step_{s:08d}", restore_random_state=False).pending
               for s in (1, 2, 3, 4)]
    assert all(isinstance(p[0], Pending) for p in pending[:3]) and pending[3] == [None]  # drained


def test_an_interrupted_pipelined_run_resumes_exactly(tmp_path):
    """Interrupted after step k (its checkpoint the last on disk; k = 1: after the fill), then resumed: the
    same metrics, weights, optimizer moments and predictor as the uninterrupted run. The pending step
    (bare trees, environment snapshots, decided continuations) is in the checkpoint."""
    straight = tmp_path / "straight"
    main(small_config(straight, *PIPELINED, "checkpoint_every=1", "keep_checkpoints=4"))
    for k in (1, 2):
        resumed = tmp_path / f"resumed_{k}"
        _interrupted_after(straight, resumed, k)
        assert isinstance(load_checkpoint(latest_checkpoint(resumed), restore_random_state=False).pending[0], Pending)
        main(small_config(resumed, *PIPELINED, "checkpoint_every=1", "keep_checkpoints=4"))
        _same_run(straight, resumed)


def _interrupted_after(straight, resumed, k):
    """A copy of run ``straight`` as if it had stopped after step ``k`` (its checkpoint the latest)."""
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "hf")
    for s in range(k + 1, 5):
        shutil.rmtree(resumed / "checkpoints" / f"step_{s:08d}")
    (resumed / "checkpoints" / "latest").write_text(f"step_{k:08d}\n")


@pytest.mark.slow
def test_two_pipelined_processes_each_resume_their_own_pending(tmp_path):
    """torchrun, 2 gloo ranks: each rank's pending is in pending.pkl, and each resumes its own."""
    straight = tmp_path / "straight"
    _torchrun(straight, *PIPELINED, "checkpoint_every=1", "keep_checkpoints=4")
    pending = load_checkpoint(straight / "checkpoints" / "step_00000002", restore_random_state=False).pending
    assert len(pending) == 2 and all(isinstance(p, Pending) for p in pending)
    assert pending[0].carried.rows != pending[1].carried.rows  # each rank's own pool
    _interrupted_after(straight, tmp_path / "resumed", 2)
    _torchrun(tmp_path / "resumed", *PIPELINED, "checkpoint_every=1", "keep_checkpoints=4")
    _same_run(straight, tmp_path / "resumed")


def test_a_one_step_run_plants_and_drains(tmp_path):
    metrics = main(small_config(tmp_path, *PIPELINED, "steps=1"))
    assert metrics["rollouts"] == 16 and np.isfinite(metrics["loss"])


def test_pipelined_refuses_recomputed_anchors(tmp_path):
    with pytest.raises(ValueError, match=r"`algorithm.recompute_old_logprobs` cannot be on with "
                                         r"`rollout.expansion=pipelined`"):
        load_config(TrainConfig, "cpu_demo", [f"run_dir={tmp_path}", *PIPELINED, "algorithm.recompute_old_logprobs=true"])
    cfg = load_config(TrainConfig, "cpu_demo", [f"run_dir={tmp_path}", *PIPELINED, "optim.mini_batches=2"])
    assert not cfg.recomputes_old_logprobs  # the generators' log-probabilities correct the stale tokens


def test_a_pending_file_without_this_ranks_step_is_one_line_naming_it(tmp_path):
    from types import SimpleNamespace

    from trace_train.run.checkpoint import CheckpointError
    from trace_train.train import _own_pending

    cfg = load_config(TrainConfig, "cpu_demo", [f"run_dir={tmp_path}", *PIPELINED])
    for held in ({"not": "a list"}, [None]):
        ckpt = SimpleNamespace(pending=held, path=tmp_path / "step_00000002")
        with pytest.raises(CheckpointError, match=r"step_00000002/pending\.pkl: holds no pending step for rank 1"):
            _own_pending(ckpt, 1, cfg)
    assert _own_pending(SimpleNamespace(pending=[None, None], path=tmp_path), 1, cfg) is None
    with pytest.raises(CheckpointError, match=r"pending\.pkl: missing"):
        _own_pending(SimpleNamespace(pending=None, path=tmp_path), 0, cfg)
