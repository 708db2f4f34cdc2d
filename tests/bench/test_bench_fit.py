"""``bench.fit --compare``'s summary: each arm's step time against its pair's GRPO run, per step and per
generated token (the token budget is met to within a few tokens, so the two can differ)."""

from __future__ import annotations

import numpy as np
import pytest

from trace_train.bench import fit


def test_the_ratios_are_per_pair_per_step_and_per_token(monkeypatch):
    runs = {("trace_eager", 0): (0.6, 660.0), ("grpo", 0): (0.5, 600.0),
            ("trace_eager", 1): (0.4, 500.0), ("grpo", 1): (0.5, 500.0)}

    def measure_arm(arm, pair, steps, token_budget, backend, root, task="mixed"):
        seconds, tokens = runs[arm, pair]
        return {"arm": arm, "pair": pair, "step_seconds": seconds, "generated_tokens": tokens,
                "trained_tokens": tokens, "stale_token_share": 0.0, **dict.fromkeys(fit.PHASES, 0.0)}

    monkeypatch.setattr(fit, "measure_arm", measure_arm)
    summary = fit.compare(pairs=2, steps=3, token_budget=600, backend="hf", arms=("trace_eager",))
    eager = summary["trace_eager"]
    step = np.array([0.6 / 0.5, 0.4 / 0.5])
    token = np.array([(0.6 / 660) / (0.5 / 600), (0.4 / 500) / (0.5 / 500)])
    assert eager["ratio_to_grpo"] == pytest.approx(step.mean())
    assert eager["ratio_se"] == pytest.approx(step.std(ddof=1) / np.sqrt(2))
    assert eager["per_token_ratio_to_grpo"] == pytest.approx(token.mean())
    assert eager["per_token_ratio_se"] == pytest.approx(token.std(ddof=1) / np.sqrt(2))
    assert summary["grpo"]["per_token_ratio_to_grpo"] == 1.0 and summary["grpo"]["ratio_se"] == 0.0
