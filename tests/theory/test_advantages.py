"""Advantage estimators, parametrised over the registry, plus exact reference implementations."""

import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_theory import ADVANTAGES, RolloutForest, compute_advantages

from .strategies import forests

ALL = ADVANTAGES.names()


def shifted(f: RolloutForest, c: float, scale: float = 1.0) -> RolloutForest:
    return RolloutForest(f.parent, f.prompt, f.depth, f.reward * scale + c, f.is_leaf, f.origin, f.cost, binary_rewards=False)


@pytest.mark.parametrize("name", ALL)
@given(forests())
def test_shape_roots_and_finiteness(name, f):
    adv = compute_advantages(f, name)
    assert adv.shape == (len(f),) and np.all(np.isfinite(adv))
    assert np.all(adv[f.parent == -1] == 0.0)


@pytest.mark.parametrize("name", ALL)
@given(forests(), st.sampled_from([0.0, 1.0]))
def test_all_equal_rewards_give_zero_advantages(name, f, r):
    same = RolloutForest(f.parent, f.prompt, f.depth, np.where(f.is_leaf, r, np.nan), f.is_leaf, f.origin, f.cost)
    assert np.all(compute_advantages(same, name) == 0.0)


@pytest.mark.parametrize("name", ALL)
@given(forests(binary=False), st.floats(-10, 10))
def test_shift_invariance(name, f, c):
    assert np.allclose(compute_advantages(shifted(f, c), name), compute_advantages(f, name), atol=1e-9)


@pytest.mark.parametrize("name", ["grpo", "treepo", "trace"])
@given(forests(binary=False), st.floats(0.1, 10))
def test_normalised_estimators_are_scale_invariant(name, f, scale):
    # With eps = 0 the normalised estimators do not change when rewards are rescaled.
    a = compute_advantages(shifted(f, 0.0, scale), name, eps=0.0)
    b = compute_advantages(f, name, eps=0.0)
    assert np.allclose(a, b, atol=1e-7)


def flat_forest(groups):
    return RolloutForest.from_nested([[*g] for g in groups])


def verl_grpo(groups, eps=1e-6):
    """GRPO as verl and TRL compute it: (r - group mean) / (group sample std + eps)."""
    out = []
    for g in groups:
        if len(g) == 1:
            out.append(0.0)  # documented deviation: a group of one has nothing to contrast with
            continue
        mean, std = statistics.fmean(g), statistics.stdev(g)
        out.extend((r - mean) / (std + eps) for r in g)
    return out


@given(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=8), min_size=1, max_size=5))
def test_grpo_and_trace_equal_standard_grpo_without_branching(groups):
    f = flat_forest(groups)
    expected = verl_grpo(groups)
    for name in ("grpo", "trace"):
        adv = compute_advantages(f, name)
        assert np.allclose(adv[f.parent != -1], expected, atol=1e-12)


def test_branching_examples_by_hand():
    # Root with a success and a two-turn rollout that branched at its first turn into 0 and 1.
    f = RolloutForest.from_nested([[1, [0, 1]]])  # nodes: 0 root, 1 leaf(1), 2 prefix, 3 leaf(0), 4 leaf(1)
    v = np.array([2 / 3, 1, 0.5, 0, 1])
    sigma = np.sqrt(1 / 3)  # sample std of (1, 0, 1)
    grpo = compute_advantages(f, "grpo", eps=0.0)
    assert np.allclose(grpo[1:], (v[1:] - 2 / 3) / sigma)
    local = compute_advantages(f, "local")
    assert np.allclose(local, [0, 1 / 3, -1 / 6, -0.5, 0.5])
    treerl = compute_advantages(f, "treerl")
    assert np.allclose(treerl, [0, 2 / 3, (-1 / 6 - 1 / 6) / np.sqrt(2), (-2 / 3 - 0.5), (1 / 3 + 0.5)])
    trace = compute_advantages(f, "trace", eps=0.0)
    sigma_prefix = np.sqrt(0.5)  # sample std of (0, 1) under node 2
    assert np.allclose(trace, grpo + np.array([0, 0, 0, -0.5 / sigma_prefix, 0.5 / sigma_prefix]))
    treepo = compute_advantages(f, "treepo", eps=0.0)
    leaf = {1: 1 - 2 / 3, 3: np.mean([0 - 2 / 3, 0 - 0.5]), 4: np.mean([1 - 2 / 3, 1 - 0.5])}
    expected = [0, leaf[1], (leaf[3] + leaf[4]) / 2, leaf[3], leaf[4]]
    assert np.allclose(treepo, np.array(expected) / sigma)


def test_a_prompt_with_one_leaf_gets_no_advantage():
    f = flat_forest([[1.0], [0.0, 1.0]])
    assert compute_advantages(f, "grpo")[1] == 0.0


def test_errors():
    f = flat_forest([[1.0, 0.0]])
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'gae'; known: grpo, local, trace, treepo, treerl"):
        compute_advantages(f, "gae")
    with pytest.raises(ValueError, match=r"`eps` must be a finite non-negative number, got -1"):
        compute_advantages(f, "grpo", eps=-1)
