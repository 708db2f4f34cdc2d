"""Advantage estimators on rollout forests, one per node, for the turn that created the node.

Every estimator has the signature ``estimator(forest, *, eps=1e-6) -> ndarray`` (one float per node,
0 for roots) and is registered in ``ADVANTAGES`` by name. The trainer broadcasts a node's advantage to
the model tokens of the turn parent -> node; a turn shared by several rollouts appears once, with one
advantage (how it is weighted in the loss is the trainer's documented choice).

Notation: V(y) is the leaf-weighted value (mean leaf reward under y), mu_p and sigma_p the mean and
sample standard deviation (ddof = 1) of the leaf rewards of prompt p, n_y the number of leaves under y.

===============  ===========================================================================  ==========
name             advantage of node y (parent x, root o)                                       reference
===============  ===========================================================================  ==========
``grpo``         (V(y) - mu_p) / (sigma_p + eps): the mean over y's leaves of the flat GRPO   verl, TRL
                 leaf advantage (r - mu_p) / (sigma_p + eps)
``local``        V(y) - V(x)                                                                  --
``treerl``       [(V(y) - V(o)) + (V(y) - V(x))] / sqrt(n_y)                                 TreeRL
``treepo``       mean over y's leaves l of [mean over ancestors a of l of (r_l - V(a))],      TreePO
                 divided by (sigma_p + eps)
``trace``        grpo(y) + [x branched] (V(y) - V(x)) / (sigma_x + eps), sigma_x the sample   ours
                 std of the leaf rewards under x; "x branched": x is not a root and has more
                 than one child, i.e. y's siblings are contrasting continuations of one prefix
===============  ===========================================================================  ==========

On a forest without branching every non-root node has exactly one leaf below it, so ``grpo`` is
exactly the GRPO advantage of verl and TRL, and ``trace`` equals ``grpo``. A prompt with a single leaf
(or with sigma_p = 0) gets advantage 0: there is nothing to contrast it with. (verl instead uses mean 0
and std 1 for a group of one, passing the raw reward through.)
"""

from __future__ import annotations

import numpy as np

from ._registry import Registry
from .forest import RolloutForest
from .targets import node_values

__all__ = ["ADVANTAGES", "compute_advantages"]

ADVANTAGES: Registry = Registry("advantage estimator")


def compute_advantages(forest: RolloutForest, estimator: str = "trace", *, eps: float = 1e-6) -> np.ndarray:
    """Advantage per node with the registered ``estimator``.

    Examples
    --------
    Flat groups: GRPO's (r - mean) / (std + eps) with the sample standard deviation.

    >>> f = RolloutForest.from_nested([[1, 0, 0, 0]])
    >>> compute_advantages(f, "grpo").round(4).tolist()
    [0.0, 1.5, -0.5, -0.5, -0.5]
    """
    if not isinstance(forest, RolloutForest):
        raise ValueError(f"`forest` must be a RolloutForest, got {type(forest).__name__}")
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"`eps` must be a finite non-negative number, got {eps!r}")
    return ADVANTAGES[estimator](forest, eps=eps)


def _prompt_moments(forest: RolloutForest) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per tree (dense index): leaf count, mean and sample std (ddof = 1) of leaf rewards."""
    tree = forest.tree_index[forest.leaves]
    r = forest.reward[forest.leaves]
    n = np.bincount(tree, minlength=forest.n_prompts).astype(float)
    mean = np.bincount(tree, weights=r, minlength=forest.n_prompts) / np.maximum(n, 1.0)
    sq = np.bincount(tree, weights=(r - mean[tree]) ** 2, minlength=forest.n_prompts)
    std = np.sqrt(sq / np.maximum(n - 1.0, 1.0))
    return n, mean, std


def _subtree_std(forest: RolloutForest, value: np.ndarray) -> np.ndarray:
    """Sample std (ddof = 1) of the leaf rewards under every node (0 under a single leaf).

    Sums of squared deviations are merged bottom-up (Chan et al.'s pairwise update),
    M2(x) = sum over children c of [M2(c) + n_c (V(c) - V(x))^2], which stays accurate when the
    spread is tiny next to the rewards themselves (E[r^2] - E[r]^2 would cancel).
    """
    n_y = forest.leaf_count.astype(float)
    m2 = np.zeros(len(forest))
    for level in list(forest.iter_levels(bottom_up=True))[:-1]:
        p = forest.parent[level]
        m2 += np.bincount(p, weights=m2[level] + n_y[level] * (value[level] - value[p]) ** 2, minlength=len(forest))
    return np.sqrt(m2 / np.maximum(n_y - 1.0, 1.0))


def _normalise(num: np.ndarray, std: np.ndarray, spread: np.ndarray, eps: float) -> np.ndarray:
    """num / (std + eps) where the group has a spread, else 0 (nothing to contrast)."""
    out = np.zeros(np.broadcast(num, std).shape)
    np.divide(num, std + eps, out=out, where=np.broadcast_to(spread & (std > 0), out.shape))
    return out


@ADVANTAGES.register("grpo")
def _grpo(forest: RolloutForest, *, eps: float) -> np.ndarray:
    n, mean, std = _prompt_moments(forest)
    tree = forest.tree_index
    value = node_values(forest, "leaf_weighted")
    spread = forest.mixed[forest.roots][tree]
    adv = _normalise(value - mean[tree], std[tree], spread, eps)
    adv[forest.parent == -1] = 0.0
    return adv


@ADVANTAGES.register("local")
def _local(forest: RolloutForest, *, eps: float) -> np.ndarray:
    value = node_values(forest, "leaf_weighted")
    adv = np.zeros(len(forest))
    nonroot = forest.parent != -1
    adv[nonroot] = value[nonroot] - value[forest.parent[nonroot]]
    return adv


@ADVANTAGES.register("treerl")
def _treerl(forest: RolloutForest, *, eps: float) -> np.ndarray:
    value = node_values(forest, "leaf_weighted")
    nonroot = forest.parent != -1
    adv = np.zeros(len(forest))
    y = np.flatnonzero(nonroot)
    glob = value[y] - value[forest.root_of[y]]
    loc = value[y] - value[forest.parent[y]]
    adv[y] = (glob + loc) / np.sqrt(forest.leaf_count[y])
    return adv


@ADVANTAGES.register("treepo")
def _treepo(forest: RolloutForest, *, eps: float) -> np.ndarray:
    value = node_values(forest, "leaf_weighted")
    n = len(forest)
    # For every node: sum and count of V over its ancestors (root included, itself excluded).
    anc_sum, anc_cnt = np.zeros(n), np.zeros(n)
    for level in list(forest.iter_levels())[1:]:
        p = forest.parent[level]
        anc_sum[level] = anc_sum[p] + value[p]
        anc_cnt[level] = anc_cnt[p] + 1.0
    leaf_adv = np.zeros(n)
    leaves = forest.leaves
    leaf_adv[leaves] = forest.reward[leaves] - anc_sum[leaves] / anc_cnt[leaves]
    mean_over_leaves = forest.subtree_sum(leaf_adv) / np.maximum(forest.leaf_count, 1)
    _, _, std = _prompt_moments(forest)
    spread = forest.mixed[forest.roots][forest.tree_index]
    adv = _normalise(mean_over_leaves, std[forest.tree_index], spread, eps)
    adv[forest.parent == -1] = 0.0
    return adv


@ADVANTAGES.register("trace")
def _trace(forest: RolloutForest, *, eps: float) -> np.ndarray:
    adv = _grpo(forest, eps=eps)
    value = node_values(forest, "leaf_weighted")
    y = np.flatnonzero(forest.parent != -1)
    x = forest.parent[y]
    branched = (forest.parent[x] != -1) & (forest.n_children[x] > 1)
    y, x = y[branched], x[branched]
    std_x = _subtree_std(forest, value)[x]
    adv[y] += _normalise(value[y] - value[x], std_x, forest.mixed[x], eps)
    return adv
