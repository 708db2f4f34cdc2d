"""The decision test of every expansion mode, shared by the scripted, simulated and engine worlds.

:func:`decisions` reads what a step decided off its forest (continuations per bare anchor, bare rollouts
per tree, top-ups included); :func:`check_against_barrier` compares a mode's to the barrier's on the
same bare rollouts and predictions: node for node where the mode says it decides as the barrier does,
otherwise the same anchors, predictions and budget, and a prefix utility sum flip(v, r, k) no larger
than the barrier's (the hindsight optimum, for the rollout-priced ``trace`` rule).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from trace_theory import flip_probability, get_expansion, run_pipelined_step, run_step


class Decisions(NamedTuple):
    anchors: np.ndarray
    v: np.ndarray
    reward: np.ndarray
    """Factual reward of each anchor."""
    k: np.ndarray
    """Continuations started at each anchor."""
    groups: np.ndarray
    """Bare rollouts per tree (top-ups included)."""


def decisions(forest, anchors, v) -> Decisions:
    """What a step decided at its bare ``anchors`` (predicted ``v``), read off its ``forest``."""
    anchors = np.asarray(anchors, dtype=np.int64)
    starts = np.flatnonzero(forest.starts_rollout)
    parent = forest.parent[starts]
    k = np.bincount(parent, minlength=len(forest))[anchors]
    at_root = starts[forest.parent[parent] == -1]
    groups = np.bincount(forest.tree_index[at_root], minlength=forest.n_prompts)
    return Decisions(anchors, np.asarray(v, float), forest.reward[forest.factual_leaf[anchors]], k, groups)


def of_record(record) -> Decisions:
    return decisions(record.forest, record.node_ids, record.node_v)


def utility(d: Decisions) -> float:
    return float(flip_probability(d.v, d.reward, d.k).sum())


def check_against_barrier(mode, ours: Decisions, barrier: Decisions, *, policy: str) -> None:
    mode = get_expansion(mode)
    np.testing.assert_array_equal(ours.anchors, barrier.anchors, err_msg="the anchors asked about")
    np.testing.assert_array_equal(ours.v, barrier.v, err_msg="the predictions at the anchors")
    assert ours.k.sum() + ours.groups.sum() == barrier.k.sum() + barrier.groups.sum(), "the budget spent"
    if mode.decides_as_barrier:
        np.testing.assert_array_equal(ours.k, barrier.k, err_msg=f"{mode.name}: continuations per anchor")
        np.testing.assert_array_equal(ours.groups, barrier.groups, err_msg=f"{mode.name}: group sizes")
    elif policy == "trace":
        assert utility(ours) <= utility(barrier) + 1e-9, f"{mode.name} beat the hindsight optimum"


def run_mode(make_world, mode, policy, budget, *, pool, seed):
    """One step of ``mode`` on a world from ``make_world()`` (two worlds: a wave and the drain, for a mode
    that defers); returns its record."""
    mode = get_expansion(mode)
    rng = np.random.default_rng(seed)
    if not mode.defers:
        return run_step(make_world(), policy, budget, pool=pool, rng=rng, expansion=mode)
    first = run_pipelined_step(make_world(), policy, budget, pool=pool, rng=rng, pending=None)
    if first.pending is None:
        return first.trained
    return run_pipelined_step(make_world(), policy, budget, pool=pool, rng=rng, pending=first.pending,
                              plant=False).trained
