"""The one-batch runner: equal budgets for every policy, exactly the trace_theory allocations, DAPO rounds."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simulations.experiments.common import calibrated
from simulations.mdp import MDPWorld, TreeMDP
from simulations.model import BernoulliTreeModel
from simulations.predictors import LearnedPredictor, OraclePredictor
from simulations.runner import Arm, sample_batch
from trace_theory import POLICIES, Origin, RolloutBudget, effective_ratio, get_policy, mixed_groups

MODEL = calibrated(BernoulliTreeModel(), 0.268, 8)


def _check_budget(batch, policy, budget, world=None):
    spent = batch.rollouts
    if policy.dynamic_sampling:  # stops early only once its batch holds the target of mixed groups
        kept = batch.trained.rollouts // policy.group_size
        assert spent <= budget.total
        assert spent > budget.total - policy.group_size or kept >= policy.dynamic_target(budget.total)
    elif policy.priced_in_tokens:  # continuations cost their expected remaining turns: more rollouts, same tokens
        assert spent >= budget.total
        f = batch.sampled.forest
        starts = np.flatnonzero(f.starts_rollout)
        price = world.expected_turns(f.depth[f.parent[starts]]) / world.expected_turns(0)
        assert price.sum() <= budget.total * (1 + 1e-9)
    else:
        assert spent == budget.total
    forest = batch.sampled.forest
    assert batch.turns == forest.cost.sum() == len(forest) - forest.n_prompts  # one unit per turn


@pytest.mark.parametrize("name", POLICIES.names())
@pytest.mark.parametrize("max_turns", [1, 2, 6])
def test_every_policy_spends_exactly_the_budget(name, max_turns):
    """max_turns = 1 leaves no prefix to branch from: tree policies must spend it on roots instead."""
    model = BernoulliTreeModel(pass_rates=MODEL.pass_rates, max_turns=max_turns)
    policy, budget = get_policy(name), RolloutBudget(96, 2)
    batch = sample_batch(model, policy, budget, LearnedPredictor(), pool=72, rng=np.random.default_rng(0))
    _check_budget(batch, policy, budget, model)


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(POLICIES.names()),
    roots=st.integers(2, 48),
    continuations=st.integers(0, 4),
    group_size=st.integers(
        4, 10
    ),  # with the bounds above, at most 60 groups: the pool of 64 tasks holds them
    seed=st.integers(0, 2**32 - 1),
)
@example(name="dapo", roots=2, continuations=0, group_size=4, seed=0)  # a budget below one group: no round
def test_budget_conservation_in_the_mdp(name, roots, continuations, group_size, seed):
    mdp = TreeMDP(n_tasks=64, horizon=3)
    tasks = mdp.build(np.random.default_rng(seed))
    world = MDPWorld(tasks, tasks.initial_logits())
    policy, budget = get_policy(name, group_size=group_size), RolloutBudget(roots, continuations)
    pool = max(-(-policy.split(budget)[0] // group_size), 32)
    batch = sample_batch(world, policy, budget, OraclePredictor(), pool=pool, rng=np.random.default_rng(seed))
    _check_budget(batch, policy, budget, world)


@pytest.mark.parametrize(
    "name", ["pcl", "root_only", "prefix_only", "trace", "trace_beta", "active_root_uniform_prefix"]
)
def test_allocations_are_exactly_those_of_trace_theory(name):
    """Re-derive both stages from the recorded forest with the trace_theory policy and compare."""
    policy, budget, pool = get_policy(name), RolloutBudget(64, 2), 48
    batch = sample_batch(MODEL, policy, budget, OraclePredictor(), pool=pool, rng=np.random.default_rng(1))
    prompts = MODEL.sample_prompts(pool, np.random.default_rng(1))  # the runner's first draw
    forest = batch.sampled.forest
    v = np.clip(prompts["v"], 1e-6, 1 - 1e-6)
    expected_m = policy.allocate_roots(v, policy.split(budget)[0], concentration=np.full(pool, 1e4))
    m = np.zeros(pool, dtype=np.int64)
    m[forest.prompt[forest.roots]] = forest.n_children[forest.roots]
    assert np.array_equal(m, expected_m)
    if not policy.branches:
        return
    anchors = forest.prefix_anchors()
    k = forest.n_children[anchors] - 1  # the first child continues the factual rollout
    expected_k = policy.allocate_prefixes(
        np.clip(batch.sampled.nodes["v"][anchors], 1e-6, 1 - 1e-6),
        forest.reward[forest.factual_leaf[anchors]],
        forest.tree_index[anchors],
        budget.continuations_per_root * m[m > 0],
    ).k
    assert np.array_equal(k, expected_k)


def test_uniform_policies_never_consult_the_predictor():
    batch = sample_batch(
        MODEL,
        get_policy("uniform_tree"),
        RolloutBudget(64, 2),
        LearnedPredictor(),
        pool=48,
        rng=np.random.default_rng(2),
    )
    assert batch.predicted.size == 0
    traced = sample_batch(
        MODEL,
        get_policy("trace"),
        RolloutBudget(64, 2),
        LearnedPredictor(),
        pool=48,
        rng=np.random.default_rng(2),
    )
    forest = traced.sampled.forest
    assert traced.predicted.size == 48 + forest.prefix_anchors().size
    assert np.array_equal(traced.depth[:48], np.zeros(48))


def test_dapo_charges_every_round_and_trains_on_mixed_groups_only():
    policy, budget = get_policy("dapo"), RolloutBudget(256)
    batch = sample_batch(MODEL, policy, budget, OraclePredictor(), pool=64, rng=np.random.default_rng(3))
    sampled, trained = batch.sampled.forest, batch.trained.forest
    assert batch.rollouts == 256 and batch.rounds >= 1
    _, mixed = mixed_groups(sampled.prompt[sampled.leaves], sampled.reward[sampled.leaves])
    assert trained.n_prompts == mixed.sum() and effective_ratio(trained) == 1.0
    assert set(trained.prompt[trained.roots]) <= set(sampled.prompt[sampled.roots])


def test_dapo_runs_further_rounds_while_budget_remains():
    """With a budget of 5 groups and a pool of 3 prompts, DAPO needs rounds until the pool runs dry."""
    policy = get_policy("dapo", group_size=4)
    batch = sample_batch(
        MODEL, policy, RolloutBudget(12), OraclePredictor(), pool=3, rng=np.random.default_rng(4)
    )
    assert batch.rollouts <= 12 and batch.sampled.forest.n_prompts <= 3


def test_same_seed_same_batch():
    def run():
        return sample_batch(
            MODEL,
            get_policy("random_prefix"),
            RolloutBudget(64, 2),
            LearnedPredictor(),
            pool=48,
            rng=np.random.default_rng(5),
        ).sampled

    a, b = run(), run()
    assert np.array_equal(a.forest.parent, b.forest.parent)
    assert np.array_equal(a.nodes["v"], b.nodes["v"], equal_nan=True)


def test_a_pool_too_small_for_the_policy_is_an_error():
    with pytest.raises(
        ValueError, match="`pool` \\(4\\) must hold at least the 8 prompts that 'grpo' may use"
    ):
        sample_batch(
            MODEL,
            get_policy("grpo"),
            RolloutBudget(64),
            OraclePredictor(),
            pool=4,
            rng=np.random.default_rng(0),
        )


def test_arms_parse_policy_and_predictor():
    assert Arm.parse("trace") == Arm("trace", "learned") and Arm.parse("trace").label == "trace"
    assert Arm.parse("pcl[noisy]").label == "pcl[noisy]"
    with pytest.raises(ValueError, match="written 'policy', 'policy\\[predictor\\]'"):
        Arm.parse("trace[oracle")
    with pytest.raises(ValueError, match="unknown allocation policy 'tracee'"):
        Arm.parse("tracee")
    with pytest.raises(ValueError, match="unknown predictor 'psychic' in arm 'trace\\[psychic\\]'"):
        Arm.parse("trace[psychic]")


def test_arms_carry_policy_settings():
    arm = Arm.parse("dapo{dapo_target=16}[oracle]")
    assert arm.settings == (("dapo_target", 16),) and arm.label == "dapo{dapo_target=16}[oracle]"
    assert Arm.parse(arm.label) == arm
    assert arm.allocation_policy(group_size=4) == get_policy("dapo", group_size=4, dapo_target=16)
    with pytest.raises(ValueError, match="`dapo_target` is a setting of dynamic sampling; policy 'trace' has none"):
        Arm.parse("trace{dapo_target=2}")
    with pytest.raises(ValueError, match="a setting is written key=literal, got 'x'"):
        Arm.parse("trace{x}")


@pytest.mark.parametrize("name", [n for n in POLICIES.names() if get_policy(n).branches])
@pytest.mark.parametrize("rounds", [2, 3])
def test_repeated_expansion_spends_the_budget_and_branches_from_continuations(name, rounds):
    policy, budget = get_policy(name), RolloutBudget(96, 3)
    batch = sample_batch(MODEL, policy, budget, LearnedPredictor(), pool=72, rng=np.random.default_rng(6),
                         expansion_rounds=rounds)
    _check_budget(batch, policy, budget, MODEL)
    forest = batch.sampled.forest
    branch = forest.starts_rollout & (forest.origin == Origin.CONTINUATION)
    assert (forest.origin[forest.parent[branch]] == Origin.CONTINUATION).any()  # round 2 and later
    assert len(batch.record.continuations_by_round) == rounds
    assert sum(batch.record.continuations_by_round) == int(branch.sum())
    if policy.predicts_prefixes:
        assert batch.predicted.size > 72 + forest.prefix_anchors().size  # later rounds were predicted too


def test_pilot_commit_runs_in_the_simulator_and_its_committed_groups_mix():
    """Default band (mixed pilots): every committed group is mixed, since its pilot already was; the step
    spends the budget exactly, and the prompts not committed keep their pilot of 2."""
    policy, budget = get_policy("pilot_commit"), RolloutBudget(192)
    batch = sample_batch(MODEL, policy, budget, OraclePredictor(), pool=64, rng=np.random.default_rng(5))
    forest, record = batch.sampled.forest, batch.record
    assert batch.rollouts == 192 and record.rounds == 2 and record.committed.size > 0
    ids, mixed = mixed_groups(forest.prompt[forest.leaves], forest.reward[forest.leaves])
    assert mixed[np.searchsorted(ids, record.committed)].all()
    assert (record.groups[record.committed] >= policy.group_size).all()
    others = np.setdiff1d(np.flatnonzero(record.groups), record.committed)
    assert (record.groups[others] == policy.pilot).all() and others.size + record.committed.size == 48
    assert batch.trained is batch.sampled  # every group is trained on


def test_arm_settings_may_be_tuples():
    arm = Arm.parse("pilot_commit{pilot=4,pilot_band=(0.2, 0.8)}[oracle]")
    assert arm.settings == (("pilot", 4), ("pilot_band", (0.2, 0.8)))
    assert arm.allocation_policy(group_size=8) == get_policy("pilot_commit", pilot=4, pilot_band=(0.2, 0.8))
    assert Arm.parse(arm.label) == arm
