"""Whole-forest passes over parent links, for ``trace_theory.forest``: the link check, depths, roots and
a stable order by depth. Plain NumPy on a ``parent`` array (topological order: ``parent[i] < i``).
"""

from __future__ import annotations

import numpy as np


def _check_parent_links(parent: np.ndarray) -> None:
    """Parent ids in range and before their children; name a cycle when there is one."""
    n = len(parent)
    bad = (parent < -1) | (parent >= n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"node {i} has parent {int(parent[i])}, outside [-1, {n - 1}]")
    offenders = np.flatnonzero(parent >= np.arange(n))
    reaches_root: set[int] = set()  # every cycle contains an offender, so walking from each finds it
    for start in offenders.tolist():
        path, on_path, node = [], set(), start
        while node != -1 and node not in reaches_root and node not in on_path:
            path.append(node)
            on_path.add(node)
            node = int(parent[node])
        if node in on_path:
            raise ValueError(f"the parent links form a cycle through nodes {path[path.index(node):]}")
        reaches_root.update(path)
    if offenders.size:
        i = int(offenders[0])
        raise ValueError(
            f"node {i} comes before its parent {int(parent[i])}; nodes must be in topological order "
            "(every parent before its children)"
        )


def _stable_order(depth: np.ndarray) -> np.ndarray:
    """``np.argsort(depth, kind="stable")``; as 16-bit keys (a radix sort) when depths allow it."""
    if len(depth) and int(depth.max()) < 2**15:
        return np.argsort(depth.astype(np.int16), kind="stable")
    return np.argsort(depth, kind="stable")


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every node from topologically ordered parent links (a Python-free fixed point)."""
    n = len(parent)
    depth = np.zeros(n, dtype=np.int64)
    nonroot = np.flatnonzero(parent != -1)
    if nonroot.size == 0:
        return depth
    # Pointer jumping: after j rounds `hop` points 2^j ancestors up and `dist` counts the hops taken.
    hop = parent.copy()
    dist = (parent != -1).astype(np.int64)
    while True:
        alive = hop != -1
        if not alive.any():
            break
        nxt = hop[alive]
        dist[alive] += dist[nxt]
        hop[alive] = hop[nxt]
    return dist


def _roots(parent: np.ndarray) -> np.ndarray:
    """Root of every node, by pointer jumping."""
    root = np.where(parent == -1, np.arange(len(parent)), parent)
    while True:
        nxt = root[root]
        if np.array_equal(nxt, root):
            return root
        root = nxt
