"""Barrier expansion (``"barrier"``): every bare rollout ends first, then R rounds of prefix expansion.

The anchors of round 1 are the non-terminal prefixes of the bare rollouts, those of round r + 1 the
non-terminal prefixes of the rollouts round r added; each round predicts its anchors (if the prefix rule
reads predictions) and places ``policy.allocate_prefixes`` within each prompt's share of m_i N for the
round. **Splitting the budget over rounds**: prompt i's budget B_i = m_i N is dealt out evenly, the
remainder to the earliest rounds: round r (1-based) gets floor(B_i / R) + [r <= B_i mod R]
(:func:`round_shares`). Within a round, budget a prompt cannot place goes to the other prompts' anchors;
budget no anchor of the round can take rolls over to the next round, and what is left after the last
round (or once a round has no anchors) tops up the roots (``top_up_roots``). Every policy therefore spends
exactly M (1 + N) rollouts for every R; R = 1 is the paper's algorithm. This is the hindsight optimum the
other modes are measured against (:func:`hindsight_continuations`).
"""

from __future__ import annotations

import numpy as np

from .. import _checks
from ..forest import RolloutForest
from ..policies import AllocationPolicy, top_up_roots
from .base import EXPANSIONS, Expansion
from .events import Kind, Starts, checked_prediction, in_rollout_order

__all__ = ["Barrier", "round_shares", "place_continuations", "expand_rounds", "hindsight_continuations"]


@EXPANSIONS.register("barrier")
class Barrier(Expansion):
    """Continuations start once every bare rollout of the step has ended (the paper's algorithm)."""

    name = "barrier"


def round_shares(budget, rounds: int) -> np.ndarray:
    """Per-prompt continuation budget dealt over ``rounds`` rounds, shape (rounds, n_prompts).

    Round r (1-based) gets floor(B / R) + [r <= B mod R]: even, the remainder to the earliest rounds.

    >>> round_shares([5, 1, 0], 2).tolist()
    [[3, 1, 0], [2, 0, 0]]
    """
    budget = _checks.counts("budget", _checks.vector("budget", budget, dtype=None))
    if _checks.count("rounds", rounds) < 1:
        raise ValueError(f"`rounds` must be at least 1, got {rounds}")
    base, extra = np.divmod(budget, rounds)
    r = np.arange(1, rounds + 1)[:, None]
    return (base[None, :] + (r <= extra[None, :])).astype(np.int64)


def place_continuations(policy: AllocationPolicy, forest: RolloutForest, anchors, v, budget, *, rng=None,
                        cost=None):
    """Continuations per anchor by ``policy``'s prefix rule: one expansion round's decision on ``forest``.

    ``v`` is the prediction at each anchor, ``budget`` the continuation budget of each tree (in
    ``forest.roots`` order); the factual reward of an anchor is that of its own rollout's leaf
    (``forest.factual_leaf``). ``cost``: price of a continuation per anchor, in rollouts of its prompt
    (read by a policy priced in tokens). Returns ``policy.allocate_prefixes``' :class:`PrefixAllocation`.
    """
    anchors = np.asarray(anchors, dtype=np.int64)
    factual = forest.reward[forest.factual_leaf[anchors]]
    return policy.allocate_prefixes(v, factual, forest.tree_index[anchors], budget, rng=rng, cost=cost)


def hindsight_continuations(policy: AllocationPolicy, forest: RolloutForest, anchors, v, budget, *, cost=None):
    """The barrier's continuations per anchor on a finished step's bare rollouts: the hindsight optimum
    (every outcome known) that a mode deciding earlier is measured against, the same call as the barrier's
    one round (:func:`place_continuations`). Returns k per anchor (int64)."""
    return place_continuations(policy, forest, anchors, v, budget, cost=cost).k


def expand_rounds(world, policy, forest, m, per_root, rounds, rng, record, counts, root_cost=None):
    """Stage 2 over ``rounds`` expansion rounds (see the module); returns (forest, groups, per round)."""
    roots = forest.roots
    tree_cost = None if root_cost is None else root_cost[forest.prompt[roots]]  # tokens of a rollout, per tree
    m_tree = m[forest.prompt[roots]]  # group sizes in tree order
    shares = round_shares(per_root * m_tree, rounds)
    carry = np.zeros(len(roots), dtype=np.int64)
    anchors = in_rollout_order(forest, forest.prefix_anchors())
    asked_ids, asked_v, asked_kappa, asked_round, by_round = [], [], [], [], []
    for r in range(rounds):
        last = r == rounds - 1 or anchors.size == 0  # with nothing to branch from, the rest tops up roots
        budget = (shares[r:].sum(0) if last else shares[r]) + carry
        if policy.predicts_prefixes and anchors.size:
            guess = checked_prediction(world.predict_nodes(anchors, concentration=policy.posterior), anchors.size,
                                       policy)
            v = guess.v
            asked_ids.append(anchors), asked_v.append(v), asked_round.append(np.full(anchors.size, r + 1))
            asked_kappa.append(guess.concentration)
            price = None
            if guess.cost is not None and tree_cost is not None:  # a continuation in rollouts of its prompt
                price = guess.cost / tree_cost[forest.tree_index[anchors]]
        else:
            v, price = np.full(anchors.size, 0.5), None
        alloc = place_continuations(policy, forest, anchors, v, budget, rng=rng, cost=price)
        carry = alloc.unspent
        by_round.append(int(alloc.k.sum()))
        before = len(forest)
        forest, m_tree = _grow_round(world, forest, anchors, alloc, m_tree, counts, last=last)
        if last:
            break
        new = np.arange(before, len(forest))
        anchors = in_rollout_order(forest, new[~forest.is_leaf[new]])
    if asked_ids:
        record.update(node_ids=np.concatenate(asked_ids), node_v=np.concatenate(asked_v),
                      node_round=np.concatenate(asked_round))
        if policy.posterior:
            record["node_concentration"] = np.concatenate(asked_kappa)
    groups = np.zeros_like(m)
    groups[forest.prompt[roots]] = m_tree
    return forest, groups, tuple(by_round)


def _grow_round(world, forest, anchors, alloc, m_tree, counts, *, last):
    """Grow one round's top-ups (after the last round, of what is unspent) and continuations
    (``alloc.k``); returns (forest, group sizes with top-ups)."""
    roots = forest.roots
    extra = np.zeros(len(roots), dtype=np.int64)
    if last and alloc.unspent.sum():
        extra = top_up_roots(m_tree, int(alloc.unspent.sum())) - m_tree
    k = alloc.k
    branch, topped = np.flatnonzero(k), np.flatnonzero(extra)
    starts = (Starts.of_kind(roots[topped], Kind.TOP_UP, extra[topped])
              + Starts.of_kind(anchors[branch], Kind.CONTINUATION, k[branch]))
    counts["top_up"] += int(extra.sum())
    counts["continuation"] += int(k.sum())
    if len(starts):
        forest = world.grow(starts)
    return forest, m_tree + extra
