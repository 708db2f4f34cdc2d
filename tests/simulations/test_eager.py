"""Eager expansion in the step driver, run in the simulator's world (its events, ``trace_theory.expansion``)."""

import numpy as np
import pytest

from trace_theory import EagerPlan, RolloutBudget, flip_probability, get_policy
from trace_theory.expansion import TreeDecisions

from simulations.model import BernoulliTreeModel
from simulations.predictors import make_predictor
from simulations.runner import critical_path, sample_batch

MODEL = BernoulliTreeModel(max_turns=5, stop_prob=0.25)
BUDGET = RolloutBudget(48, 3)


def batch(policy="trace", expansion="barrier", eager=None, *, predictor="noisy", seed=0, order_seed=None,
          model=MODEL):
    return sample_batch(model, get_policy(policy), BUDGET, make_predictor(predictor), pool=30,
                        rng=np.random.default_rng(seed), expansion=expansion, eager=eager, order_seed=order_seed)


def same_batch(a, b):
    fa, fb = a.sampled.forest, b.sampled.forest
    assert np.array_equal(fa.parent, fb.parent)
    assert np.array_equal(fa.reward, fb.reward, equal_nan=True)
    assert np.array_equal(fa.origin, fb.origin)
    assert np.array_equal(a.sampled.nodes["v"], b.sampled.nodes["v"])
    assert a.record.counts == b.record.counts
    assert np.array_equal(a.record.node_ids, b.record.node_ids)
    assert np.array_equal(a.record.node_v, b.record.node_v)
    assert np.array_equal(a.record.groups, b.record.groups)


@pytest.mark.parametrize("policy", ["trace", "trace_tokens"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reserve_one_is_streamed_node_for_node(policy, seed):
    streamed = batch(policy, "streamed", seed=seed)
    eager = batch(policy, "eager", EagerPlan(reserve=1.0), seed=seed)
    assert streamed.record.expansion == "streamed" and eager.record.expansion == "eager"
    same_batch(streamed, eager)
    assert np.array_equal(streamed.record.node_phase, eager.record.node_phase)
    assert eager.record.eager_spent == 0.0
    same_batch(streamed, batch(policy, "barrier", seed=seed))  # and streamed is the barrier's batch


@pytest.mark.parametrize("policy", ["trace", "trace_tokens"])
@pytest.mark.parametrize("reserve", [0.0, 0.25, 0.5])
@pytest.mark.parametrize("lag", [0, 1])
def test_decisions_do_not_depend_on_the_order_the_world_reports(policy, reserve, lag):
    plan = EagerPlan(reserve=reserve, threshold=0.05, lag=lag)
    ref = batch(policy, "eager", plan, seed=3)
    assert ref.record.eager_spent > 0
    for order_seed in (1, 2, 3):
        other = batch(policy, "eager", plan, seed=3, order_seed=order_seed)
        same_batch(ref, other)
        assert np.array_equal(ref.record.node_phase, other.record.node_phase)
        assert np.array_equal(ref.record.early_top_ups, other.record.early_top_ups)


@pytest.mark.parametrize("reserve", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("threshold", [None, 0.0, 0.1, 0.4])
def test_rollout_priced_eager_spends_the_budget_exactly(reserve, threshold):
    b = batch("trace", "eager", EagerPlan(reserve=reserve, threshold=threshold), seed=4)
    assert b.sampled.forest.n_leaves == BUDGET.total
    assert b.record.rollouts == BUDGET.total
    phase = b.record.node_phase
    assert phase.sum() + b.record.counts["top_up"] == BUDGET.roots * BUDGET.continuations_per_root


@pytest.mark.parametrize("policy", ["trace", "trace_tokens", "uniform_tree", "trace_beta"])
@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize("lag", [0, 1])
def test_no_reserve_keeps_the_step_one_episode_deep(policy, seed, lag):
    """Reserve 0: every continuation starts at its prefix's boundary or at its rollout's end, from its last
    prefix: the critical path is at most one turn past the longest bare rollout (GRPO's)."""
    model = BernoulliTreeModel(max_turns=6, stop_prob=0.2)
    eager = batch(policy, "eager", EagerPlan(reserve=0.0, threshold=0.02, lag=lag), seed=seed, model=model)
    barrier = batch(policy, "barrier", seed=seed, model=model)
    longest = int(barrier.sampled.forest.depth[barrier.sampled.forest.leaves][
        barrier.sampled.forest.rollout_start[barrier.sampled.forest.leaves] < barrier.planted].max())
    assert eager.record.node_phase[:, 2:].sum() == 0  # nothing is left for the tree's end
    assert critical_path(eager) <= longest + 1
    assert critical_path(barrier) > longest + 1
    assert critical_path(eager) < critical_path(barrier)


@pytest.mark.parametrize("seed", range(4))
def test_the_barrier_is_the_hindsight_optimum(seed):
    """Regret: on the same rollouts and predictions, the barrier's prefix utility sum flip(v, r, k) is at
    least eager TRACE's (its allocation is feasible for the barrier's per-tree problem)."""
    barrier = batch("trace", "barrier", predictor="oracle", seed=seed)
    for reserve in (0.0, 0.5):
        eager = batch("trace", "eager", EagerPlan(reserve=reserve, threshold=0.05), predictor="oracle", seed=seed)
        assert np.array_equal(barrier.record.node_ids, eager.record.node_ids)

        def utility(b, k):
            f = b.sampled.forest
            r = f.reward[f.factual_leaf[b.record.node_ids]]
            return float(flip_probability(b.record.node_v, r, k).sum())

        k_barrier = np.bincount(barrier.sampled.forest.parent[barrier.sampled.forest.rollout_start[
            barrier.sampled.forest.leaves]], minlength=len(barrier.sampled.forest))[barrier.record.node_ids]
        k_eager = eager.record.node_phase.sum(1)
        assert k_barrier.sum() == barrier.record.counts["continuation"]
        assert utility(barrier, k_barrier) >= utility(eager, k_eager) - 1e-9


def test_the_world_must_report_boundaries_in_depth_order():
    decide = TreeDecisions(get_policy("trace"), np.array([2]), 2, None, EagerPlan(reserve=0.0, threshold=0.0))
    from trace_theory import Prediction

    one = lambda concentration=False: Prediction(np.array([0.5]))  # noqa: E731
    assert decide.turn_boundary(0, 0, 1, one) == ()  # lag 1: decided at the next boundary
    assert decide.turn_boundary(0, 0, 2, one) == ((1, 2),)  # prefix at depth 1 takes the rollout's budget 2
    with pytest.raises(ValueError, match="depth order"):
        decide.turn_boundary(0, 0, 4, one)
    with pytest.raises(ValueError, match="not a running bare rollout"):
        decide.turn_boundary(0, 5, 1, one)
    with pytest.raises(ValueError, match="end once"):
        decide.rollout_ended(0, 1, 3, 1.0)
    assert decide.rollout_ended(0, 1, 1, 0.0) == ((0, 2),)  # a one-turn rollout: its budget tops up its root
    lag0 = TreeDecisions(get_policy("trace"), np.array([1]), 2, None, EagerPlan(reserve=0.0, threshold=0.0, lag=0))
    assert lag0.turn_boundary(0, 0, 1, one) == ((1, 2),)


def test_the_experiment_at_quick_size():
    from simulations.experiments import eager_expansion
    from simulations.experiments.base import Units

    outcome = eager_expansion.run(eager_expansion.Config.quick(), Units(progress=False))
    cell = outcome.headline["learned"]["mid"]
    assert cell["eager_0.0"]["critical_path"] <= cell["grpo"]["critical_path"] + 1
    assert cell["trace_barrier"]["critical_path"] > cell["grpo"]["critical_path"] + 1
    assert cell["trace_barrier"]["regret_per_1k_turns"] == 0.0  # the barrier is its own hindsight optimum
    assert cell["eager_0.0"]["regret_per_1k_turns"] >= 0.0
    assert set(outcome.details["learning"]["equal_critical_path"]["score"]) == {"grpo", "eager_0.0", "pipelined"}
    # pipelined: the barrier's decisions (no regret) in waves as deep as GRPO's steps
    assert cell["pipelined"]["regret_per_1k_turns"] == 0.0
    assert cell["pipelined"]["critical_path"] <= cell["grpo"]["critical_path"]
    assert set(outcome.details["learning"]["equal_turns"]["pipelined_gap"]) == {"grpo", "eager_0.0"}
    with pytest.raises(ValueError, match="unknown arm"):
        eager_expansion.Config(arms=("grpo", "trace_barrier", "eager_0.0", "eager_x"))
