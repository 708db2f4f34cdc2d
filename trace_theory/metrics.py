"""What a batch of rollout trees is worth: contrast metrics, budget accounting and calibration.

=========================  =====================================================================
``effective_ratio``        share of prompts whose leaves hold both a success and a failure (the
                           paper's headline number: 26.8% for GRPO, 60.6% for TRACE, math, 8B)
``mixed_anchor_ratio``     share of anchors (roots and branched prefixes) whose leaves are mixed
``contrast_pairs``         (success, failure) leaf pairs within a prompt, total or per lowest
                           common ancestor
``mixed_prompts``          number of prompts whose leaves are mixed
``contrast_yield``         mixed prompts and contrast pairs per 1,000 rollouts and per 1,000 tokens
                           spent: what a budget bought, which filtering prompts out cannot inflate
``budget_by_depth``        rollouts (or cost) by the depth of the anchor they were sampled from
``brier_score``            mean squared error of predicted success probabilities
``expected_calibration_error``  binned |mean prediction - mean outcome|, weighted by bin size
=========================  =====================================================================
"""

from __future__ import annotations

import numpy as np

from . import _checks
from .forest import RolloutForest

__all__ = [
    "effective_ratio",
    "mixed_prompts",
    "contrast_yield",
    "mixed_anchor_ratio",
    "contrast_pairs",
    "calibration_by_depth",
    "budget_by_depth",
    "brier_score",
    "expected_calibration_error",
]


def _check_forest(forest) -> RolloutForest:
    if not isinstance(forest, RolloutForest):
        raise ValueError(f"`forest` must be a RolloutForest, got {type(forest).__name__}")
    return forest


def effective_ratio(forest: RolloutForest) -> float:
    """Share of prompts whose leaves mix a success and a failure (NaN for an empty forest).

    Examples
    --------
    >>> effective_ratio(RolloutForest.from_nested([[1, 1], [0, 1], [[0, 1], 0], [0, 0]]))
    0.5
    """
    forest = _check_forest(forest)
    if forest.n_prompts == 0:
        return float("nan")
    return float(forest.mixed[forest.roots].mean())


def mixed_prompts(forest: RolloutForest) -> int:
    """Number of prompts whose leaves mix a success and a failure: ``effective_ratio`` times prompts.

    >>> mixed_prompts(RolloutForest.from_nested([[1, 1], [0, 1], [[0, 1], 0], [0, 0]]))
    2
    """
    forest = _check_forest(forest)
    return int(forest.mixed[forest.roots].sum())


def contrast_yield(forest: RolloutForest, *, rollouts=None, tokens=None) -> dict[str, float]:
    """Mixed prompts and contrast pairs per 1,000 rollouts and per 1,000 tokens spent.

    The effective ratio divides by the prompts that received rollouts, so a policy raises it by
    dropping prompts alone; these rates divide by what the batch cost instead:

        mixed_prompts_per_1k_rollouts = 1000 * mixed prompts / rollouts,
        mixed_prompts_per_1k_tokens   = 1000 * mixed prompts / tokens,

    and the same for ``contrast_pairs``. ``rollouts`` defaults to the forest's leaves, ``tokens`` to the
    sum of its node costs (generated tokens in the trainer, turns in the simulator); pass what was spent
    when the forest holds only part of it (DAPO trains on its mixed groups). A zero denominator gives NaN.

    >>> f = RolloutForest.from_nested([[1, [0, 1]], [0, 0]])  # 5 rollouts, 6 turns, 1 mixed prompt, 2 pairs
    >>> contrast_yield(f)["mixed_prompts_per_1k_rollouts"], contrast_yield(f)["contrast_pairs_per_1k_tokens"]
    (200.0, 333.3333333333333)
    """
    forest = _check_forest(forest)
    spent = {
        "rollouts": forest.n_leaves if rollouts is None else rollouts,
        "tokens": float(forest.cost.sum()) if tokens is None else tokens,
    }
    for name, value in spent.items():
        if not (np.isscalar(value) and np.isfinite(value) and value >= 0):
            raise ValueError(f"`{name}` must be a finite non-negative number, got {value!r}")
    counts = {"mixed_prompts": mixed_prompts(forest), "contrast_pairs": contrast_pairs(forest)}
    return {
        f"{count}_per_1k_{unit}": 1000.0 * n / spent[unit] if spent[unit] > 0 else float("nan")
        for count, n in counts.items()
        for unit in ("rollouts", "tokens")
    }


def mixed_anchor_ratio(forest: RolloutForest) -> float:
    """Share of anchors whose leaves are mixed; anchors are roots and prefixes that were branched from.

    A branched prefix (a non-root node with more than one child) is where a continuation budget was
    spent; the ratio says how often that spending produced a contrast.

    >>> mixed_anchor_ratio(RolloutForest.from_nested([[[0, 1], [1, 1]]]))  # root and two prefixes
    0.6666666666666666
    """
    forest = _check_forest(forest)
    anchors = (forest.parent == -1) | ((forest.parent != -1) & (forest.n_children > 1))
    if not anchors.any():
        return float("nan")
    return float(forest.mixed[anchors].mean())


def contrast_pairs(forest: RolloutForest, *, per_node: bool = False):
    """(success, failure) leaf pairs of the same prompt; with ``per_node``, counted at their lowest
    common ancestor (pairs at a prefix are contrasts between continuations of that prefix).

    For binary rewards, pairs under y = s_y f_y (successes times failures); at y as the lowest common
    ancestor, s_y f_y minus the sum over y's children.

    >>> f = RolloutForest.from_nested([[1, [0, 1]]])
    >>> contrast_pairs(f), contrast_pairs(f, per_node=True).tolist()
    (2, [1, 0, 1, 0, 0])
    """
    forest = _check_forest(forest)
    if not forest.binary_rewards:
        raise ValueError("contrast pairs are defined for binary rewards (binary_rewards=True)")
    s = forest.subtree_sum(np.where(forest.is_leaf, forest.reward, 0.0))
    f = forest.leaf_count - s
    under = s * f
    if not per_node:
        return int(round(under[forest.roots].sum()))
    nonroot = forest.parent != -1
    child_sum = np.bincount(forest.parent[nonroot], weights=under[nonroot], minlength=len(forest))
    return np.rint(under - child_sum).astype(np.int64)


def budget_by_depth(forest: RolloutForest, *, unit: str = "rollouts") -> np.ndarray:
    """Budget spent per anchor depth: index d holds what was sampled from anchors at depth d.

    ``unit="rollouts"`` counts leaves (a bare rollout is sampled from its root, depth 0; a
    continuation from the prefix it branched at). ``unit="cost"`` sums node costs (tokens) instead.

    >>> f = RolloutForest.from_nested([[1, [0, 1]]])
    >>> budget_by_depth(f).tolist(), budget_by_depth(f, unit="cost").tolist()
    ([2, 1], [3.0, 1.0])
    """
    forest = _check_forest(forest)
    if unit not in ("rollouts", "cost"):
        raise ValueError(f"`unit` must be 'rollouts' or 'cost', got {unit!r}")
    nonroot = np.flatnonzero(forest.parent != -1)
    anchor_depth = forest.depth[forest.rollout_anchor[nonroot]]
    size = int(forest.depth.max(initial=0))
    if unit == "rollouts":
        leaves = nonroot[forest.is_leaf[nonroot]]
        return np.bincount(forest.depth[forest.rollout_anchor[leaves]], minlength=size).astype(np.int64)
    return np.bincount(anchor_depth, weights=forest.cost[nonroot], minlength=size)


def _predictions_and_outcomes(pred, outcome):
    pred = _checks.probabilities("pred", _checks.vector("pred", pred))
    outcome = _checks.probabilities("outcome", _checks.vector("outcome", outcome))
    _checks.same_length(pred=pred, outcome=outcome)
    if pred.size == 0:
        raise ValueError("`pred` and `outcome` must not be empty")
    return pred, outcome


def brier_score(pred, outcome) -> float:
    """Mean of (pred - outcome)^2; outcomes may be 0/1 rewards or empirical success rates.

    >>> round(brier_score([0.8, 0.2], [1, 0]), 12)
    0.04
    """
    pred, outcome = _predictions_and_outcomes(pred, outcome)
    return float(np.mean((pred - outcome) ** 2))


def expected_calibration_error(pred, outcome, *, n_bins: int = 10) -> float:
    """Sum over equal-width bins of (bin share) * |mean prediction - mean outcome|.

    >>> expected_calibration_error([0.25, 0.25, 0.75, 0.75], [0, 1, 1, 1], n_bins=2)
    0.25
    """
    pred, outcome = _predictions_and_outcomes(pred, outcome)
    if _checks.count("n_bins", n_bins) < 1:
        raise ValueError(f"`n_bins` must be at least 1, got {n_bins}")
    bins = np.minimum((pred * n_bins).astype(np.int64), n_bins - 1)
    gap = np.abs(np.bincount(bins, weights=pred - outcome, minlength=n_bins))
    return float(gap.sum() / pred.size)


CALIBRATION_WARNING_ECE = 0.15
"""Expected calibration error of a depth above which :func:`calibration_by_depth` flags it: eager
expansion commits continuations on the predictions alone, so it trusts calibration more than the
outcome-aware rule does."""


def calibration_by_depth(forest: RolloutForest, predictions, *, n_bins: int = 10, min_count: int = 20) -> dict:
    """Brier score and ECE of the allocator's predictions, per turn depth, against what happened.

    A prefix's outcome is its own rollout's reward (the factual leaf: an unbiased draw of R given the
    prefix, whatever was branched from it); a root's, the mean reward of its bare rollouts' leaves (its
    group's success rate; Brier then measures against that rate). Nodes without a finite prediction are
    left out.

    Returns
    -------
    dict
        ``{depth: {"brier", "ece", "n"}}`` for every depth with predictions, and ``"miscalibrated"``: 1.0
        when a depth with at least ``min_count`` predictions has ECE above :data:`CALIBRATION_WARNING_ECE`.

    A root whose two bare rollouts ended 1 and 0 (one branched once at its first turn):

    >>> f = RolloutForest.from_nested([[[1, 0], 0]])
    >>> nan = float("nan")
    >>> out = calibration_by_depth(f, [0.2, 0.3, nan, nan, nan], min_count=1)
    >>> round(out[0]["brier"], 12), round(out[1]["ece"], 12), out["miscalibrated"]
    (0.09, 0.7, 1.0)
    """
    forest = _check_forest(forest)
    pred = np.asarray(predictions, dtype=float)
    if pred.shape != (len(forest),):
        raise ValueError(f"`predictions` must hold one value per node ({len(forest)}), got shape {pred.shape}")
    nodes = np.flatnonzero(np.isfinite(pred) & ~forest.is_leaf)
    outcome = np.full(len(forest), np.nan)
    prefixes = nodes[forest.parent[nodes] != -1]
    outcome[prefixes] = forest.reward[forest.factual_leaf[prefixes]]
    roots = nodes[forest.parent[nodes] == -1]
    if roots.size:
        kids = np.flatnonzero(forest.parent >= 0)
        kids = kids[np.isin(forest.parent[kids], roots)]  # the roots' children: first turns of their bare rollouts
        leaf = forest.factual_leaf[kids]
        total = np.bincount(forest.parent[kids], weights=forest.reward[leaf], minlength=len(forest))
        count = np.bincount(forest.parent[kids], minlength=len(forest))
        outcome[roots] = total[roots] / np.maximum(count[roots], 1)
    out: dict = {}
    warn = 0.0
    for d in np.unique(forest.depth[nodes]).tolist():
        at = nodes[forest.depth[nodes] == d]
        at = at[np.isfinite(outcome[at])]
        if not at.size:
            continue
        brier = brier_score(pred[at], np.clip(outcome[at], 0.0, 1.0))
        ece = expected_calibration_error(pred[at], np.clip(outcome[at], 0.0, 1.0), n_bins=n_bins)
        out[int(d)] = {"brier": brier, "ece": ece, "n": int(at.size)}
        if at.size >= min_count and ece > CALIBRATION_WARNING_ECE:
            warn = 1.0
    out["miscalibrated"] = warn
    return out
