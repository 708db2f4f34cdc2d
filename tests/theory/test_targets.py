"""Value targets: exact expectations over every outcome of tiny Bernoulli trees."""

import itertools

import numpy as np
import pytest
from hypothesis import given

from trace_theory import VALUE_METHODS, RolloutForest, node_targets, node_values

from .strategies import forests


def anchor_outcomes(v_y, branches):
    """All outcomes of: root -> y -> factual leaf r ~ Bern(v_y), plus branches(r) continuation leaves.

    Yields (probability, forest) with y = node 1.
    """
    for r in (0, 1):
        k = branches[r]
        for conts in itertools.product((0, 1), repeat=k):
            p = (v_y if r else 1 - v_y) * np.prod([v_y if c else 1 - v_y for c in conts])
            yield p, RolloutForest.from_nested([[[r, *conts]]])


@pytest.mark.parametrize("v_y", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("branches", [(2, 0), (0, 3), (1, 2), (2, 2)])
def test_exact_bias_of_each_target_at_a_branched_prefix(v_y, branches):
    expectation = {}
    weighted_error = {}
    for method in VALUE_METHODS:
        e, we = 0.0, 0.0
        for p, f in anchor_outcomes(v_y, branches):
            value, weight = node_targets(f, method)
            e += p * value[1]
            we += p * weight[1] * (value[1] - v_y)
        expectation[method], weighted_error[method] = e, we
    # The reward of the prefix's own rollout is an unbiased point estimate, whatever the branching.
    assert expectation["factual"] == pytest.approx(v_y, abs=1e-12)
    # Own branches: the weighted least-squares estimating equation is unbiased.
    assert weighted_error["own_branches"] == pytest.approx(0.0, abs=1e-12)
    outcome_dependent = branches[0] != branches[1]
    if outcome_dependent:
        # The paper's leaf-weighted target is biased when branching depends on the factual outcome.
        assert abs(expectation["leaf_weighted"] - v_y) > 1e-3
    else:
        assert expectation["leaf_weighted"] == pytest.approx(v_y, abs=1e-12)


def test_documented_example_of_the_bias():
    # V(y) = 0.5, two continuations only after a failure: E[leaf mean] = 2/3 (targets module docstring).
    e = sum(p * node_values(f)[1] for p, f in anchor_outcomes(0.5, (2, 0)))
    assert e == pytest.approx(2 / 3)


def test_root_targets_average_the_rollouts_sampled_at_the_root():
    f = RolloutForest.from_nested([[1, [0, 1, 1], 0]])
    assert node_values(f, "factual")[0] == pytest.approx(1 / 3)  # rollouts ended 1, 0, 0
    values, weights = node_targets(f, "own_branches")
    assert values[0] == pytest.approx(1 / 3) and weights[0] == 3
    assert values[2] == pytest.approx((0 + 1 + 1) / 3) and weights[2] == 3  # own rollout + 2 branches
    assert node_values(f, "child_mean")[0] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert node_values(f, "leaf_weighted")[0] == pytest.approx(3 / 5)


def naive_leaf_mean(f, i):
    leaves = f.leaves_under(i)
    return f.reward[leaves].mean()


def naive_child_mean(f, i):
    if f.is_leaf[i]:
        return f.reward[i]
    return np.mean([naive_child_mean(f, c) for c in f.children(i)])


@given(forests())
def test_vectorised_values_equal_recursive_definitions(f):
    lw, lw_w = node_targets(f, "leaf_weighted")
    cm, cm_w = node_targets(f, "child_mean")
    for i in range(len(f)):
        assert lw[i] == pytest.approx(naive_leaf_mean(f, i))
        assert lw_w[i] == len(f.leaves_under(i))
        assert cm[i] == pytest.approx(naive_child_mean(f, i))
    # Leaves carry their reward under every method.
    for method in VALUE_METHODS:
        values, weights = node_targets(f, method)
        assert np.allclose(values[f.is_leaf], f.reward[f.is_leaf])
        assert np.all(weights > 0) and np.all(np.isfinite(values))


def test_unknown_method_and_wrong_type():
    f = RolloutForest.from_nested([[1, 0]])
    with pytest.raises(ValueError, match=r"unknown value method 'mean'; known: child_mean, factual, leaf_weighted, own_branches"):
        node_values(f, "mean")
    with pytest.raises(ValueError, match=r"`forest` must be a RolloutForest, got list"):
        node_values([[1, 0]])


@given(forests())
def test_root_outcomes_count_the_rollouts_sampled_at_each_root(forest):
    """Against a loop: m = children of the root, s = the factual rewards of their own rollouts."""
    from trace_theory import root_outcomes

    roots, m, s = root_outcomes(forest)
    assert roots.tolist() == forest.roots.tolist()
    for i, root in enumerate(forest.roots.tolist()):
        children = [c for c in range(len(forest)) if forest.parent[c] == root]
        assert m[i] == len(children)
        assert s[i] == pytest.approx(sum(forest.reward[forest.factual_leaf[c]] for c in children))
