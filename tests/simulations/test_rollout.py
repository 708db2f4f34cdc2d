"""Laying simulated rollouts out as a RolloutForest: node ids, parents, origins, rewards, payloads."""

import numpy as np
import pytest

from simulations.rollout import Rollouts, SimForest
from trace_theory import Origin, RolloutForest


def _block(lengths, rewards, tag):
    """Rollouts whose turn payload ``v`` is ``tag`` + turn position (easy to trace), ending at the reward."""
    length = np.asarray(lengths)
    v = tag + np.arange(length.sum()) / 100.0
    leaves = np.cumsum(length) - 1
    v[leaves] = rewards
    return Rollouts(length, np.asarray(rewards, float), {"v": v})


def test_plant_lays_out_roots_then_rollouts_in_order():
    prompts = {"v": np.array([0.1, 0.2, 0.3])}
    m = np.array([2, 0, 1])  # prompt 1 gets nothing: no root
    sim = SimForest.plant(prompts, m, _block([2, 1, 3], [1, 0, 1], tag=10))
    f = sim.forest
    assert f.prompt[f.roots].tolist() == [0, 2]
    #          roots  | rollout 0 | rollout 1 | rollout 2
    assert f.parent.tolist() == [-1, -1, 0, 2, 0, 1, 5, 6]
    assert f.origin.tolist() == [Origin.ROOT] * 2 + [Origin.BARE] * 6
    assert np.isnan(f.reward[[0, 1, 2, 5, 6]]).all() and f.reward[[3, 4, 7]].tolist() == [1, 0, 1]
    assert sim.nodes["v"][:2].tolist() == [0.1, 0.3]
    assert sim.rollouts == 3 and sim.turns == 6


def test_grow_appends_continuations_below_their_anchors():
    sim = SimForest.plant({"v": np.array([0.5])}, np.array([1]), _block([3], [0], tag=0))
    grown = sim.grow(np.array([1, 1, 2]), _block([2, 1, 1], [1, 1, 0], tag=20), origin=Origin.CONTINUATION)
    f = grown.forest
    assert f.parent[4:].tolist() == [1, 4, 1, 2]
    assert f.origin[4:].tolist() == [Origin.CONTINUATION] * 4
    assert f.n_children[1] == 3 and f.first_child[1] == 2  # the factual turn stays the primary child
    assert np.array_equal(grown.nodes["v"][:4], sim.nodes["v"])
    assert grown.nodes["v"][4] == pytest.approx(20.0)
    assert grown.rollouts == 4 and grown.turns == 7
    assert f.factual_leaf[1] == 3 and f.factual_leaf[4] == 5


def test_select_and_concatenate_keep_turns_with_their_rollouts():
    block = _block([2, 1, 3], [1, 0, 1], tag=0)
    kept = block.select(np.array([True, False, True]))
    assert kept.length.tolist() == [2, 3] and kept.reward.tolist() == [1, 1]
    assert kept.turns["v"].tolist() == [0.0, 1.0, 0.03, 0.04, 1.0]
    both = Rollouts.concatenate([kept, block])
    assert len(both) == 5 and both.turns["v"].size == 11 and both.start.tolist() == [0, 2, 5, 7, 8]


def test_plant_rejects_mismatched_blocks():
    with pytest.raises(ValueError, match="holds 1 rollouts for group sizes summing to 2"):
        SimForest.plant({"v": np.array([0.5])}, np.array([2]), _block([1], [1], tag=0))


def test_trusted_growth_gives_the_forest_that_validation_accepts():
    """plant/grow skip the forest's checks; the result must be the very forest the checked path builds."""
    sim = SimForest.plant({"v": np.array([0.1, 0.2, 0.3])}, np.array([2, 0, 1]), _block([2, 1, 3], [1, 0, 1], tag=10))
    grown = sim.grow(np.array([0, 2, 6]), _block([1, 2, 1], [0, 1, 1], tag=20), origin=Origin.CONTINUATION)
    f = grown.forest.validate()
    checked = RolloutForest.from_parents(f.parent, f.reward, prompt=f.prompt[f.roots], origin=f.origin, cost=f.cost)
    for name in ("parent", "prompt", "depth", "reward", "is_leaf", "origin", "cost"):
        assert np.array_equal(getattr(f, name), getattr(checked, name), equal_nan=True), name
