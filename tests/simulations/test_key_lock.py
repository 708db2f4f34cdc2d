"""The key-then-lock world (``simulations.key_lock``) and its experiment (``trace-sim run key_lock``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulations.experiments import key_lock
from simulations.experiments.base import Units
from simulations.key_lock import KeyLockMDP
from simulations.mdp import MDPWorld

REPO = Path(__file__).resolve().parents[2]
EVIDENCE = REPO / "benchmarks" / "where_trace_pays" / "key_lock_sim.json"


def test_uniform_values_are_the_formulas():
    """V(root) = 1/(2K), a right-key prefix 1/2, a wrong-key prefix 0, for every K of the mix."""
    world = KeyLockMDP(n_tasks=40, keys=(1, 2, 3, 4, 8))
    tasks = world.build(np.random.default_rng(0))
    theta = tasks.initial_logits()
    k = world.key_counts()
    np.testing.assert_allclose(tasks.success(theta), 1.0 / (2.0 * k))
    right, wrong = tasks.prefix_values(theta)
    np.testing.assert_allclose(right, 0.5)
    np.testing.assert_array_equal(wrong, 0.0)
    np.testing.assert_array_equal(tasks.optimum(), 1.0)


def test_the_policy_plays_only_a_tasks_own_keys_and_the_two_choices():
    world = KeyLockMDP(n_tasks=8, keys=(2, 8))
    tasks = world.build(np.random.default_rng(1))
    mdp = MDPWorld(tasks, tasks.initial_logits())
    prompts = mdp.sample_prompts(8, np.random.default_rng(2))
    rollouts = mdp.rollouts({k: np.repeat(v, 500) for k, v in prompts.items()}, np.zeros(4000, dtype=int),
                            np.random.default_rng(3))
    first, second = rollouts.turns["action"][0::2], rollouts.turns["action"][1::2]
    keys = np.repeat(tasks.keys[prompts["task"]], 500)
    assert (first >= 8 - keys).all() and set(second) == {6, 7}
    expected = np.repeat(1.0 / (2.0 * tasks.keys[prompts["task"]]), 500)
    assert abs(rollouts.reward.mean() - expected.mean()) < 4 * np.sqrt(expected.mean() / 4000)


def test_bad_worlds_fail_in_one_line():
    for keys, message in (((), "`keys`"), ((0, 2), "`keys`"), ((True,), "`keys`")):
        with pytest.raises(ValueError, match=message):
            KeyLockMDP(keys=keys)
    with pytest.raises(ValueError, match="`seeds` must be at least 2"):
        key_lock.Config(seeds=1)


def test_holm_adjusts_step_down_and_keeps_the_order():
    assert key_lock.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert key_lock.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])


def test_the_quick_experiment_reports_every_arm_and_names_its_primary_comparison():
    outcome = key_lock.run(key_lock.Config.quick(), Units(progress=False))
    details = outcome.details
    assert set(outcome.headline) == {"grpo", "root_only", "pcl", "trace"}
    primary = [c for c in details["comparisons"] if c["primary"]]
    assert [(c["trace_minus"], c["view"]) for c in primary] == [("grpo", "equal_turns")]
    assert all("p_holm" in c for c in details["comparisons"] if not c["primary"])
    assert not set(details["tuning_seeds"]) & set(details["seeds"])
    assert {r["arm"] for r in details["per_seed"]} == set(outcome.headline)
    assert outcome.result.startswith("TRACE beats" if outcome.held else "TRACE does not beat")


def test_the_committed_verdict_is_recomputed_from_its_per_seed_rows():
    assert EVIDENCE.exists(), f"{EVIDENCE} is the committed evidence docs/results.md cites; it is missing"
    data = json.loads(EVIDENCE.read_text())
    rows = data["per_seed"]
    assert not set(data["tuning_seeds"]) & set(data["seeds"]) and len(data["seeds"]) >= 16
    metric = {"equal_rollouts": "final_success", "equal_turns": "success_at_equal_turns"}
    for c in data["comparisons"]:
        view, other = c["view"], c["trace_minus"]
        rate = data["best_lr"][view]
        at = {arm: {r["seed"]: r[metric[view]] for r in rows if r["arm"] == arm and r["lr"] == rate[arm]}
              for arm in ("trace", other)}
        diff = np.array([at["trace"][s] - at[other][s] for s in data["seeds"]])
        recomputed = key_lock.paired(diff)
        assert recomputed["mean"] == pytest.approx(c["mean"], abs=1e-4)
        assert recomputed["p"] == pytest.approx(c["p"], abs=1e-5)
    primary = next(c for c in data["comparisons"] if c["primary"])
    assert data["held"] == (primary["mean"] > 0 and primary["p"] < 0.05 and all(
        c["mean"] > 0 and c["p_holm"] < 0.05 for c in data["comparisons"]
        if c["trace_minus"] == "root_only" and c["view"] == "equal_turns"))
    assert data["verdict"].startswith("TRACE beats" if data["held"] else "TRACE does not beat")
