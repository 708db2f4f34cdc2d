"""The rollout forest's invariants and derived defaults (private to :mod:`trace_theory.forest`).

:func:`check_forest` is :meth:`RolloutForest.validate`'s body: parent links, depths, one root per prompt,
leaves exactly the childless nodes with finite (by default 0/1) rewards and NaN elsewhere, origins by
the first-child convention, finite non-negative costs; each failure names the first offending node.
"""

from __future__ import annotations

import numpy as np

from ._forest_links import _check_parent_links
from ._origin import Origin


def integral(name: str, x) -> np.ndarray:
    """``x`` as a 1-D int64 array; a float entry must be a finite whole number (ValueError naming ``name``)."""
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be one-dimensional, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        as_float = arr.astype(float)
        bad = ~(np.isfinite(as_float) & (as_float == np.round(as_float)))
        if bad.any():
            raise ValueError(f"`{name}` must hold integers, got {float(as_float[bad][0])!r}")
    return arr.astype(np.int64)


def check_forest(f) -> None:
    """Every invariant of the forest ``f``; raise ValueError naming the first offending node."""
    n = len(f.parent)
    parent = f.parent
    if n == 0:
        return
    _check_parent_links(parent)
    is_root = parent == -1
    nonroot = np.flatnonzero(~is_root)
    p = parent[nonroot]

    wrong_depth = np.flatnonzero(is_root & (f.depth != 0))
    if wrong_depth.size:
        raise ValueError(f"root {int(wrong_depth[0])} has depth {int(f.depth[wrong_depth[0]])}, expected 0")
    bad = f.depth[nonroot] != f.depth[p] + 1
    if bad.any():
        i = int(nonroot[bad][0])
        raise ValueError(
            f"node {i} has depth {int(f.depth[i])} but its parent {int(parent[i])} has depth "
            f"{int(f.depth[parent[i]])}; a child is one turn deeper than its parent"
        )

    bad = f.prompt[nonroot] != f.prompt[p]
    if bad.any():
        i = int(nonroot[bad][0])
        raise ValueError(
            f"node {i} has prompt {int(f.prompt[i])} but its parent {int(parent[i])} has prompt "
            f"{int(f.prompt[parent[i]])}"
        )
    root_prompts = f.prompt[is_root]
    if (root_prompts < 0).any():
        raise ValueError(f"prompt ids must be non-negative, got {int(root_prompts[root_prompts < 0][0])}")
    uniq, first, cnt = np.unique(root_prompts, return_index=True, return_counts=True)
    if (cnt > 1).any():
        raise ValueError(f"prompt {int(uniq[cnt > 1][0])} has {int(cnt[cnt > 1][0])} roots; expected one per prompt")

    n_children = np.bincount(p, minlength=n)
    has_children = n_children > 0
    bad = f.is_leaf == has_children
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        state = "is marked as a leaf but has children" if f.is_leaf[i] else "is not marked as a leaf but has no children"
        raise ValueError(f"node {i} {state}")
    empty_roots = np.flatnonzero(is_root & ~has_children)
    if empty_roots.size:
        i = int(empty_roots[0])
        raise ValueError(f"root {i} (prompt {int(f.prompt[i])}) has no rollouts")

    leaf_reward = f.reward[f.is_leaf]
    bad = ~np.isfinite(leaf_reward)
    if bad.any():
        i = int(np.flatnonzero(f.is_leaf)[bad][0])
        raise ValueError(f"leaf {i} has no reward (got {float(f.reward[i])!r})")
    if f.binary_rewards:
        bad = ~((leaf_reward == 0.0) | (leaf_reward == 1.0))
        if bad.any():
            i = int(np.flatnonzero(f.is_leaf)[bad][0])
            raise ValueError(
                f"leaf {i} has reward {float(f.reward[i])!r}, but rewards are declared binary (0 or 1); "
                "pass binary_rewards=False for other rewards"
            )
    bad = ~np.isnan(f.reward[~f.is_leaf])
    if bad.any():
        i = int(np.flatnonzero(~f.is_leaf)[bad][0])
        raise ValueError(f"internal node {i} has reward {float(f.reward[i])!r}; only leaves carry rewards (NaN elsewhere)")

    valid_origin = np.isin(f.origin, [int(o) for o in Origin])
    if not valid_origin.all():
        i = int(np.flatnonzero(~valid_origin)[0])
        raise ValueError(f"node {i} has origin code {int(f.origin[i])}, not one of {[int(o) for o in Origin]}")
    bad = (f.origin == Origin.ROOT) != is_root
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"node {i}: origin ROOT is for exactly the nodes without a parent")
    bad = (f.origin[nonroot] == Origin.BARE) & (f.origin[p] == Origin.CONTINUATION)
    if bad.any():
        i = int(nonroot[bad][0])
        raise ValueError(f"node {i} has origin BARE but its parent {int(parent[i])} is a CONTINUATION turn")

    bad = ~(np.isfinite(f.cost) & (f.cost >= 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"node {i} has cost {float(f.cost[i])!r}; costs must be finite and non-negative")
    return


def default_origin(parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """ROOT / BARE / CONTINUATION by the first-child convention of the module docstring."""
    n = len(parent)
    origin = np.full(n, int(Origin.CONTINUATION), dtype=np.int8)
    origin[parent == -1] = Origin.ROOT
    nonroot = np.flatnonzero(parent != -1)
    first = np.full(n, -1, dtype=np.int64)
    # The minimum child id of each parent is its first child; reversed assignment keeps the minimum.
    first[parent[nonroot[::-1]]] = nonroot[::-1]
    order = np.argsort(depth, kind="stable")
    for d in range(1, int(depth.max(initial=0)) + 1):
        level = order[depth[order] == d]
        p = parent[level]
        bare = (origin[p] == Origin.ROOT) | ((origin[p] == Origin.BARE) & (first[p] == level))
        origin[level[bare]] = Origin.BARE
    return origin
