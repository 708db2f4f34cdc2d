"""Every registered expansion mode against the barrier in the simulator's Bernoulli world: the decision
test of ``tests/theory/test_expansion.py`` on simulated rollouts and predictions."""

from __future__ import annotations

import numpy as np
import pytest

from trace_theory import EXPANSIONS, RolloutBudget, get_expansion, get_policy

from simulations.model import BernoulliTreeModel
from simulations.predictors import make_predictor
from simulations.runner import sample_batch, sample_pipelined
from tests.theory.expansion_checks import check_against_barrier, of_record

MODEL = BernoulliTreeModel(max_turns=5, stop_prob=0.25)
BUDGET = RolloutBudget(48, 3)


def _record(name, policy, seed):
    pol, predictor, rng = get_policy(policy), make_predictor("noisy"), np.random.default_rng(seed)
    if not get_expansion(name).defers:
        return sample_batch(MODEL, pol, BUDGET, predictor, pool=30, rng=rng, expansion=name).record
    first = sample_pipelined(MODEL, pol, BUDGET, predictor, pool=30, rng=rng, pending=None)
    if first.pending is None:
        return first.trained.record
    return sample_pipelined(MODEL, pol, BUDGET, predictor, pool=30, rng=rng, pending=first.pending,
                            plant=False).trained.record


@pytest.mark.parametrize("name", EXPANSIONS.names())
@pytest.mark.parametrize("policy", ["trace", "trace_beta", "grpo"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_mode_decides_as_the_barrier_or_no_better(name, policy, seed):
    ours, barrier = _record(name, policy, seed), _record("barrier", policy, seed)
    assert ours.forest.n_leaves == BUDGET.total
    check_against_barrier(name, of_record(ours), of_record(barrier), policy=policy)
