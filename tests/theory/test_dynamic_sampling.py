"""DAPO-style dynamic sampling state: rounds, accounting and stopping."""

import numpy as np
import pytest

from trace_theory import DynamicSamplingState, group_outcomes, mixed_groups


def test_rounds_until_the_batch_is_full():
    state = DynamicSamplingState(target=3, group_size=4, budget=100)
    assert state.next_round() == 3
    # Round 1: three prompts, only one mixed.
    state = state.update([0] * 4 + [1] * 4 + [2] * 4, [1, 0, 1, 1] + [1] * 4 + [0] * 4)
    assert (state.kept, state.drawn, state.spent) == (1, 3, 12)
    assert state.next_round() == 6  # 2 missing / keep rate 1/3
    state = state.update(np.repeat(np.arange(3, 9), 4), np.tile([1, 0, 0, 0], 6))
    assert state.kept == 7 and state.done and state.next_round() == 0


def test_budget_caps_the_rounds():
    state = DynamicSamplingState(target=10, group_size=4, budget=20)
    assert state.next_round() == 5  # 10 wanted, only 5 affordable
    state = state.update(np.repeat(np.arange(5), 4), np.zeros(20))
    assert state.kept == 0 and state.spent == 20 and state.done


def test_keep_rate_floor():
    state = DynamicSamplingState(target=2, group_size=2, budget=1000, min_keep_rate=0.1)
    state = state.update([0, 0, 1, 1], [0, 0, 1, 1])  # nothing kept: rate floored at 0.1
    assert state.next_round() == 20


def test_group_helpers():
    ids, n, s = group_outcomes([4, 2, 4, 2, 2], [1, 1, 0, 1, 1])
    assert ids.tolist() == [2, 4] and n.tolist() == [3, 2] and s.tolist() == [3, 1]
    ids, keep = mixed_groups([4, 2, 4, 2, 2], [1, 1, 0, 1, 1])
    assert ids[keep].tolist() == [4]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(target=0, group_size=4, budget=8), r"`target` must be at least 1, got 0"),
        (dict(target=1, group_size=1, budget=8), r"`group_size` must be at least 2 \(a group of one is never mixed\), got 1"),
        (dict(target=1, group_size=2, budget=-1), r"`budget` must be a non-negative integer, got -1"),
        (dict(target=1, group_size=2, budget=8, oversample=0.5), r"`oversample` must be at least 1, got 0.5"),
        (dict(target=1, group_size=2, budget=8, min_keep_rate=0.0), r"`min_keep_rate` must lie in \(0, 1\], got 0.0"),
    ],
)
def test_state_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicSamplingState(**kwargs)


def test_reward_errors():
    with pytest.raises(ValueError, match=r"`reward` must be 0 or 1, got 0.5"):
        mixed_groups([0, 0], [0.5, 1])
