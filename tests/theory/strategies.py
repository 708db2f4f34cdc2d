"""Hypothesis strategies shared by the theory tests: probabilities, budgets and rollout forests.

Strategies are bounded by construction (no ``filter`` on large spaces): arrays draw their length first,
forests are grown node by node with parents always earlier than children.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from trace_theory import Origin, RolloutForest

# Values that exercise the edges: certain failures and successes, exact halves, and generic floats.
probability = st.one_of(
    st.sampled_from([0.0, 1.0, 0.5, 0.1, 0.9, 0.25]),
    st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False),
)


@st.composite
def probability_arrays(draw, min_size=0, max_size=8):
    n = draw(st.integers(min_size, max_size))
    return np.array(draw(st.lists(probability, min_size=n, max_size=n)), dtype=float)


@st.composite
def forests(draw, max_prompts=4, max_nodes=24, binary=True):
    """A valid forest: roots with bare rollouts, some branched, rewards on leaves.

    Grown by appending turns: each new node picks an existing unfinished node as parent. Every
    unfinished node then receives a reward, so all leaves have one.
    """
    n_prompts = draw(st.integers(1, max_prompts))
    parent, origin = [], []
    for _ in range(n_prompts):
        parent.append(-1)
        origin.append(int(Origin.ROOT))
    # Each root gets at least one child, so no root is a leaf.
    for root in range(n_prompts):
        parent.append(root)
        origin.append(int(Origin.BARE))
    extra = draw(st.integers(0, max_nodes - len(parent)))
    for _ in range(extra):
        p = draw(st.integers(0, len(parent) - 1))
        has_child = p in parent
        if origin[p] == Origin.ROOT or (origin[p] == Origin.BARE and not has_child):
            o = Origin.BARE
        else:
            o = Origin.CONTINUATION
        parent.append(p)
        origin.append(int(o))
    parent_arr = np.array(parent)
    is_leaf = np.bincount(parent_arr[parent_arr >= 0], minlength=len(parent)) == 0
    if binary:
        leaf_rewards = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=int(is_leaf.sum()), max_size=int(is_leaf.sum())))
    else:
        # Multiples of 1/64 in [-5, 5]: exactly representable, so equal non-integer rewards occur
        # (they exposed a rounding bug) without subnormal squares that no real reward produces.
        grid = st.integers(-320, 320).map(lambda k: k / 64.0)
        leaf_rewards = draw(st.lists(grid, min_size=int(is_leaf.sum()), max_size=int(is_leaf.sum())))
    reward = np.full(len(parent), np.nan)
    reward[is_leaf] = leaf_rewards
    cost = draw(st.lists(st.integers(0, 9), min_size=len(parent), max_size=len(parent)))
    cost = np.where(parent_arr == -1, 0.0, np.array(cost, dtype=float))
    return RolloutForest.from_parents(parent_arr, reward, origin=np.array(origin), cost=cost, binary_rewards=binary)


@st.composite
def tie_free_probabilities(draw, min_size=2, max_size=8):
    """Probabilities whose contrasts v (1 - v) are distinct and positive, so no allocation ties.

    Draws distinct distances u from 1/2's far side (u in (0, 1/2)) and reflects each to u or 1 - u.
    """
    n = draw(st.integers(min_size, max_size))
    u = draw(st.lists(st.integers(1, 4900), min_size=n, max_size=n, unique=True))
    flip = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    u = np.array(u) / 10_000.0
    return np.where(flip, 1.0 - u, u)


# Prices of a unit (expected tokens, in rollouts): exact binary fractions make equal prices and exact
# spends common; generic floats cover the rest.
price = st.one_of(st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0]), st.floats(0.2, 3.0, allow_nan=False))


@st.composite
def priced_probabilities(draw, min_size=1, max_size=3):
    """(v, price): probabilities and one positive price per item, of the same length."""
    n = draw(st.integers(min_size, max_size))
    v = np.array(draw(st.lists(probability, min_size=n, max_size=n)), dtype=float)
    return v, np.array(draw(st.lists(price, min_size=n, max_size=n)), dtype=float)
