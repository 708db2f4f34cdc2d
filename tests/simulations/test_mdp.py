"""The tree MDP: exact values by enumeration, rollouts, and the policy-gradient step."""

import itertools

import numpy as np
import pytest
from scipy.special import softmax

from simulations.mdp import NORMALISATIONS, MDPWorld, TreeMDP, policy_gradient_step
from simulations.predictors import OraclePredictor
from simulations.rollout import SimForest
from simulations.runner import sample_batch
from trace_theory import RolloutBudget, compute_advantages, get_policy


@pytest.fixture
def small():
    mdp = TreeMDP(n_tasks=12, n_actions=2, horizon=3)
    tasks = mdp.build(np.random.default_rng(0))
    theta = np.random.default_rng(1).normal(size=tasks.initial_logits().shape)
    return mdp, tasks, theta


def test_values_equal_brute_force_enumeration(small):
    mdp, tasks, theta = small
    pi = softmax(theta, axis=-1)
    off = mdp.offsets
    for task in range(mdp.n_tasks):
        total = 0.0
        for path in itertools.product(range(mdp.n_actions), repeat=mdp.horizon):
            prob, index = 1.0, 0
            for h, a in enumerate(path):
                prob *= pi[task, off[h] + index, a]
                index = index * mdp.n_actions + a
            total += prob * tasks.p_leaf[task, index]
        assert tasks.success(theta)[task] == pytest.approx(total, rel=1e-12)
    assert np.all(tasks.optimum() >= tasks.success(theta))


def test_rollouts_follow_the_tree_and_pay_bernoulli_of_the_leaf(small):
    mdp, tasks, theta = small
    world = MDPWorld(tasks, theta)
    n = 60_000
    anchors = {"task": np.zeros(n, np.int64), "state": np.full(n, 2), "action": np.zeros(n, np.int64)}
    out = world.rollouts(anchors, np.ones(n, np.int64), np.random.default_rng(2))  # from state 2 (depth 1)
    assert np.all(out.length == mdp.horizon - 1)
    states = out.turns["state"].reshape(n, -1)
    parent_local = 2 - mdp.offsets[1]
    assert np.all((states[:, 0] - mdp.offsets[2]) // mdp.n_actions == parent_local)
    assert np.all((states[:, 1] - mdp.offsets[3]) // mdp.n_actions == states[:, 0] - mdp.offsets[2])
    assert np.all(out.turns["action"].reshape(n, -1) == (states - mdp.offsets[[2, 3]]) % mdp.n_actions)
    v_anchor = world.v[0, 2]
    assert abs(out.reward.mean() - v_anchor) < 4 * np.sqrt(v_anchor * (1 - v_anchor) / n)


def _loop_gradient(world, sim, lr):
    """The documented update, one root-to-leaf path at a time with the leaf's flat GRPO advantage."""
    forest = sim.forest
    adv = compute_advantages(forest, "grpo")
    theta = world.theta.copy()
    for leaf in forest.leaves:
        path = forest.path_to_root(int(leaf))[:-1]  # turns from the leaf up, root excluded
        for y in path:
            task, state = sim.nodes["task"][y], sim.nodes["state"][forest.parent[y]]
            step = -world.pi[task, state].copy()
            step[sim.nodes["action"][y]] += 1.0
            theta[task, state] += lr / forest.n_leaves * adv[leaf] * step
    return theta


@pytest.mark.parametrize("policy", ["grpo", "trace"])
def test_policy_gradient_step_equals_the_path_by_path_loop(small, policy):
    _, tasks, theta = small
    world = MDPWorld(tasks, theta)
    batch = sample_batch(
        world,
        get_policy(policy, group_size=4),
        RolloutBudget(16, 2),
        OraclePredictor(),
        pool=12,
        rng=np.random.default_rng(3),
    )
    fast = policy_gradient_step(world, batch.trained, estimator="grpo", lr=0.5)
    assert np.allclose(fast, _loop_gradient(world, batch.trained, 0.5))
    assert np.abs(compute_advantages(batch.trained.forest, "grpo")).sum() > 0 and not np.allclose(fast, theta)


@pytest.mark.parametrize("normalisation", NORMALISATIONS)
def test_normalisations_divide_the_same_step_by_their_count(small, normalisation):
    mdp, tasks, theta = small
    world = MDPWorld(tasks, theta)
    batch = sample_batch(
        world, get_policy("trace", group_size=4), RolloutBudget(16, 2), OraclePredictor(), pool=12,
        rng=np.random.default_rng(3),
    )
    forest = batch.trained.forest
    mixed_leaves = sum(
        forest.leaf_count[r] for r in forest.roots if len(set(forest.reward[forest.leaves_under(r)])) == 2
    )
    turns = sum(1 for i in range(len(forest)) if forest.parent[i] != -1)  # one turn per non-root node
    divisor = {"leaves": forest.n_leaves, "mixed_leaves": mixed_leaves, "tokens": turns / mdp.horizon}
    by_leaves = policy_gradient_step(world, batch.trained, estimator="trace", lr=1.0) - theta
    step = policy_gradient_step(world, batch.trained, estimator="trace", lr=1.0, normalisation=normalisation)
    assert 0 < mixed_leaves < forest.n_leaves and turns < forest.n_leaves * mdp.horizon  # a real tree
    assert np.allclose(step - theta, by_leaves * forest.n_leaves / divisor[normalisation])


def test_an_unknown_normalisation_is_named(small):
    _, tasks, theta = small
    world = MDPWorld(tasks, theta)
    batch = sample_batch(
        world, get_policy("grpo", group_size=4), RolloutBudget(8, 0), OraclePredictor(), pool=12,
        rng=np.random.default_rng(3),
    )
    with pytest.raises(ValueError, match="unknown `normalisation` 'rows'; known: leaves, mixed_leaves, tokens"):
        policy_gradient_step(world, batch.trained, estimator="grpo", lr=1.0, normalisation="rows")


def test_training_on_trace_trees_raises_the_true_success_probability():
    mdp = TreeMDP(n_tasks=16, horizon=3)
    tasks = mdp.build(np.random.default_rng(4))
    theta = tasks.initial_logits()
    rng = np.random.default_rng(5)
    start = tasks.success(theta).mean()
    for _ in range(25):
        world = MDPWorld(tasks, theta)
        batch = sample_batch(
            world, get_policy("trace"), RolloutBudget(16, 2), OraclePredictor(), pool=16, rng=rng
        )
        theta = policy_gradient_step(world, batch.trained, estimator="trace", lr=20.0)
    assert tasks.success(theta).mean() > start + 0.03


def test_an_empty_forest_leaves_the_policy_unchanged(small):
    _, tasks, theta = small
    world = MDPWorld(tasks, theta)
    empty = SimForest.plant(
        world.sample_prompts(2, np.random.default_rng(0)),
        np.zeros(2, np.int64),
        world.rollouts(
            {k: np.zeros(0, np.int64) for k in ("task", "state", "action")},
            np.zeros(0, np.int64),
            np.random.default_rng(0),
        ),
    )
    assert np.array_equal(policy_gradient_step(world, empty, estimator="trace", lr=1.0), theta)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_tasks": 0}, "`n_tasks` must be an integer >= 1"),
        ({"n_actions": 1}, "`n_actions` must be an integer >= 2"),
        ({"n_actions": 10, "horizon": 7}, "too many to enumerate"),
        ({"action_scale": -1.0}, "`action_scale`"),
    ],
)
def test_mdp_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TreeMDP(**kwargs)


def test_a_pool_larger_than_the_task_set_is_an_error(small):
    _, tasks, theta = small
    with pytest.raises(ValueError, match="needs at least as many tasks"):
        MDPWorld(tasks, theta).sample_prompts(13, np.random.default_rng(0))
