"""Predictors: oracle, noisy oracle and the online learned predictor, behind one interface."""

import numpy as np
import pytest

from simulations.experiments.common import calibrated
from simulations.model import BernoulliTreeModel
from simulations.predictors import LearnedPredictor, NoisyOracle, OraclePredictor, make_predictor
from simulations.runner import sample_batch
from trace_theory import RolloutBudget, brier_score, get_policy, node_targets

RNG = np.random.default_rng


def test_oracle_returns_the_truth_clipped_away_from_zero_and_one():
    out = OraclePredictor().predict({"v": np.array([0.0, 0.3, 1.0])}, np.zeros(3), RNG(0))
    assert out.v.tolist() == [1e-6, 0.3, 1 - 1e-6]
    assert np.all(out.concentration == 1e4)


def test_noisy_oracle_without_noise_is_the_oracle_and_temperature_sharpens():
    nodes = {"v": np.array([0.2, 0.5, 0.9])}
    exact = NoisyOracle(noise=0.0).predict(nodes, np.zeros(3), RNG(0)).v
    assert np.allclose(exact, nodes["v"])
    sharp = NoisyOracle(noise=0.0, temperature=2.0).predict(nodes, np.zeros(3), RNG(0)).v
    assert sharp[0] < 0.2 and sharp[1] == pytest.approx(0.5) and sharp[2] > 0.9


def test_noisy_oracle_concentration_is_the_delta_method_strength():
    out = NoisyOracle(noise=0.5).predict({"v": np.full(4, 0.5)}, np.zeros(4), RNG(1))
    v = out.v
    assert np.allclose(out.concentration, np.clip(1 / (v * (1 - v) * 0.25) - 1, 0.1, 1e4))


def test_noise_makes_predictions_worse_in_proportion():
    v = RNG(2).random(20_000)
    scores = [
        brier_score(NoisyOracle(noise=s).predict({"v": v}, np.zeros(v.size), RNG(3)).v, v)
        for s in (0.25, 1, 4)
    ]
    assert scores[0] < scores[1] < scores[2]


def test_untrained_learned_predictor_says_one_half_with_weak_concentration():
    out = LearnedPredictor().predict({"signal": np.array([-3.0, 0.0, 5.0])}, np.zeros(3), RNG(0))
    assert np.allclose(out.v, 0.5) and np.allclose(out.concentration, 0.25 * 12 - 1)


def _learn(predictor, model, batches, seed):
    rng = RNG(seed)
    for _ in range(batches):
        batch = sample_batch(model, get_policy("trace"), RolloutBudget(256, 2), predictor, pool=192, rng=rng)
        predictor = predictor.update(batch.sampled)
    return predictor


@pytest.fixture(scope="module")
def model():
    return calibrated(BernoulliTreeModel(feature_noise=0.5), 0.268, 8)


def test_learned_predictor_beats_the_constant_and_approaches_the_noisy_oracle(model):
    learned = _learn(LearnedPredictor(), model, batches=6, seed=4)
    prompts = model.sample_prompts(20_000, RNG(5))
    depth = np.zeros(20_000, np.int64)
    v = prompts["v"]
    score = brier_score(learned.predict(prompts, depth, RNG(6)).v, v)
    assert score < 0.5 * brier_score(np.full(v.size, v.mean()), v)
    assert score < 2.0 * brier_score(NoisyOracle(noise=0.5).predict(prompts, depth, RNG(7)).v, v)


def test_learned_concentration_grows_with_evidence(model):
    learned = _learn(LearnedPredictor(), model, batches=6, seed=8)
    out = learned.predict({"signal": np.array([0.0])}, np.zeros(1), RNG(0))
    assert out.concentration[0] > 0.25 * 12 - 1  # more certain than the uniform prior it started from


def test_learned_predictor_fits_the_shared_recursive_targets(model):
    """One update with two different value methods moves the statistics by exactly their targets."""
    batch = sample_batch(
        model, get_policy("trace"), RolloutBudget(64, 2), OraclePredictor(), pool=48, rng=RNG(9)
    )
    forest = batch.sampled.forest
    for method in ("leaf_weighted", "factual"):
        fitted = LearnedPredictor(target=method).update(batch.sampled)
        target, weight = node_targets(forest, method)
        internal = ~forest.is_leaf
        phi = fitted.features(batch.sampled.nodes["signal"][internal], forest.depth[internal])
        assert np.allclose(fitted.stats[1], phi.T @ ((target[internal] - 0.5) * weight[internal]))


def test_decay_discounts_old_statistics(model):
    batch = sample_batch(
        model, get_policy("trace"), RolloutBudget(64, 2), OraclePredictor(), pool=48, rng=RNG(10)
    )
    once = LearnedPredictor(decay=0.5).update(batch.sampled)
    twice = once.update(batch.sampled)
    assert np.allclose(twice.stats[0], 1.5 * once.stats[0])


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("noisy", {"noise": -1.0}, "`noise` must be finite and non-negative"),
        ("noisy", {"temperature": 0.0}, "`temperature` must be finite and positive"),
        ("learned", {"target": "nope"}, "unknown value method 'nope'"),
        ("learned", {"decay": 0.0}, "`decay` must lie in \\(0, 1\\]"),
        ("learned", {"knots": 1}, "`knots` must be an integer >= 2"),
        ("psychic", {}, "unknown predictor 'psychic'; known: oracle, noisy, learned"),
    ],
)
def test_predictors_reject_bad_input(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_predictor(name, **kwargs)


def test_prompt_mean_is_each_tasks_own_uniform_prior_mean_at_every_node():
    """In the tree MDP a prompt is a task: v = (1 + s) / (2 + n) from the rollouts sampled at its roots, the
    same at every prefix of the task; unseen tasks get 1/2. The Bernoulli world's prompts are fresh: 1/2."""
    from simulations.mdp import MDPWorld, TreeMDP
    from trace_theory import root_outcomes

    tasks = TreeMDP(n_tasks=12, n_actions=2, horizon=3).build(RNG(0))
    world = MDPWorld(tasks, tasks.initial_logits())
    pred = make_predictor("prompt_mean", decay=1.0)
    batch = sample_batch(world, get_policy("trace"), RolloutBudget(16, 1), pred, pool=8, rng=RNG(1))
    learned = pred.update(batch.sampled)
    sim = batch.sampled
    roots, m, s = root_outcomes(sim.forest)
    task = sim.nodes["task"]
    seen = dict(zip(task[roots].tolist(), zip(s.tolist(), m.tolist())))
    nodes = np.arange(len(sim.forest))
    out = learned.predict(sim.payload(nodes), sim.forest.depth[nodes], RNG(2))
    expected = [(1 + seen[t][0]) / (2 + seen[t][1]) for t in task[nodes].tolist()]
    np.testing.assert_allclose(out.v, expected)
    np.testing.assert_allclose(out.concentration, [2 + seen[t][1] for t in task[nodes].tolist()])
    unseen = sorted(set(range(12)) - set(seen))[:1]
    fresh = {"task": np.array(unseen), "v": np.array([0.9])}
    assert learned.predict(fresh, np.zeros(1), RNG(3)).v.tolist() == [0.5]
    again = learned.update(batch.sampled)  # counts add up per task (decay 1)
    t = task[roots][0]
    assert again.counts[int(t)] == (2 * seen[int(t)][0], 2 * seen[int(t)][1])
    bernoulli = make_predictor("prompt_mean")
    v = bernoulli.predict({"v": np.array([0.1, 0.9])}, np.zeros(2), RNG(4)).v
    assert v.tolist() == [0.5, 0.5]
