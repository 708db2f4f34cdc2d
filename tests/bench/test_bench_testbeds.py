"""bench.testbeds: success by level from trace-eval's records, and the summary over seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trace_train.bench import testbeds
from trace_train.config_loader import load_config
from trace_train.train import TrainConfig


def test_success_is_split_by_the_level_in_each_row_id(tmp_path):
    records = [{"id": "aiw/L0/1000003/0", "rewards": [1.0, 0.0]}, {"id": "aiw/L1/1000003/0", "rewards": [0.0, 0.0]},
               {"id": "aiw/L0/1000003/1", "rewards": [1.0, 1.0]}, {"id": "FrozenLake-v0/L1/7", "rewards": [1.0, 0.0]}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert testbeds.success_by_level(tmp_path / "results.jsonl") == {"0": 0.75, "1": 0.25}


def test_the_summary_is_a_mean_with_its_standard_error_over_seeds():
    rows = [{"task": "aiw", "seed": s, "grpo_mixed_share": m, "held_out_success_per_eval": [[0, h], [8, 0.0]],
             "warmed_success_by_level": {"0": h}} for s, m, h in [(0, 0.5, 0.1), (1, 0.7, 0.3), (2, 0.9, 0.2)]]
    out = testbeds.summarize(rows)["aiw"]
    assert out["seeds"] == 3 and out["grpo_mixed_share"] == pytest.approx(0.7)
    assert out["grpo_mixed_share_se"] == pytest.approx(np.std([0.5, 0.7, 0.9], ddof=1) / np.sqrt(3), abs=1e-4)
    assert out["held_out_success_at_start"] == pytest.approx(0.2) and out["warmed_success_by_level"] == {"0": 0.2}


@pytest.mark.parametrize("name", sorted(testbeds.TASKS))
def test_every_task_is_a_valid_trainer_config(name):
    cfg = load_config(TrainConfig, None, testbeds.TASKS[name]["train"])
    assert cfg.task.name == testbeds.TASKS[name]["eval"]["benchmark"]
    assert all(cfg.task.env[k] == v for k, v in testbeds.TASKS[name]["eval"]["env_options"].items())
