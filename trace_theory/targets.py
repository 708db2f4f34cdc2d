"""Recursive node values: the targets a success-probability predictor is fitted to.

Each method returns a value per node (an estimate of V(y) = P(R = 1 | y)) and a weight per node (how
many observations back it). Notation: n_y leaves under y; r_f(y) the reward at the end of y's own
rollout (follow first children; see ``RolloutForest.factual_leaf``); the *branches* of y are its
children after the first (continuations sampled from y after its own rollout was seen).

=================  =================================================  ================  ==============
method             value                                              weight            unbiased?
=================  =================================================  ================  ==============
``leaf_weighted``  (1/n_y) sum_c n_c V(c): the mean leaf reward        n_y               no (see below)
                   under y (PAPER.md, "Predictor update")
``child_mean``     (1/|children|) sum_c V(c): each child counts once  number of         no
                                                                      children
``factual``        r_f(y): the reward of y's own rollout              1                 yes
``own_branches``   (r_f(y) + sum over branches b of r_f(b)) / (1+k)   1 + k (k branches) as a weighted
                                                                                        LS target
=================  =================================================  ================  ==============

Roots have no single own rollout: for ``factual`` and ``own_branches`` a root's value is the mean of
r_f over its children (one per rollout sampled at the root; how many is decided before any outcome).

**Why the paper's target is biased.** TRACE branches from a prefix more when its factual outcome looks
surprising, so the number of leaves under y depends on the outcome of y's own rollout, and leaves from
deeper anchors z are chosen by predictions at z. The mean leaf reward then no longer estimates V(y).
Example: V(y) = 0.5, and y gets two continuations only when its own rollout failed. After a success the
leaf mean is 1; after a failure it is (0 + c1 + c2) / 3, 1/3 in expectation; so E[leaf mean] = 2/3,
not 1/2. (``tests`` checks this by enumeration; the simulator measures it on realistic trees.)

**Why the alternatives are not.** r_f(y) ignores branching altogether, so E[r_f(y) | y] = V(y). For
``own_branches``, given y the branches are fresh draws independent of y's own rollout, and their number
k depends only on that rollout, so E[(1 + k)(target - V(y)) | y] = 0: fitting the predictor by
least squares with these weights has an unbiased estimating equation (the per-observation loss over
y's own rollout and its branches, summed), with lower variance than ``factual``. As a point estimate
it is still biased, which is why its weight matters.
"""

from __future__ import annotations

import numpy as np

from ._registry import Registry
from .forest import RolloutForest

__all__ = ["VALUE_METHODS", "node_values", "node_targets", "root_outcomes"]

VALUE_METHODS: Registry = Registry("value method")


def node_values(forest: RolloutForest, method: str = "leaf_weighted") -> np.ndarray:
    """Value estimate V^(y) for every node; see the module table for the methods.

    Examples
    --------
    One prompt: a success, and a rollout whose first turn branched into a failure and a success.

    >>> f = RolloutForest.from_nested([[1, [0, 1]]])
    >>> node_values(f).round(3).tolist()  # leaf-weighted: mean leaf reward below each node
    [0.667, 1.0, 0.5, 0.0, 1.0]
    >>> node_values(f, "factual").tolist()  # node 2's own rollout ended with 0
    [0.5, 1.0, 0.0, 0.0, 1.0]
    """
    return node_targets(forest, method)[0]


def node_targets(forest: RolloutForest, method: str = "leaf_weighted") -> tuple[np.ndarray, np.ndarray]:
    """(values, weights) per node: regression targets for a predictor and their sample weights."""
    if not isinstance(forest, RolloutForest):
        raise ValueError(f"`forest` must be a RolloutForest, got {type(forest).__name__}")
    return VALUE_METHODS[method](forest)


def _leaf_rewards(forest: RolloutForest) -> np.ndarray:
    return np.where(forest.is_leaf, forest.reward, 0.0)


@VALUE_METHODS.register("leaf_weighted")
def _leaf_weighted(forest: RolloutForest):
    n_y = forest.leaf_count.astype(float)
    return forest.subtree_sum(_leaf_rewards(forest)) / np.maximum(n_y, 1.0), n_y


@VALUE_METHODS.register("child_mean")
def _child_mean(forest: RolloutForest):
    n = len(forest)
    value = np.where(forest.is_leaf, forest.reward, 0.0)
    acc = np.zeros(n)
    n_children = forest.n_children
    for level in forest.iter_levels(bottom_up=True):
        internal = level[~forest.is_leaf[level]]
        value[internal] = acc[internal] / n_children[internal]
        nonroot = level[forest.parent[level] != -1]
        acc += np.bincount(forest.parent[nonroot], weights=value[nonroot], minlength=n)
    return value, np.where(forest.is_leaf, 1.0, n_children.astype(float))


def _factual_rewards(forest: RolloutForest) -> np.ndarray:
    """r_f(y) for non-root nodes (NaN for roots)."""
    out = np.full(len(forest), np.nan)
    nonroot = forest.parent != -1
    out[nonroot] = forest.reward[forest.factual_leaf[nonroot]]
    return out


def _root_mean_of_children(forest: RolloutForest, per_node: np.ndarray, value: np.ndarray, weight: np.ndarray):
    """Set each root's value to the mean of ``per_node`` over its children; weight = their number."""
    nonroot = np.flatnonzero(forest.parent != -1)
    kids = nonroot[forest.parent[forest.parent[nonroot]] == -1]  # nodes whose parent is a root
    roots = forest.roots
    sums = np.bincount(forest.parent[kids], weights=per_node[kids], minlength=len(forest))
    counts = np.bincount(forest.parent[kids], minlength=len(forest))
    value[roots] = sums[roots] / counts[roots]
    weight[roots] = counts[roots]


@VALUE_METHODS.register("factual")
def _factual(forest: RolloutForest):
    value = _factual_rewards(forest)
    weight = np.ones(len(forest))
    _root_mean_of_children(forest, value, value, weight)
    return value, weight


@VALUE_METHODS.register("own_branches")
def _own_branches(forest: RolloutForest):
    r_f = _factual_rewards(forest)
    n = len(forest)
    parent = forest.parent
    nonroot = np.flatnonzero(parent != -1)
    # Branches: children of non-root nodes that start a rollout (every child but the first).
    branch = nonroot[(parent[parent[nonroot]] != -1) & forest.starts_rollout[nonroot]]
    k = np.bincount(parent[branch], minlength=n).astype(float)
    sums = np.bincount(parent[branch], weights=r_f[branch], minlength=n)
    value = (np.nan_to_num(r_f) + sums) / (1.0 + k)
    weight = 1.0 + k
    _root_mean_of_children(forest, r_f, value, weight)
    return value, weight


def root_outcomes(forest: RolloutForest) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each root with the number m of rollouts sampled at it and the successes s among their rewards.

    Returns ``(roots, m, s)``: node ids of the roots, m_i = |{c : parent(c) = root_i}| and
    s_i = sum over those children c of r_f(c), the factual reward of c's own rollout. A rollout sampled at
    the root is drawn before any outcome is seen, so given V_0 its reward is a fresh Bernoulli(V_0) draw
    whatever branching happened below it later: (s_i, m_i - s_i) update a Beta posterior of V_0 and
    s_i (s_i - 1) / (m_i (m_i - 1)) is an unbiased estimate of V_0^2.

    Examples
    --------
    >>> from trace_theory import ForestBuilder, Origin
    >>> b = ForestBuilder()
    >>> root = b.add_root(prompt=0)
    >>> for reward in (1.0, 0.0):
    ...     b.finish(b.add_turn(root), reward)
    >>> turn = b.add_turn(root)
    >>> b.finish(b.add_turn(turn), 1.0)
    >>> b.finish(b.add_turn(turn, origin=Origin.CONTINUATION), 1.0)  # a branch: not sampled at the root
    >>> roots, m, s = root_outcomes(b.build())
    >>> m.tolist(), s.tolist()
    ([3.0], [2.0])
    """
    first_turns = np.flatnonzero(forest.parent != -1)
    first_turns = first_turns[forest.parent[forest.parent[first_turns]] == -1]
    reward = forest.reward[forest.factual_leaf[first_turns]]
    tree = forest.tree_index[first_turns]
    m = np.bincount(tree, minlength=forest.n_prompts).astype(float)
    s = np.bincount(tree, weights=reward, minlength=forest.n_prompts)
    return forest.roots, m, s
