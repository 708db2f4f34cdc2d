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


def _compare_file(rows, commit="abc", **fields):
    """A ``--compare`` file of ``rows``: (arm, pair, step seconds, tokens, update ms per 1k forwarded tokens)."""
    runs = [{"arm": a, "pair": p, "step_seconds": s, "generated_tokens": t, "median_update_ms_per_1k_forward_tokens": u}
            for a, p, s, t, u in rows]
    return {"backend": "hf", "task": "guess_games", "steps": 12, "token_budget": 600, "heap": "kept",
            "commit": commit, "dirty": False, "runs": runs, **fields}


def test_pooled_runs_average_a_seed_measured_twice_before_the_mean_over_seeds():
    a = _compare_file([("trace_eager", 0, 1.2, 600, 66), ("grpo", 0, 1.0, 600, 60),
                       ("trace_eager", 1, 1.0, 500, 50), ("grpo", 1, 1.0, 500, 50)])
    b = _compare_file([("trace_eager", 0, 1.0, 600, 60), ("grpo", 0, 1.0, 600, 60)])
    pooled = fit.pool_runs([a, b], ["a", "b"])["pooled"]["trace_eager"]
    seeds = np.array([(1.2 + 1.0) / 2, 1.0])  # seed 0 twice (1.2, 1.0), seed 1 once
    assert (pooled["seeds"], pooled["pairs"]) == (2, 3)
    assert pooled["per_token_ratio_to_grpo"] == pytest.approx(seeds.mean())
    assert pooled["per_token_ratio_se"] == pytest.approx(seeds.std(ddof=1) / np.sqrt(2))
    assert pooled["update_per_forward_token_ratio_to_grpo"] == pytest.approx(np.mean([(1.1 + 1.0) / 2, 1.0]))
    assert [r["measurements"] for r in pooled["per_seed"]] == [2, 1]


def test_runs_of_other_code_or_another_measurement_do_not_pool():
    rows = [("trace_eager", 0, 1.0, 600, 60), ("grpo", 0, 1.0, 600, 60)]
    with pytest.raises(ValueError, match="differ in commit"):
        fit.pool_runs([_compare_file(rows), _compare_file(rows, commit="def")], ["a", "b"])
    with pytest.raises(ValueError, match="differ in backend"):
        fit.pool_runs([_compare_file(rows), _compare_file(rows, backend="vllm")], ["a", "b"])
    with pytest.raises(ValueError, match="has no runs"):
        fit.pool_runs([{k: v for k, v in _compare_file(rows).items() if k != "runs"}], ["a"])
