"""Every registered allocation policy, through the one shared signature (parametrised over the registry)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_theory import POLICIES, RolloutBudget, get_policy, root_utility, top_up_roots
from trace_theory.policies import AllocationPolicy

from .strategies import priced_probabilities, probability_arrays, tie_free_probabilities

ALL = POLICIES.names()
BRANCHING = [name for name in ALL if get_policy(name).branches]
KAPPA = 4.0


def roots(policy, v, budget, seed=0):
    return policy.allocate_roots(v, budget, rng=np.random.default_rng(seed), concentration=np.full(len(v), KAPPA))


@pytest.mark.parametrize("name", ALL)
@given(st.integers(0, 50), st.integers(0, 6))
def test_split_spends_the_whole_budget(name, m, n):
    policy = get_policy(name)
    budget = RolloutBudget(m, n)
    root_budget, per_root = policy.split(budget)
    assert root_budget * (1 + per_root) == budget.total
    assert per_root == (n if policy.branches else 0)


@pytest.mark.parametrize("name", ALL)
@given(probability_arrays(min_size=1, max_size=10), st.integers(0, 40), st.randoms(use_true_random=False))
def test_root_allocation_properties(name, v, budget, random):
    policy = get_policy(name)
    try:
        m = roots(policy, v, budget)
    except ValueError as err:
        assert "cannot be split" in str(err)
        return
    assert m.dtype == np.int64 and m.shape == v.shape and m.sum() == budget
    assert np.all((m == 0) | (m >= policy.min_group))
    assert roots(policy, v, budget).tolist() == m.tolist()  # deterministic
    perm = np.arange(len(v))
    random.shuffle(perm)
    shuffled = roots(policy, v[perm], budget)
    if policy.root_rule == "active":
        # Equal-value optima may differ (exact ties), so the order of the pool may change the answer
        # but never its value.
        kappa = np.full(len(v), KAPPA) if policy.posterior else None
        assert root_utility(v[perm], shuffled, concentration=kappa) == pytest.approx(
            root_utility(v, m, concentration=kappa), abs=1e-9
        )
    else:
        # Uniform counts: the multiset of group sizes does not depend on the order of the pool.
        assert sorted(shuffled.tolist()) == sorted(m.tolist())
    if budget == 0:
        assert not m.any()


@pytest.mark.parametrize("name", [n for n in ALL if get_policy(n).predicts_roots])
@given(tie_free_probabilities(), st.integers(2, 40), st.randoms(use_true_random=False))
def test_value_based_roots_are_permutation_equivariant_without_ties(name, v, budget, random):
    policy = get_policy(name)
    perm = np.arange(len(v))
    random.shuffle(perm)
    m = roots(policy, v, budget)
    assert roots(policy, v[perm], budget).tolist() == m[perm].tolist()


def test_uniform_and_pcl_roots():
    v = np.array([0.0, 0.45, 0.9, 0.5, 1.0, 0.3])
    assert get_policy("grpo").allocate_roots(v, 16).tolist() == [8, 8, 0, 0, 0, 0]
    assert get_policy("grpo").allocate_roots(v, 19).tolist() == [10, 9, 0, 0, 0, 0]  # 2 groups: 19 / 8 ~ 2
    assert get_policy("grpo").allocate_roots(v, 23).tolist() == [8, 8, 7, 0, 0, 0]  # 3 groups: 23 / 8 ~ 3
    assert get_policy("grpo", group_size=4).allocate_roots(v, 16).tolist() == [4, 4, 4, 4, 0, 0]
    assert get_policy("pcl").allocate_roots(v, 16).tolist() == [0, 8, 0, 8, 0, 0]  # nearest 0.5 first
    assert get_policy("grpo", max_group=3).allocate_roots(v, 16).tolist() == [3, 3, 3, 3, 2, 2]


anchor_cases = st.integers(0, 8).flatmap(
    lambda n: st.tuples(
        probability_arrays(min_size=n, max_size=n),
        st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n).map(np.array),
        st.lists(st.integers(0, 3), min_size=n, max_size=n).map(lambda x: np.array(x, dtype=np.int64)),
        st.lists(st.integers(0, 9), min_size=4, max_size=4).map(np.array),
        st.one_of(st.none(), st.integers(0, 3)),
    )
)


@pytest.mark.parametrize("name", BRANCHING)
@given(anchor_cases)
def test_prefix_allocation_properties(name, case):
    v, r, prompt, budget, cap = case
    policy = get_policy(name, max_per_anchor=cap)
    out = policy.allocate_prefixes(v, r, prompt, budget, rng=np.random.default_rng(1))
    assert out.k.dtype == np.int64 and np.all(out.k >= 0) and np.all(out.unspent >= 0)
    assert cap is None or np.all(out.k <= cap)
    # Conservation: what is not placed is reported, and nothing is placed twice.
    assert out.k.sum() + out.unspent.sum() == budget.sum()
    # Budget is left over only when no anchor anywhere has room for it.
    room = 0 if len(v) == 0 else np.inf if cap is None else len(v) * cap
    assert out.unspent.sum() == max(0, budget.sum() - room)
    again = policy.allocate_prefixes(v, r, prompt, budget, rng=np.random.default_rng(1))
    assert again.k.tolist() == out.k.tolist()
    if budget.sum() == 0:
        assert not out.k.any()


@pytest.mark.parametrize("name", BRANCHING)
def test_prefix_budget_moves_to_prompts_with_anchors(name):
    policy = get_policy(name)
    # Prompt 1 has no anchors: its budget of 5 goes to prompt 0's anchors.
    out = policy.allocate_prefixes([0.5, 0.7], [1, 0], [0, 0], [3, 5], rng=np.random.default_rng(0))
    assert out.k.sum() == 8 and out.unspent.tolist() == [0, 0]


def test_active_prefix_pooling_continues_from_placed_counts():
    # One anchor per prompt, prompt 2 has none. Its 2 units go where the *next* gain is largest:
    # anchor 0 (q = 0.1) already holds 1 unit, so its next gain is 0.1 * 0.9 = 0.09, while anchor 1
    # (q = 0.5) with 1 unit gains 0.25 next, then 0.125.
    out = get_policy("trace").allocate_prefixes([0.9, 0.5], [0, 1], [0, 1], [1, 1, 2])
    assert out.k.tolist() == [1, 3]


def test_random_prefix_needs_a_generator_and_uses_it():
    policy = get_policy("random_prefix")
    with pytest.raises(ValueError, match=r"policy 'random_prefix' is randomised: pass `rng`"):
        policy.allocate_prefixes([0.5], [1], [0], [1])
    draws = {tuple(policy.allocate_prefixes(np.full(6, 0.5), np.ones(6), np.zeros(6, int), [2],
                                            rng=np.random.default_rng(s)).k) for s in range(20)}
    assert len(draws) > 5  # different anchors for different seeds


def test_uniform_prefix_spreads_evenly():
    out = get_policy("uniform_tree").allocate_prefixes(np.full(3, 0.5), np.ones(3), [0, 0, 0], [7])
    assert out.k.tolist() == [3, 2, 2]


def test_top_up_roots():
    assert top_up_roots([2, 0, 2], 3).tolist() == [4, 0, 3]
    with pytest.raises(ValueError, match=r"`m` has no active group to add rollouts to"):
        top_up_roots([0, 0], 1)


def test_registry_and_policy_errors():
    with pytest.raises(ValueError, match=r"unknown allocation policy 'tracee'; known: .*trace"):
        get_policy("tracee")
    with pytest.raises(ValueError, match=r"policy 'grpo' does not branch from prefixes"):
        get_policy("grpo").allocate_prefixes([0.5], [1], [0], [1])
    with pytest.raises(ValueError, match=r"policy 'trace_beta' uses the Beta-posterior utility: pass `concentration`"):
        get_policy("trace_beta").allocate_roots([0.5], 2)
    with pytest.raises(ValueError, match=r"`root_rule` must be one of"):
        AllocationPolicy("x", "best")
    with pytest.raises(ValueError, match=r"`max_group` \(1\) must be at least `min_group` \(2\)"):
        get_policy("grpo", max_group=1)
    with pytest.raises(ValueError, match=r"dynamic sampling is defined for uniform roots without branching"):
        get_policy("trace", dynamic_sampling=True)
    with pytest.raises(ValueError, match=r"`roots` must be a non-negative integer, got -1"):
        RolloutBudget(-1, 2)
    assert RolloutBudget(512, 2).total == 1536


def test_registry_rejects_duplicates_and_bad_prefix_rules():
    from trace_theory._registry import Registry

    reg = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(ValueError, match=r"thing 'a' is already registered"):
        reg.add("a", 2)
    assert "a" in reg and reg.check("a") == "a" and list(reg) == ["a"]
    with pytest.raises(ValueError, match=r"`prefix_rule` must be one of \(None, 'uniform', 'random', 'active'\), got 'all'"):
        AllocationPolicy("x", "uniform", "all")


def test_a_policy_says_what_it_needs():
    needs = {name: (p.predicts_roots, p.predicts_prefixes, p.branches_on_outcomes, p.posterior, p.dynamic_sampling)
             for name, p in ((n, get_policy(n)) for n in ALL)}
    assert needs["grpo"] == needs["uniform_tree"] == needs["random_prefix"] == (False,) * 5
    assert needs["pcl"] == needs["root_only"] == needs["active_root_uniform_prefix"] == (True, False, False, False, False)
    assert needs["prefix_only"] == (False, True, True, False, False) and needs["trace"] == (True, True, True, False, False)
    assert needs["trace_beta"] == (True, True, True, True, False) and needs["dapo"] == (False,) * 4 + (True,)
    assert [n for n in ALL if get_policy(n).needs_predictor] == [
        "pcl", "root_only", "active_root_uniform_prefix", "prefix_only", "trace", "trace_beta", "trace_tokens"]
    assert not get_policy("random_prefix").deterministic and get_policy("trace").deterministic
    assert [n for n in ALL if get_policy(n).priced_in_tokens] == ["trace_tokens"]
    assert needs["trace_tokens"] == needs["trace"]


@pytest.mark.parametrize("name", ALL)
@given(priced_probabilities(1, 8), st.integers(0, 40), st.data())
def test_cost_is_read_by_token_priced_policies_only(name, vc, budget, data):
    """A rollout-priced policy ignores ``cost`` bit for bit; a token-priced one spends within the budget."""
    policy, (v, c) = get_policy(name), vc
    try:
        m = roots(policy, v, budget)
    except ValueError as err:
        assert "cannot be split" in str(err)
        return
    priced = policy.allocate_roots(v, budget, rng=np.random.default_rng(0), concentration=np.full(len(v), KAPPA),
                                   cost=c)
    if not policy.priced_in_tokens:
        assert priced.tolist() == m.tolist()
    else:
        assert np.dot(priced, c) <= budget * (1 + 1e-9) + 1e-9 and np.all((priced == 0) | (priced >= policy.min_group))
    if not policy.branches:
        return
    n = len(v)
    r = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)))
    prompt = np.array(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    b = np.array(data.draw(st.lists(st.integers(0, 6), min_size=3, max_size=3)))
    plain = policy.allocate_prefixes(v, r, prompt, b, rng=np.random.default_rng(1))
    out = policy.allocate_prefixes(v, r, prompt, b, rng=np.random.default_rng(1), cost=c)
    if not policy.priced_in_tokens:
        assert out.k.tolist() == plain.k.tolist() and out.unspent.tolist() == plain.unspent.tolist()
    else:  # leftovers are pooled across prompts, so the spend is bounded in total
        assert np.dot(out.k, c) <= b.sum() - out.unspent.sum() + 1e-9 * (1 + b.sum())


def test_token_pricing_needs_priced_rules():
    with pytest.raises(ValueError, match="`price` must be one of \\('rollouts', 'tokens'\\), got 'turns'"):
        get_policy("trace", price="turns")
    with pytest.raises(ValueError, match="needs rules that read `cost`"):
        get_policy("grpo", price="tokens")
    with pytest.raises(ValueError, match="needs rules that read `cost`"):
        get_policy("trace_beta", price="tokens")
    assert get_policy("root_only", price="tokens").priced_in_tokens


def test_a_new_policy_is_one_registration_away():
    """Rules are registered functions; a policy built from registered rule names runs everywhere."""
    from trace_theory.policies import PREFIX_RULES, ROOT_RULES

    assert list(ROOT_RULES) == ["uniform", "pcl", "active"] and list(PREFIX_RULES) == ["uniform", "random", "active"]
    policy = AllocationPolicy("pcl_tree", "pcl", "active")
    m = policy.allocate_roots([0.1, 0.5, 0.9, 0.45], 16)
    assert m.tolist() == [0, 8, 0, 8]
    out = policy.allocate_prefixes([0.9, 0.5], [0, 1], [0, 1], [2, 2])
    assert out.k.sum() == 4 and policy.needs_predictor


def test_dapo_target_is_half_the_groups_the_budget_pays_for_unless_set():
    assert get_policy("dapo").dynamic_target(256) == 16 and get_policy("dapo").dynamic_target(8) == 1
    assert get_policy("dapo", dapo_target=5).dynamic_target(256) == 5
    with pytest.raises(ValueError, match=r"`dapo_target` is a setting of dynamic sampling; policy 'trace' has none"):
        get_policy("trace", dapo_target=4)
    with pytest.raises(ValueError, match=r"`dapo_target` must be at least 1, got 0"):
        get_policy("dapo", dapo_target=0)
