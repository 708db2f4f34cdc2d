"""Experiment configs validate themselves; the checks can fail; headline statistics are what they claim."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from simulations.experiments import (
    EXPERIMENTS,
    ablation,
    contrast_identities,
    effective_ratio,
    learning_curves,
    predictor_quality,
    propositions,
    target_bias,
)
from simulations.experiments.base import Units, mean_and_stderr, summarise, unit_rng
from simulations.experiments import regime_map, sensitivity, tuning
from simulations.experiments.common import batch_metrics, calibrated, online_batches
from simulations.model import BernoulliTreeModel
from simulations.predictors import OraclePredictor
from simulations.runner import Arm, sample_batch
from trace_theory import RolloutBudget, contrast_pairs, get_policy
from trace_theory import effective_ratio as theory_effective_ratio


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_experiment_has_a_claim_and_valid_sizes(name):
    experiment = EXPERIMENTS[name]
    assert experiment.claim.endswith(".")
    default, quick = experiment.config(), experiment.config.quick()
    assert dataclasses.is_dataclass(default) and default != quick
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.seed = 1


@pytest.mark.parametrize(
    "module, changes, message",
    [
        (contrast_identities, {"prompts": 0}, "`prompts` must be a positive integer"),
        (contrast_identities, {"informativeness": (0.3, 1.5)}, "`informativeness` must lie in \\(0, 1\\]"),
        (contrast_identities, {"model": BernoulliTreeModel(max_turns=1)}, "`max_turns` >= 2"),
        (propositions, {"budgets": (64, 4096), "pool": 256}, "need `pool` >= 512"),
        (propositions, {"group_size": 1}, "`group_size` must be at least 2"),
        (effective_ratio, {"warmup": 12}, "`warmup` must be an integer in \\[0, batches\\)"),
        (effective_ratio, {"pool_factor": 0.5}, "`pool_factor` must be at least 1"),
        (effective_ratio, {"arms": ("grpo", "grpo")}, "`arms` has duplicates"),
        (effective_ratio, {"arms": ("trace[psychic]",)}, "unknown predictor 'psychic'"),
        (effective_ratio, {"target_ratio": 1.0}, "`target_ratio` must lie in \\(0, 1\\)"),
        (ablation, {"roots": (1,)}, "every shape needs M >= 2"),
        (ablation, {"roots": (8192,)}, "needs `pool` >= 1024"),
        (learning_curves, {"estimators": ("grpo", "nope")}, "unknown advantage estimator 'nope'"),
        (learning_curves, {"lr": 0.0}, "`lr` must be finite and positive"),
        (learning_curves, {"roots": 512}, "raise `mdp.n_tasks`"),
        (predictor_quality, {"noises": (1.0, 0.5)}, "`noises` must be at least two increasing"),
        (predictor_quality, {"temperatures": (2.0,)}, "include 1.0"),
        (target_bias, {"arms": ("grpo",)}, "`arms` must branch from prefixes; 'grpo' does not"),
        (target_bias, {"continuations": 0}, "`continuations` must be at least 1"),
        (learning_curves, {"lrs": (10.0, 40.0)}, "`lrs` must be positive and include `lr` = 20.0"),
        (learning_curves, {"swept_arms": ("pcl", "trace")}, "`swept_arms` must include 'trace' and 'grpo'"),
        (learning_curves, {"normalisations": ("mixed_leaves",)}, "`normalisations` must include 'leaves'"),
        (sensitivity, {"noises": (2.0, 1.0)}, "`noises` must be at least two increasing values"),
        (sensitivity, {"default_pool_factor": 5.0}, "must lie on their grids"),
        (regime_map, {"arms": ("grpo", "trace")}, "`arms` must include trace, root_only, pcl, grpo"),
        (regime_map, {"kappas": (0.5, 1.0)}, "`kappas` must lie in \\[0, 1\\] and include 0"),
        (regime_map, {"spreads": (0.268, 0.999)}, "outside the mixed shares"),
        (ablation, {"pool_modes": ("fixed", "huge")}, "`pool_modes` must name some of"),
    ],
)
def test_configs_reject_bad_settings(module, changes, message):
    with pytest.raises(ValueError, match=message):
        module.Config(**changes)


def test_unit_generators_depend_on_keys_not_on_order():
    a = unit_rng(3, "x", 1).random(3)
    assert np.array_equal(a, unit_rng(3, "x", 1).random(3))
    assert not np.array_equal(a, unit_rng(3, "x", 2).random(3))
    assert not np.array_equal(a, unit_rng(4, "x", 1).random(3))


def test_summarise_averages_within_seed_then_across_seeds():
    table = pd.DataFrame({"arm": ["a"] * 4, "seed": [0, 0, 1, 1], "value": [1.0, 3.0, 5.0, 7.0]})
    out = summarise(table, ["arm"])
    assert out["value"].item() == 4.0 and out["n"].item() == 2
    assert out["stderr"].item() == pytest.approx(mean_and_stderr([2.0, 6.0])[1])


def test_batch_metrics_are_the_trace_theory_metrics():
    model = calibrated(BernoulliTreeModel(), 0.268, 8)
    batch = sample_batch(
        model,
        get_policy("trace"),
        RolloutBudget(64, 2),
        OraclePredictor(),
        pool=48,
        rng=np.random.default_rng(0),
    )
    metrics = batch_metrics(batch)
    forest = batch.sampled.forest
    assert metrics["effective_ratio"] == theory_effective_ratio(forest)
    assert metrics["contrast_pairs_per_1k_rollouts"] == 1000 * contrast_pairs(forest) / 192
    assert metrics["mixed_prompts_per_1k_turns"] == pytest.approx(
        1000 * theory_effective_ratio(forest) * forest.n_prompts / forest.cost.sum()
    )
    assert metrics["rollouts"] == 192 and metrics["turns"] == forest.cost.sum()
    roots, prefixes = batch.depth == 0, batch.depth > 0
    assert roots.sum() == 48 and prefixes.sum() == forest.prefix_anchors().size
    weighted = (
        metrics["predictor_brier_roots"] * 48 + metrics["predictor_brier_prefixes"] * prefixes.sum()
    ) / batch.depth.size
    assert metrics["predictor_brier"] == pytest.approx(weighted)


@pytest.mark.parametrize("policy", ["grpo", "trace"])
def test_rollout_shares_follow_each_leaf_to_its_anchor(policy):
    """Budget by anchor depth and by the anchor's true V, against a walk from every leaf to its anchor."""
    model = calibrated(BernoulliTreeModel(), 0.268, 8)
    batch = sample_batch(
        model,
        get_policy(policy),
        RolloutBudget(64, 2),
        OraclePredictor(),
        pool=48,
        rng=np.random.default_rng(2),
    )
    forest, v = batch.sampled.forest, batch.sampled.nodes["v"]
    depth_counts, v_counts = {}, np.zeros(10)
    for leaf in np.flatnonzero(forest.is_leaf):
        node = leaf  # climb while the node is its parent's first child and the parent is not a root
        while forest.parent[forest.parent[node]] != -1 and forest.first_child[forest.parent[node]] == node:
            node = forest.parent[node]
        anchor = forest.parent[node]
        depth_counts[forest.depth[anchor]] = depth_counts.get(forest.depth[anchor], 0) + 1
        v_counts[min(int(v[anchor] * 10), 9)] += 1
    metrics = batch_metrics(batch)
    leaves = forest.is_leaf.sum()
    for d, n in depth_counts.items():
        assert metrics[f"rollout_share_depth_{d}"] == pytest.approx(n / leaves)
    for b in range(10):
        assert metrics[f"rollout_share_v_{b / 10:.1f}_{(b + 1) / 10:.1f}"] == pytest.approx(
            v_counts[b] / leaves
        )
    assert (depth_counts.keys() == {0}) == (policy == "grpo")


def test_grpo_reproduces_the_calibrated_effective_ratio():
    """Simulated GRPO groups of 8 mix as often as the exact calibration says, within 4 standard errors."""
    model = calibrated(BernoulliTreeModel(), 0.268, 8)
    rows = online_batches(
        model, Arm("grpo"), RolloutBudget(4096), pool=512, batches=4, rng=np.random.default_rng(1)
    )
    share = np.array([r["effective_ratio"] for r in rows])
    se = np.sqrt(0.268 * 0.732 / (512 * 4))
    assert abs(share.mean() - 0.268) < 4 * se


def test_the_quadratic_variation_check_catches_a_drifting_world():
    """A world whose turns push V up (not a martingale) must fail the identity check."""

    @dataclasses.dataclass(frozen=True)
    class Drifting(BernoulliTreeModel):
        def split(self, v, rng):
            return np.minimum(1.0, super().split(v, rng) + 0.05)

    config = contrast_identities.Config(
        prompts=20_000, informativeness=(0.3,), group_sizes=(2,), model=Drifting()
    )
    outcome = contrast_identities.run(config, Units(progress=False))
    assert not outcome.held
    assert outcome.headline["quadratic_variation"]["max_abs_z"] > config.z_limit


def test_the_contrast_identities_hold_in_the_real_world():
    config = contrast_identities.Config(prompts=20_000, informativeness=(0.3,), group_sizes=(2, 4))
    outcome = contrast_identities.run(config, Units(progress=False))
    assert outcome.held, outcome.result


def test_propositions_hold_at_quick_size():
    outcome = propositions.run(propositions.Config.quick(), Units(progress=False))
    assert outcome.held, outcome.result
    assert all(
        gain > 1 for gains in outcome.headline["active_over_uniform"].values() for gain in gains.values()
    )


@pytest.mark.slow
def test_target_bias_separates_outcome_dependent_from_independent_branching():
    config = target_bias.Config(
        seeds=8, batches=2, warmup=0, roots=256, arms=("trace[oracle]", "uniform_tree")
    )
    outcome = target_bias.run(config, Units(progress=False))
    assert outcome.details["checks"] == {
        "leaf_weighted biased in some V bin under outcome-dependent branching": True,
        "leaf_weighted unbiased in every V bin under outcome-independent branching": True,
        "factual unbiased in every V bin": True,
        "own_branches unbiased in every V bin": True,
    }, outcome.result


def test_best_rates_come_from_the_tuning_seeds_alone():
    rows = []
    for seed, (low, high) in {0: (0.9, 0.1), 1: (0.8, 0.2), 5: (0.1, 0.5), 6: (0.2, 0.6)}.items():
        rows += [{"arm": "trace", "lr": 10.0, "seed": seed, "view": "v", "value": low}]
        rows += [{"arm": "trace", "lr": 40.0, "seed": seed, "view": "v", "value": high}]
    scores = pd.DataFrame(rows)
    assert tuning.best_rates(scores, seeds=[5, 6]) == {"v": {"trace": 40.0}}  # report seeds 0, 1 prefer 10
    assert tuning.on_grid_edge({"trace": 40.0, "grpo": 20.0}, [10.0, 20.0, 40.0]) == ["trace"]


def test_comparison_pairs_each_arm_at_its_own_rate_by_seed():
    rows = [
        {"arm": arm, "lr": lr, "seed": s, "view": "v", "value": value + 0.01 * s}
        for s in range(4)
        for arm, lr, value in (("trace", 20.0, 0.6), ("trace", 40.0, 0.9), ("grpo", 40.0, 0.5), ("grpo", 20.0, 0.1))
    ]
    out = tuning.comparison(pd.DataFrame(rows), {"trace": 20.0, "grpo": 40.0}, "v", range(4), "trace")
    assert out["gap"]["grpo"]["mean"] == pytest.approx(0.1) and out["gap"]["grpo"]["stderr"] == 0
    assert out["score"]["trace"]["lr"] == 20.0 and tuning.beats(out["gap"]["grpo"])
    assert tuning.beats({"mean": 0.1, "stderr": 0.04}) and not tuning.beats({"mean": 0.1, "stderr": 0.06})


def test_a_continuation_that_pays_its_whole_prefix_again_costs_a_fresh_rollout():
    # In a fixed-horizon MDP a continuation from depth d costs (H - d) + kappa d turns: with kappa = 1 every
    # rollout costs H, so equal tokens is equal rollouts, exactly.
    config = regime_map.Config.quick()
    outcome = regime_map.run(config, Units(progress=False))
    for world in outcome.headline.values():
        assert world["equal_tokens_kappa=1"]["score"] == world["equal_rollouts"]["score"]
    assert set(outcome.details["pays"]) == set(config.worlds)


def test_sensitivity_locates_the_paper_between_noise_levels():
    assert sensitivity._crossing([0.5, 1.0, 2.0], [0.9, 0.7, 0.5], 0.606) == pytest.approx(1.47)
    assert sensitivity._crossing([0.5, 1.0], [0.9, 0.8], 0.606) is None


def test_units_in_forked_workers_give_the_same_table_and_are_not_rerun(tmp_path):
    offset = 0.5  # a closure: forked workers need not pickle it

    def unit(key):
        return pd.DataFrame({"key": [key], "value": [unit_rng(0, "w", key).random() + offset]})

    one = Units(tmp_path / "one", progress=False).map(unit, range(6), desc="u")
    two = Units(tmp_path / "two", progress=False, workers=2).map(unit, range(6), desc="u")
    pd.testing.assert_frame_equal(one, two)
    assert len(list((tmp_path / "two").glob("u-*.csv"))) == 6 and not list((tmp_path / "two").glob("*.partial"))
    offset = 9.0  # a rerun reads the saved units back instead of calling the function again
    pd.testing.assert_frame_equal(Units(tmp_path / "two", progress=False, workers=2).map(unit, range(6), desc="u"), two)
    with pytest.raises(ValueError, match="`workers` must be a positive integer, got 0"):
        Units(workers=0)


def test_forked_workers_end_on_sigterm_whatever_their_parent_handles(tmp_path):
    """``Pool.terminate`` ends the workers with SIGTERM: a worker must not inherit a handler its parent (a
    test, a CLI) installed, or a worker that keeps waiting holds ``Units.map`` forever."""
    import signal

    def unit(key):
        return pd.DataFrame({"key": [key], "default": [signal.getsignal(signal.SIGTERM) == signal.SIG_DFL]})

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # notes nothing, ends nothing
    try:
        table = Units(tmp_path, progress=False, workers=2).map(unit, range(4), desc="u")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert table["default"].all()


def test_a_sigterm_that_reaches_a_worker_before_its_initializer_still_ends_it(monkeypatch):
    """On a loaded machine ``Pool.terminate`` can signal a worker that has not yet run its initializer: the
    signal must wait for the default action, not run the handler the parent had (then the worker waits on
    the pool's queue, which terminate holds, and the pool never joins)."""
    import signal
    import threading
    import time

    from simulations.experiments import base

    original = base._default_sigterm

    def late():  # the initializer of a worker the scheduler started late
        time.sleep(0.5)
        original()

    monkeypatch.setattr(base, "_default_sigterm", late)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # notes nothing, ends nothing
    try:
        pool = base._fork_pool(1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    ender = threading.Thread(target=pool.terminate, daemon=True)  # SIGTERM while the worker sleeps
    ender.start()
    ender.join(timeout=20)
    workers = list(pool._pool)
    for worker in workers:  # a worker left waiting would hold the test run: end it either way
        if worker.is_alive():
            worker.kill()
    assert not ender.is_alive(), "Pool.terminate waited on a worker that ignored its SIGTERM"
    assert [worker.exitcode for worker in workers] == [-signal.SIGTERM]
