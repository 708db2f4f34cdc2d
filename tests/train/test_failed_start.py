"""A start that fails before its first step leaves nothing that blocks the corrected command (issue 54): the
config is written only once the data and the environment loaded, and a directory an older failed start
left (``run.lock`` and a ``config.yaml``, no checkpoint, no metrics) is taken over with one line."""

from __future__ import annotations

from pathlib import Path

import yaml

from trace_train import train
from trace_train.config_loader import config_to_dict, load_config
from trace_train.configs import TrainConfig

REPO = Path(__file__).resolve().parents[2]
TASK = "task.name=examples/parity_game/parity_env.py:ParityEnv"
ROWS = "task.train=examples/parity_game/rows.jsonl"
SMALL = ["steps=1", "eval.every=0", "rollout.limits.max_turn_tokens=16", "--quiet"]


def test_a_typo_in_task_train_then_the_corrected_command_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    typo = train.cli([TASK, "task.train=examples/parity_game/rowz.jsonl", f"run_dir={run_dir}", *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert typo == 1 and len(err) == 1 and "rowz.jsonl' does not exist" in err[0], err
    assert not (run_dir / "config.yaml").exists()  # the directory does not hold a run that never ran
    assert train.cli([TASK, ROWS, f"run_dir={run_dir}", *SMALL]) == 0, capsys.readouterr().err
    assert (run_dir / "checkpoints" / "latest").exists()
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert stored["task"]["train"] == "examples/parity_game/rows.jsonl"


def test_a_run_dir_left_by_a_failed_start_is_taken_over_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    failed = load_config(TrainConfig, None, [TASK, "task.train=examples/parity_game/rowz.jsonl", f"run_dir={run_dir}",
                                             *SMALL[:-1]])
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(failed), sort_keys=False))  # as older code did
    (run_dir / "run.lock").write_text("pid 1 on elsewhere\n")
    (run_dir / "tiny_model").mkdir()  # built for the failed config: not to be reused
    (run_dir / "tiny_model" / "config.json").write_text("{}")
    assert train.cli([TASK, ROWS, f"run_dir={run_dir}", *SMALL]) == 0
    said = [ln for ln in capsys.readouterr().err.splitlines() if "taking over" in ln]
    assert len(said) == 1 and "(differing in task.train)" in said[0] and "no checkpoint, no metrics" in said[0], said
    assert (run_dir / "checkpoints" / "latest").exists()
    assert (run_dir / "tiny_model" / "model.safetensors").exists()  # rebuilt


def test_a_run_dir_with_metrics_is_still_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    other = load_config(TrainConfig, None, [TASK, ROWS, f"run_dir={run_dir}", "optim.weight_decay=0.5", *SMALL[:-1]])
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(other), sort_keys=False))
    (run_dir / "run.lock").write_text("")
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "eval_success": 0.3}\n')
    assert train.cli([TASK, ROWS, f"run_dir={run_dir}", *SMALL]) == 1
    err = capsys.readouterr().err
    assert "holds another run" in err and "optim.weight_decay" in err
