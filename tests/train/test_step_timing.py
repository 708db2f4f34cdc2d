"""Each step's metrics say where its time went; ``predictor.kind`` picks the predictor a run fits and resumes."""

from trace_train.run.checkpoint import latest_checkpoint, load_checkpoint
from trace_train.config_loader import load_config
from trace_train.train import TrainConfig, main

SMALL = ["steps=1", "device=cpu", "tensorboard=false", "checkpoint_every=1", "eval.every=0",
         "rollout.pool_size=4", "rollout.roots=8", "model.tiny_warm_steps=20"]
PHASES = ("predict_seconds", "allocation_seconds", "bare_generation_seconds", "expansion_generation_seconds",
          "prepare_seconds", "update_seconds", "sync_seconds", "fit_wait_seconds", "predictor_fit_seconds",
          "predictor_fit_cpu_seconds")


def test_a_step_reports_its_phases_and_the_configured_predictor_kind(tmp_path):
    metrics = main(load_config(TrainConfig, "cpu_demo", [f"run_dir={tmp_path}", *SMALL, "predictor.kind=running_mean"]))
    missing = [k for k in PHASES if k not in metrics]
    assert not missing, missing
    assert all(metrics[k] >= 0 for k in PHASES)
    rollout = sum(metrics[k] for k in ("predict_seconds", "allocation_seconds", "bare_generation_seconds",
                                       "expansion_generation_seconds"))
    assert rollout <= metrics["rollout_seconds"] + 1e-6  # the engine's phases lie inside the rollout call
    assert metrics["bare_generation_seconds"] > 0 and metrics["predictor_fit_seconds"] > 0
    state = load_checkpoint(latest_checkpoint(tmp_path), restore_random_state=False).extra["predictor"]
    assert state["config"]["kind"] == "running_mean" and len(state["mean_keys"]) > 0


def test_predictions_made_inside_the_grow_call_count_once(tmp_path, monkeypatch):
    """Eager expansion predicts at turn boundaries, inside the bare rollouts' generation: that time is
    ``predict_seconds`` and not also ``bare_generation_seconds`` (else ``allocation_seconds``, the rollout's
    remainder, is short by it, and the phases add up to more than the rollout)."""
    import time

    from trace_train.predictors.base import PosteriorPredictor

    calls, slow = [], 0.2
    call = PosteriorPredictor.__call__

    def slow_call(self, histories):
        calls.append(len(histories))
        time.sleep(slow)
        return call(self, histories)

    monkeypatch.setattr(PosteriorPredictor, "__call__", slow_call)
    metrics = main(load_config(TrainConfig, "cpu_demo", [f"run_dir={tmp_path}", *SMALL, "rollout.expansion=eager"]))
    assert len(calls) >= 2  # the roots, then at least one round of turn boundaries
    assert metrics["predict_seconds"] >= slow * len(calls)
    phases = sum(metrics[k] for k in ("predict_seconds", "allocation_seconds", "bare_generation_seconds",
                                      "expansion_generation_seconds"))
    assert phases <= metrics["rollout_seconds"] + 1e-6
    assert metrics["bare_generation_seconds"] + metrics["predict_seconds"] <= metrics["rollout_seconds"] + 1e-6
