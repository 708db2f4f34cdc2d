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
        seconds, tokens = runs.get((arm, pair), (99.0, 1.0))  # the warm-up run: in no statistic
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


def test_a_warm_up_run_comes_first_and_the_arms_take_turns_at_going_first(monkeypatch):
    calls = []

    def measure_arm(arm, pair, steps, token_budget, backend, root, task="mixed"):
        calls.append((arm, pair, steps))
        return {"arm": arm, "pair": pair, "step_seconds": 1.0 + (pair == 3), "generated_tokens": 600.0,
                "trained_tokens": 600.0, "stale_token_share": 0.0, **dict.fromkeys(fit.PHASES, 0.0)}

    monkeypatch.setattr(fit, "measure_arm", measure_arm)
    summary = fit.compare(pairs=3, steps=5, token_budget=600, backend="hf", arms=("trace_eager", "trace"))
    assert calls[0] == ("trace_eager", 3, fit.WARMUP_STEPS)  # a seed no pair uses
    assert summary["warmup_run"]["pair"] == 3 and all(r["pair"] < 3 for r in summary["runs"])
    firsts = [calls[1 + 3 * p][0] for p in range(3)]
    assert firsts == ["trace_eager", "trace", "grpo"]
    assert summary["trace"]["ratio_to_grpo"] == 1.0  # the warm-up's 2.0 s step is in no ratio
