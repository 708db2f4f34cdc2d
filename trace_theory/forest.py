"""The rollout forest: one batch of rollout trees in struct-of-arrays form.

A node is a turn boundary. The root of a tree is the prompt (depth 0); the edge parent -> node is one
agent turn (model tokens plus the observation that followed), so a node's ``depth`` is the number of
turns taken. Leaves are terminal and carry the reward; every other node has reward NaN.

Conventions the rest of the project relies on:

* **Topological order.** ``parent[i] < i`` for every non-root node: parents come first, so bottom-up
  passes run from the last node to the first and appending nodes never breaks an existing forest.
* **Children in creation order.** A non-root node's first child continues that node's own rollout (the
  *primary* child); later children are *branches*: continuations sampled from that prefix after the
  first rollout through it was seen. A root's children are all primary (one per bare rollout).
* **Origin.** ``ROOT`` for roots, ``BARE`` for turns of the rollouts allocated at the root (stage 1),
  ``CONTINUATION`` for turns of rollouts branched from a prefix (stage 2 or later).
* **Cost.** What it cost to create the node: tokens generated for its turn in the trainer, 1 per turn in
  the simulator, 0 for a root.

``trace_theory`` never sees text or tensors; the trainer keys its payloads by node id.

Checked and trusted construction: every builder checks its input and the resulting forest by default.
Code that grows a forest from links it made itself (the simulator, a step driver) passes
``validate=False`` to :meth:`RolloutForest.from_parents` and :meth:`RolloutForest.append` and calls
:meth:`RolloutForest.validate` once per step where it wants the guarantee (tests do); both paths give
equal forests from valid input, and appending costs the new nodes plus one copy of the arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, Sequence

import numpy as np

from . import _checks
from ._forest_checks import check_forest, default_origin, integral
from ._origin import Origin
from ._forest_links import _check_parent_links, _depths, _roots, _stable_order

__all__ = ["Origin", "RolloutForest"]

_FIELDS = ("parent", "prompt", "depth", "reward", "is_leaf", "origin", "cost", "binary_rewards")


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, copy=True)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class RolloutForest:
    """A batch of rollout trees as parallel NumPy arrays indexed by node id.

    Build one with :meth:`from_parents`, :meth:`from_nested` or :class:`ForestBuilder`; the constructor
    checks every invariant (see :meth:`validate`) and stores read-only copies of the arrays.

    Attributes
    ----------
    parent : ndarray of int64
        Parent node id, -1 for a root. ``parent[i] < i``.
    prompt : ndarray of int64
        Prompt (data set row) of the node's tree; one root per prompt.
    depth : ndarray of int64
        Turns taken to reach the node; 0 for a root.
    reward : ndarray of float64
        Terminal reward for leaves, NaN elsewhere.
    is_leaf : ndarray of bool
        True exactly for nodes without children.
    origin : ndarray of int8
        :class:`Origin` code.
    cost : ndarray of float64
        Cost of creating the node (tokens, or 1 per turn in the simulator).
    binary_rewards : bool
        Whether rewards are declared to be 0/1 (checked).
    """

    parent: np.ndarray
    prompt: np.ndarray
    depth: np.ndarray
    reward: np.ndarray
    is_leaf: np.ndarray
    origin: np.ndarray
    cost: np.ndarray
    binary_rewards: bool = True

    def __post_init__(self):
        arrays = {
            "parent": _checks.vector("parent", self.parent, dtype=np.int64)
            if np.issubdtype(np.asarray(self.parent).dtype, np.integer)
            else integral("parent", self.parent),
            "prompt": integral("prompt", self.prompt),
            "depth": integral("depth", self.depth),
            "reward": _checks.vector("reward", self.reward, dtype=float),
            "is_leaf": _checks.vector("is_leaf", self.is_leaf, dtype=bool),
            "origin": integral("origin", self.origin).astype(np.int8),
            "cost": _checks.vector("cost", self.cost, dtype=float),
        }
        _checks.same_length(**arrays)
        for name, arr in arrays.items():
            object.__setattr__(self, name, _readonly(arr))
        self.validate()

    # -----------------------------------------------------------------------------------------------
    # Validation
    # -----------------------------------------------------------------------------------------------

    def validate(self) -> "RolloutForest":
        """Check every invariant; raise ValueError naming the first offending node. Returns ``self``."""
        check_forest(self)
        return self

    # -----------------------------------------------------------------------------------------------
    # Builders
    # -----------------------------------------------------------------------------------------------

    @classmethod
    def from_parents(cls, parent, reward, *, prompt=None, origin=None, cost=None, binary_rewards=True,
                     validate=True, depth=None):
        """Build a forest from parent links and leaf rewards, deriving depth, leaves and defaults.

        Parameters
        ----------
        parent : array_like of int
            Parent of each node, -1 for roots; parents before children.
        reward : array_like of float
            Reward of each leaf; entries of internal nodes must be NaN.
        prompt : array_like of int, optional
            Prompt id of each **root**, in root order (default 0, 1, 2, ...). Other nodes inherit it.
        origin : array_like of int, optional
            :class:`Origin` code per node. By default a root's children are BARE, a BARE node's first
            child is BARE, and every other child is a CONTINUATION (see the module conventions).
        cost : array_like of float, optional
            Cost per node; default 1 per turn and 0 per root.
        binary_rewards : bool, default True
            Declare (and check) that rewards are 0 or 1.
        validate : bool, default True
            ``False`` skips every check (the trusted fast path, see :meth:`append`); the caller
            guarantees valid links and rewards and may call :meth:`validate` once later.
        depth : array_like of int, optional
            Depth of each node when the caller knows it already (a simulator does), which saves
            deriving it from the links; checked against them unless ``validate=False``.

        Examples
        --------
        One prompt, two rollouts; the second branched at its first turn into a success and a failure:

        >>> f = RolloutForest.from_parents([-1, 0, 0, 2, 2], [float("nan"), 1, float("nan"), 1, 0])
        >>> f.depth.tolist(), f.is_leaf.tolist()
        ([0, 1, 1, 2, 2], [False, True, False, True, True])
        >>> [Origin(o).name for o in f.origin]
        ['ROOT', 'BARE', 'BARE', 'BARE', 'CONTINUATION']
        """
        if validate:
            parent = integral("parent", parent)
            reward = _checks.vector("reward", reward, dtype=float)
            _checks.same_length(parent=parent, reward=reward)
            _check_parent_links(parent)
        else:  # copies: the forest must not share arrays that the caller may change
            parent, reward = np.array(parent, np.int64), np.array(reward, float)
        n = len(parent)
        derived = _depths(parent) if depth is None or validate else None
        if depth is None:
            depth = derived
        elif validate:
            depth = integral("depth", depth)
            _checks.same_length(parent=parent, depth=depth)
            if not np.array_equal(depth, derived):
                i = int(np.flatnonzero(depth != derived)[0])
                raise ValueError(f"`depth` does not match the parent links (first at node {i})")
        else:
            depth = np.array(depth, np.int64)
        is_root = parent == -1
        if prompt is None:
            root_prompt = np.arange(int(is_root.sum()))
        else:
            root_prompt = integral("prompt", prompt)
            if len(root_prompt) != is_root.sum():
                raise ValueError(f"`prompt` gives {len(root_prompt)} ids for {int(is_root.sum())} roots")
        root_of = _roots(parent)
        root_rank = np.cumsum(is_root) - 1
        node_prompt = root_prompt[root_rank[root_of]] if n else np.zeros(0, np.int64)
        is_leaf = np.bincount(parent[~is_root], minlength=n) == 0 if n else np.zeros(0, bool)
        if origin is None:
            origin = default_origin(parent, depth)
        if cost is None:
            cost = np.where(is_root, 0.0, 1.0)
        if validate:
            return cls(parent, node_prompt, depth, reward, is_leaf, origin, cost, binary_rewards)
        return cls._trusted(
            parent=parent, prompt=node_prompt, depth=depth, reward=reward, is_leaf=is_leaf,
            origin=np.array(origin, np.int8), cost=np.array(cost, float), binary_rewards=binary_rewards,
        )

    @classmethod
    def from_nested(cls, trees: Sequence, *, prompt=None, binary_rewards=True):
        """Build a forest from nested lists: a node is a list of its children, a leaf is its reward.

        ``trees[i]`` is the root of prompt ``i`` (or ``prompt[i]``): a list whose items are its bare
        rollouts. Inside a rollout the first item of a list continues the rollout and later items are
        branches (continuations from that prefix).

        Examples
        --------
        Prompt 0 has a one-turn success and a two-turn rollout that failed but whose branch succeeded:

        >>> f = RolloutForest.from_nested([[1, [0, 1]]])
        >>> f.parent.tolist(), f.reward.tolist()[1:2], f.n_leaves
        ([-1, 0, 0, 2, 2], [1.0], 3)
        """
        parent: list[int] = []
        reward: list[float] = []
        stack: list[tuple[object, int, str]] = []
        if isinstance(trees, (str, bytes)) or not isinstance(trees, Sequence):
            raise ValueError(f"`trees` must be a sequence of nested lists, got {type(trees).__name__}")
        for t, tree in enumerate(trees):
            if not isinstance(tree, (list, tuple)):
                raise ValueError(f"`trees[{t}]` must be a list of rollouts (a root cannot be a leaf), got {tree!r}")
            stack.append((tree, -1, f"trees[{t}]"))
            while stack:
                item, par, where = stack.pop()
                node = len(parent)
                parent.append(par)
                if isinstance(item, (list, tuple)):
                    if not item:
                        raise ValueError(f"{where} is an empty list: a node needs children or a reward")
                    reward.append(np.nan)
                    # Push in reverse so that children get increasing ids in list order.
                    for j in range(len(item) - 1, -1, -1):
                        stack.append((item[j], node, f"{where}[{j}]"))
                else:
                    try:
                        reward.append(float(item))
                    except (TypeError, ValueError):
                        raise ValueError(f"{where} must be a list or a reward, got {item!r}") from None
        # The stack visits depth-first, so ids are in topological order with children in list order.
        return cls.from_parents(np.asarray(parent, dtype=np.int64), np.asarray(reward), prompt=prompt,
                                binary_rewards=binary_rewards)

    def append(self, parent, reward, *, origin, cost=1.0, validate=True) -> "RolloutForest":
        """A new forest with turns appended below existing trees (ids continue from ``len(self)``).

        ``parent`` may point at existing nodes or at earlier appended ones, never -1 (start new prompts
        with :meth:`from_parents`). An existing leaf cannot gain children: validation rejects it.

        The cost is linear in the appended nodes plus one copy of the existing arrays: depths and
        prompts of the new nodes come from their parents, and only the parents' leaf flags change.

        Parameters
        ----------
        parent : array_like of int
            Parent of each appended node (an existing node id, or an earlier appended one).
        reward : array_like of float
            Reward of each appended leaf, NaN for appended internal nodes.
        origin : int or array_like of int
            :class:`Origin` code of the appended nodes.
        cost : float or array_like of float, default 1
            Cost of each appended node.
        validate : bool, default True
            Check the arguments and every invariant of the result. ``False`` is the trusted fast path
            for code that grows a forest it built itself (the simulator, a step driver): no check at
            all, so bad input gives a corrupt forest instead of an error. Call :meth:`validate` once
            when the growing is done (tests do), and keep ``validate=True`` wherever the input comes
            from outside. With valid input both paths return equal forests.

        Examples
        --------
        >>> f = RolloutForest.from_parents([-1, 0, 1], [float("nan"), float("nan"), 0.0])
        >>> g = f.append([1, 3], [float("nan"), 1.0], origin=Origin.CONTINUATION, validate=False)
        >>> g.validate().depth.tolist(), g.is_leaf.tolist()
        ([0, 1, 2, 2, 3], [False, False, True, False, True])
        """
        if not validate:
            return self._append_trusted(np.asarray(parent, np.int64), np.asarray(reward, float), origin, cost)
        parent = integral("parent", parent)
        reward = _checks.vector("reward", reward, dtype=float)
        _checks.same_length(parent=parent, reward=reward)
        if (parent == -1).any():
            raise ValueError("`parent` of an appended node must be an existing or appended node, not -1")
        n = len(self)
        bad = (parent < -1) | (parent >= n + np.arange(len(parent)))
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"appended node {n + j} has parent {int(parent[j])}; it must be an existing node or an "
                f"earlier appended one, in [0, {n + j - 1}]"
            )
        old = parent[parent < n]
        if self.is_leaf[old].any():
            i = int(old[self.is_leaf[old]][0])
            raise ValueError(f"node {i} is a finished leaf (reward {float(self.reward[i])!r}) and cannot get children")
        grown = self._append_trusted(parent, reward, origin, cost)
        return RolloutForest(*(getattr(grown, f) for f in _FIELDS))  # checks every invariant

    def _append_trusted(self, parent, reward, origin, cost) -> "RolloutForest":
        """:meth:`append` without checks: the new arrays from the parents, by pointer jumping."""
        n, n_new = len(self), len(parent)
        hop, dist = _existing_ancestor(parent, n)
        is_leaf = np.concatenate([self.is_leaf, np.ones(n_new, bool)])
        is_leaf[parent] = False
        return RolloutForest._trusted(
            parent=np.concatenate([self.parent, parent]),
            prompt=np.concatenate([self.prompt, self.prompt[hop]]),
            depth=np.concatenate([self.depth, self.depth[hop] + dist]),
            reward=np.concatenate([self.reward, reward]),
            is_leaf=is_leaf,
            origin=np.concatenate([self.origin, np.broadcast_to(np.asarray(origin, np.int8), (n_new,))]),
            cost=np.concatenate([self.cost, np.broadcast_to(np.asarray(cost, float), (n_new,))]),
            binary_rewards=self.binary_rewards,
        )

    @classmethod
    def _trusted(cls, **fields) -> "RolloutForest":
        """A forest from fresh arrays of the right dtypes that the caller guarantees valid; no checks."""
        forest = object.__new__(cls)
        for name, value in fields.items():
            if isinstance(value, np.ndarray):
                value.setflags(write=False)
            object.__setattr__(forest, name, value)
        return forest

    # -----------------------------------------------------------------------------------------------
    # Sizes and simple views
    # -----------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.parent)

    def __repr__(self) -> str:
        return (
            f"RolloutForest(prompts={self.n_prompts}, nodes={len(self)}, leaves={self.n_leaves}, "
            f"max_depth={int(self.depth.max(initial=0))})"
        )

    @property
    def n_leaves(self) -> int:
        return int(self.is_leaf.sum())

    @cached_property
    def roots(self) -> np.ndarray:
        """Node ids of the roots, in order."""
        return np.flatnonzero(self.parent == -1)

    @property
    def n_prompts(self) -> int:
        return len(self.roots)

    @cached_property
    def leaves(self) -> np.ndarray:
        return np.flatnonzero(self.is_leaf)

    @cached_property
    def root_of(self) -> np.ndarray:
        """Root node id of every node's tree."""
        return _roots(self.parent)

    @cached_property
    def tree_index(self) -> np.ndarray:
        """Position of every node's tree in :attr:`roots` (0 .. n_prompts - 1): a dense group id."""
        rank = np.cumsum(self.parent == -1) - 1
        return rank[self.root_of]

    @cached_property
    def _levels(self) -> list[np.ndarray]:
        """Node ids grouped by depth (index d holds the nodes at depth d)."""
        if len(self) == 0:
            return []
        order = _stable_order(self.depth)
        bounds = np.searchsorted(self.depth[order], np.arange(int(self.depth.max()) + 2))
        return [order[bounds[d]:bounds[d + 1]] for d in range(len(bounds) - 1)]

    @cached_property
    def _child_index(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR layout of children: children of i are ``order[ptr[i]:ptr[i+1]]``, in creation order."""
        nonroot = np.flatnonzero(self.parent != -1)
        order = nonroot[np.argsort(self.parent[nonroot], kind="stable")]
        ptr = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.parent[nonroot], minlength=len(self)), out=ptr[1:])
        return ptr, order

    @property
    def n_children(self) -> np.ndarray:
        ptr, _ = self._child_index
        return np.diff(ptr)

    # -----------------------------------------------------------------------------------------------
    # Traversal
    # -----------------------------------------------------------------------------------------------

    def _check_node(self, node) -> int:
        node = _checks.count("node", node)
        if node >= len(self):
            raise ValueError(f"`node` must be a node id in [0, {len(self) - 1}], got {node}")
        return node

    def children(self, node: int) -> np.ndarray:
        """Children of ``node`` in creation order (the first continues the node's own rollout)."""
        node = self._check_node(node)
        ptr, order = self._child_index
        return order[ptr[node]:ptr[node + 1]]

    def preorder(self) -> np.ndarray:
        """Every node id in depth-first preorder: each root in id order, then its children's subtrees in
        creation order, so a subtree is one contiguous run of the result (as long as the subtree's size).

        Examples
        --------
        >>> nan = float("nan")
        >>> f = RolloutForest.from_parents([-1, 0, 0, 1, -1, 4], [nan, nan, 1.0, 0.0, nan, 1.0])
        >>> f.preorder().tolist()
        [0, 1, 3, 2, 4, 5]
        """
        ptr, kids = self._child_index
        out = np.empty(len(self), dtype=np.int64)
        nxt = 0
        for root in self.roots.tolist():
            stack = [root]
            while stack:
                node = stack.pop()
                out[nxt] = node
                nxt += 1
                stack.extend(reversed(kids[ptr[node]:ptr[node + 1]].tolist()))
        return out

    def path_to_root(self, node: int) -> np.ndarray:
        """Node ids from ``node`` up to its root, inclusive."""
        node = self._check_node(node)
        path = [node]
        while self.parent[path[-1]] != -1:
            path.append(int(self.parent[path[-1]]))
        return np.asarray(path, dtype=np.int64)

    def descendants(self, node: int) -> np.ndarray:
        """All nodes of the subtree under ``node`` (itself included), in increasing id order."""
        node = self._check_node(node)
        ptr, order = self._child_index
        out, frontier = [node], [node]
        while frontier:
            nxt = np.concatenate([order[ptr[i]:ptr[i + 1]] for i in frontier]).tolist()
            out.extend(nxt)
            frontier = nxt
        return np.sort(np.asarray(out, dtype=np.int64))

    def leaves_under(self, node: int) -> np.ndarray:
        """Leaf ids of the subtree under ``node``."""
        sub = self.descendants(node)
        return sub[self.is_leaf[sub]]

    def iter_levels(self, *, bottom_up: bool = False) -> Iterator[np.ndarray]:
        """Yield node ids one depth level at a time (roots first, or deepest first)."""
        levels = self._levels
        yield from (reversed(levels) if bottom_up else levels)

    def subtree_sum(self, values) -> np.ndarray:
        """For every node, the sum of ``values`` over its subtree (itself included). Vectorised by level.

        Summing an indicator of leaves gives leaf counts; summing rewards placed on leaves gives the
        total reward under each node.
        """
        out = np.array(_checks.vector("values", values, dtype=float), copy=True)
        _checks.same_length(values=out, parent=self.parent)
        for level in list(self.iter_levels(bottom_up=True))[:-1]:  # every level but the roots
            out += np.bincount(self.parent[level], weights=out[level], minlength=len(self))
        return out

    def subtree_extreme(self, values, *, largest: bool) -> np.ndarray:
        """For every node, the maximum (``largest=True``) or minimum of ``values`` over its subtree."""
        out = np.array(_checks.vector("values", values, dtype=float), copy=True)
        _checks.same_length(values=out, parent=self.parent)
        ufunc = np.maximum if largest else np.minimum
        for level in list(self.iter_levels(bottom_up=True))[:-1]:
            ufunc.at(out, self.parent[level], out[level])
        return out

    @cached_property
    def mixed(self) -> np.ndarray:
        """True for nodes whose leaves hold two different rewards, decided exactly (min < max).

        (A floating-point variance of equal non-integer rewards is ~1e-17, not 0; this is not fooled.)
        """
        hi = self.subtree_extreme(np.where(self.is_leaf, self.reward, -np.inf), largest=True)
        lo = self.subtree_extreme(np.where(self.is_leaf, self.reward, np.inf), largest=False)
        return lo < hi

    @cached_property
    def leaf_count(self) -> np.ndarray:
        """n_y: number of leaves under each node (1 for a leaf)."""
        return self.subtree_sum(self.is_leaf.astype(float)).astype(np.int64)

    @cached_property
    def first_child(self) -> np.ndarray:
        """Each node's first (primary) child, -1 for leaves."""
        ptr, order = self._child_index
        out = np.full(len(self), -1, dtype=np.int64)
        has = ptr[1:] > ptr[:-1]
        out[has] = order[ptr[:-1][has]]
        return out

    @cached_property
    def starts_rollout(self) -> np.ndarray:
        """True for a node that begins a rollout: a child of a root, or a non-first child (a branch)."""
        out = np.zeros(len(self), dtype=bool)
        nonroot = self.parent != -1
        p = self.parent[nonroot]
        out[nonroot] = (self.parent[p] == -1) | (self.first_child[p] != np.flatnonzero(nonroot))
        return out

    @cached_property
    def rollout_start(self) -> np.ndarray:
        """For every non-root node, the first turn of its rollout (itself if it starts one); -1 for roots."""
        start = np.full(len(self), -1, dtype=np.int64)
        for level in list(self.iter_levels())[1:]:
            start[level] = np.where(self.starts_rollout[level], level, start[self.parent[level]])
        return start

    @cached_property
    def rollout_anchor(self) -> np.ndarray:
        """For every non-root node, the node its rollout was sampled from (a root or a branched prefix).

        -1 for roots. A bare turn's anchor is its root; a continuation's anchor is the prefix it was
        branched from.
        """
        anchor = np.full(len(self), -1, dtype=np.int64)
        for level in list(self.iter_levels())[1:]:
            p = self.parent[level]
            anchor[level] = np.where(self.starts_rollout[level], p, anchor[p])
        return anchor

    @cached_property
    def factual_leaf(self) -> np.ndarray:
        """For every non-root node, the leaf reached by following first children (its own rollout's end).

        -1 for roots, which have one primary child per bare rollout.
        """
        out = np.where(self.is_leaf, np.arange(len(self)), -1)
        for level in list(self.iter_levels(bottom_up=True))[:-1]:
            internal = level[~self.is_leaf[level]]
            out[internal] = out[self.first_child[internal]]
        out[self.parent == -1] = -1
        return out

    def prefix_anchors(self) -> np.ndarray:
        """Non-terminal, non-root nodes of bare rollouts: where stage-2 continuations may branch from."""
        return np.flatnonzero((self.origin == Origin.BARE) & ~self.is_leaf)



def _existing_ancestor(parent: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For nodes ``n, n + 1, ...`` appended with ``parent``: (nearest ancestor among the first ``n`` nodes,
    turns from it), so that depth = depth[ancestor] + turns and prompt = prompt[ancestor].

    When every appended node whose parent is appended too hangs below the node just before it (each
    rollout's turns numbered consecutively, as the simulator grows them), node j's ancestor is the parent
    of the chain's first node s <= j and its turns j - s + 1: one pass. Otherwise pointer jumping: each
    node walks up through appended nodes, doubling the distance covered per pass.
    """
    own = n + np.arange(parent.size)
    inside = np.flatnonzero(parent >= n)
    if (parent[inside] == own[inside] - 1).all():
        first = np.where(parent < n, np.arange(parent.size), 0)
        np.maximum.accumulate(first, out=first)  # the start of each node's chain
        return parent[first], np.arange(1, parent.size + 1) - first
    hop, dist = parent.copy(), np.ones(parent.size, np.int64)
    while inside.size:
        up = hop[inside] - n
        dist[inside] += dist[up]
        hop[inside] = hop[up]
        inside = inside[hop[inside] >= n]
    return hop, dist
