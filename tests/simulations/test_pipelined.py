"""Pipelined expansion in the simulator: the barrier's batch in waves one episode deep, and the tree MDP's
importance ratio for turns one update old."""

import numpy as np
import pytest

from trace_theory import RolloutBudget, get_policy

from simulations.mdp import MAX_RATIO, MDPWorld, TreeMDP, policy_gradient_step
from simulations.model import BernoulliTreeModel
from simulations.predictors import make_predictor
from simulations.rollout import SimForest
from simulations.runner import critical_path, sample_batch, sample_pipelined

MODEL = BernoulliTreeModel(max_turns=5, stop_prob=0.25)
BUDGET = RolloutBudget(48, 3)


@pytest.mark.parametrize("policy", ["trace", "trace_tokens", "uniform_tree"])
@pytest.mark.parametrize("seed", [0, 1])
def test_planted_then_drained_is_the_barriers_batch_node_for_node(policy, seed):
    """Same generator, same draws: the wave's bare rollouts and the deferred decisions are the barrier's,
    and the next wave (the same world) grows the continuations the barrier would have grown."""
    pol, predictor = get_policy(policy), make_predictor("noisy")
    rng = np.random.default_rng(seed)
    first = sample_pipelined(MODEL, pol, BUDGET, predictor, pool=30, rng=rng, pending=None)
    last = sample_pipelined(MODEL, pol, BUDGET, predictor, pool=30, rng=rng, pending=first.pending, plant=False)
    barrier = sample_batch(MODEL, pol, BUDGET, predictor, pool=30, rng=np.random.default_rng(seed))
    assert first.trained is None and last.pending is None
    a, b = last.trained, barrier
    for attr in ("parent", "origin", "depth"):
        np.testing.assert_array_equal(getattr(a.sampled.forest, attr), getattr(b.sampled.forest, attr))
    np.testing.assert_array_equal(a.sampled.forest.reward, b.sampled.forest.reward)
    np.testing.assert_array_equal(a.sampled.nodes["v"], b.sampled.nodes["v"])
    assert a.record.counts == b.record.counts and a.planted == b.planted
    np.testing.assert_array_equal(a.predicted, b.predicted)


def test_a_wave_is_one_episode_deep_and_lazy_trace_is_two():
    pol, predictor, rng = get_policy("trace"), make_predictor("learned"), np.random.default_rng(3)
    pending, paths = None, []
    for wave in range(4):
        out = sample_pipelined(MODEL, pol, BUDGET, predictor, pool=30, rng=rng, pending=pending)
        pending = out.pending
        paths.append(out.wave_critical_path)
        if out.trained is not None:
            # the wave's longest chain: this step's bare rollouts or the previous step's continuations
            grown = out.trained.sampled.forest
            new = np.flatnonzero(grown.is_leaf & (grown.rollout_start >= out.trained.planted))
            cont = grown.depth[new] - grown.depth[grown.parent[grown.rollout_start[new]]]
            bare = out.pending.record.forest
            assert out.wave_critical_path == max(cont.max(initial=0), bare.depth[bare.leaves].max())
    assert max(paths) <= MODEL.max_turns
    lazy = sample_batch(MODEL, pol, BUDGET, predictor, pool=30, rng=np.random.default_rng(3))
    assert critical_path(lazy) > MODEL.max_turns  # the barrier waits for every bare rollout


def test_a_policy_that_does_not_pipeline_is_one_ordinary_batch():
    out = sample_pipelined(MODEL, get_policy("grpo"), RolloutBudget(48, 0), make_predictor("learned"), pool=30,
                           rng=np.random.default_rng(0), pending=None)
    assert out.pending is None and out.trained.rollouts == 48
    assert out.wave_critical_path == critical_path(out.trained)


def _mdp_batch(theta_seed):
    mdp = TreeMDP(n_tasks=8, horizon=3)
    tasks = mdp.build(np.random.default_rng(0))
    theta = tasks.initial_logits() + np.random.default_rng(theta_seed).normal(0, 0.5, tasks.initial_logits().shape)
    world = MDPWorld(tasks, theta)
    batch = sample_batch(world, get_policy("trace"), RolloutBudget(16, 2), make_predictor("learned"), pool=8,
                         rng=np.random.default_rng(1))
    return tasks, world, batch


def test_on_policy_turns_have_ratio_one_and_the_step_is_unchanged():
    tasks, world, batch = _mdp_batch(0)
    nodes = batch.trained.nodes
    forest = batch.trained.forest
    y = np.flatnonzero(forest.parent != -1)
    np.testing.assert_array_equal(world.pi[nodes["task"][y], nodes["state"][forest.parent[y]], nodes["action"][y]],
                                  nodes["mu"][y])  # mu is the sampling policy's probability of the action
    without = SimForest(forest, {k: a for k, a in nodes.items() if k != "mu"})
    np.testing.assert_array_equal(policy_gradient_step(world, batch.trained, estimator="trace", lr=10.0),
                                  policy_gradient_step(world, without, estimator="trace", lr=10.0))


def test_turns_sampled_by_an_older_policy_are_weighted_by_their_truncated_ratio():
    """The step is linear in each turn's weight: a batch whose every turn has ratio 1.5 steps 1.5 times as
    far as on-policy, one with ratio 3 is truncated to MAX_RATIO; a really older policy's batch differs."""
    tasks, old_world, batch = _mdp_batch(0)
    new_world = MDPWorld(tasks, old_world.theta + np.random.default_rng(5).normal(0, 1.0, old_world.theta.shape))
    nodes, forest = batch.trained.nodes, batch.trained.forest
    y = np.flatnonzero(forest.parent != -1)
    pi_new = new_world.pi[nodes["task"][y], nodes["state"][forest.parent[y]], nodes["action"][y]]

    def step(ratio):
        mu = nodes["mu"].copy()
        mu[y] = pi_new / ratio
        grown = SimForest(forest, {**nodes, "mu": mu})
        return policy_gradient_step(new_world, grown, estimator="trace", lr=10.0) - new_world.theta

    plain = step(1.0)
    assert np.abs(plain).sum() > 0
    np.testing.assert_allclose(step(1.5), 1.5 * plain, atol=1e-12)
    np.testing.assert_allclose(step(3.0), MAX_RATIO * plain, atol=1e-12)
    stale = policy_gradient_step(new_world, batch.trained, estimator="trace", lr=10.0) - new_world.theta
    rho = pi_new / nodes["mu"][y]
    assert (rho > MAX_RATIO).any() and (rho < 1).any() and not np.allclose(stale, plain)
