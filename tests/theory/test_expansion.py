"""Every registered expansion mode against the barrier on the scripted world (``test_step``), and a toy
mode registered here, in this one file, that passes the same test."""

from __future__ import annotations

import numpy as np
import pytest

from trace_theory import EXPANSIONS, Expansion, RolloutBudget, get_expansion, get_policy, top_up_roots
from trace_theory.expansion import Settled
from trace_theory.expansion.events import checked_prediction

from .expansion_checks import check_against_barrier, of_record, run_mode
from .test_pipelined import PipelinedScripted

POOL, BUDGET = 16, RolloutBudget(12, 3)


def _check(name, policy, seed, horizon):
    def make():
        return PipelinedScripted(POOL, seed=seed, horizon=horizon)

    p = get_policy(policy)
    barrier = run_mode(make, "barrier", p, BUDGET, pool=POOL, seed=seed)
    ours = run_mode(make, name, p, BUDGET, pool=POOL, seed=seed)
    assert ours.forest.validate().n_leaves == BUDGET.total
    check_against_barrier(name, of_record(ours), of_record(barrier), policy=policy)
    return ours


@pytest.mark.parametrize("name", EXPANSIONS.names())
@pytest.mark.parametrize("policy", ["trace", "trace_beta", "prefix_only", "grpo"])
@pytest.mark.parametrize("seed, horizon", [(0, 3), (1, 4), (2, 2)])
def test_every_mode_decides_as_the_barrier_or_no_better(name, policy, seed, horizon):
    """Policies whose prefix rule reads predictions (the anchors asked about are in the record), and one
    that does not branch (every mode runs as the barrier)."""
    record = _check(name, policy, seed, horizon)
    mode = get_expansion(name)
    ran = (mode.streams or mode.defers) and get_policy(policy).branches
    assert record.expansion == (name if ran else "barrier")


# ---------------------------------------------------------------------------------------------------
# A toy mode: every tree's continuations decided once all trees have ended, in one call
# ---------------------------------------------------------------------------------------------------


class AtRest(Expansion):
    """Hears each tree's end, decides nothing until the last: then ``allocate_prefixes`` over every
    anchor and the top-ups, as the barrier would, started by the world at once."""

    name = "toy_at_rest"
    streams = True

    def events(self, policy, m_tree, per_root, tree_cost, root_v):
        return _AtRestEvents(policy, m_tree, per_root)

    def settle(self, events, forest, anchors):
        return Settled(np.concatenate(events.v), None, int(events.k.sum()), events.top_ups)


class _AtRestEvents:
    boundaries = False

    def __init__(self, policy, m_tree, per_root):
        self.policy, self.m_tree, self.budget = policy, m_tree, per_root * m_tree
        self.v, self.reward = [None] * len(m_tree), [None] * len(m_tree)

    def tree_ended(self, tree, reward, predict):
        self.reward[tree] = np.asarray(reward, float)
        self.v[tree] = checked_prediction(predict(concentration=False), len(reward), self.policy).v
        return np.zeros(len(reward), dtype=np.int64)

    def rest(self):
        tree = np.repeat(np.arange(len(self.v)), [v.size for v in self.v])
        alloc = self.policy.allocate_prefixes(np.concatenate(self.v), np.concatenate(self.reward), tree, self.budget)
        self.k, self.top_ups = alloc.k, top_up_roots(self.m_tree, int(alloc.unspent.sum())) - self.m_tree
        return self.top_ups, np.split(alloc.k, np.cumsum([v.size for v in self.v])[:-1])


@pytest.mark.parametrize("seed, horizon", [(0, 3), (1, 4)])
def test_a_mode_registered_in_one_file_passes_the_decision_test(seed, horizon):
    EXPANSIONS.add("toy_at_rest", AtRest)
    try:
        record = _check("toy_at_rest", "trace", seed, horizon)
        assert record.expansion == "toy_at_rest" and record.counts["continuation"] > 0
    finally:
        EXPANSIONS.remove("toy_at_rest")
    assert "toy_at_rest" not in EXPANSIONS


def test_starts_cross_the_world_border_typed():
    """A start's kind is a ``Kind`` (its name is accepted once, where a plain tuple comes in)."""
    from trace_theory.expansion import Kind, Start, Starts

    starts = Starts.of_kind([3, 5], Kind.TOP_UP, [2, 1]) + Starts.of_kind([7], Kind.CONTINUATION, [4])
    assert starts.tuples() == [(3, Kind.TOP_UP, 2), (5, Kind.TOP_UP, 1), (7, Kind.CONTINUATION, 4)]
    assert all(type(s.kind) is Kind for s in starts.tuples())
    assert Start.of((1, "bare", 2)) == Start(1, Kind.BARE, 2) and Start.of((1, 2, 3)).kind is Kind.CONTINUATION
    with pytest.raises(ValueError):
        Start.of((1, "sideways", 2))
