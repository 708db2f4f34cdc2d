"""``bench.update_cost`` end to end on one GRPO step of the tiny model: every path timed on the same rows,
the heap setting recorded, and the reference path a forward without gradients."""

from __future__ import annotations

import json

import pytest
import torch

from trace_train.bench import update_cost


@pytest.mark.slow
def test_one_step_through_every_path(tmp_path, monkeypatch):
    backwards = []
    real_backward = torch.Tensor.backward
    monkeypatch.setattr(torch.Tensor, "backward",
                        lambda self, *a, **k: backwards.append(1) or real_backward(self, *a, **k))
    ran = {}  # path -> backward passes it ran
    real_time_path = update_cost.time_path

    def time_path(model, batch, path, temperature):
        before = len(backwards)
        out = real_time_path(model, batch, path, temperature)
        ran[path] = ran.get(path, 0) + len(backwards) - before
        return out

    monkeypatch.setattr(update_cost, "time_path", time_path)
    out = tmp_path / "update_cost.json"
    update_cost.main(["--arms", "grpo", "--steps", "1", "--repeats", "1", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["heap"] == "kept"
    grpo = results["summary"]["grpo"]
    for path in update_cost.PATHS:
        assert grpo[path]["cpu_us_per_forward_token"] > 0
        assert grpo[path]["cpu_ratio_to_grpo"] == 1.0
    assert ran.pop("reference") == 0  # the reference model's forward: nothing goes backward
    assert set(ran) == set(update_cost.PATHS) - {"reference"} and min(ran.values()) >= 1
