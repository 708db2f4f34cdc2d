"""RolloutForest: builders, validation messages, traversal helpers against obvious loops."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trace_theory import ForestBuilder, Origin, RolloutForest

from .strategies import forests

NAN = float("nan")


def test_from_nested_layout_and_defaults():
    f = RolloutForest.from_nested([[1, [0, 1]], [[[1], 0]]], prompt=[10, 20])
    assert f.parent.tolist() == [-1, 0, 0, 2, 2, -1, 5, 6, 7, 6]
    assert f.depth.tolist() == [0, 1, 1, 2, 2, 0, 1, 2, 3, 2]
    assert f.prompt.tolist() == [10] * 5 + [20] * 5
    assert [Origin(o).name for o in f.origin] == [
        "ROOT", "BARE", "BARE", "BARE", "CONTINUATION", "ROOT", "BARE", "BARE", "BARE", "CONTINUATION",
    ]
    assert f.cost.tolist() == [0, 1, 1, 1, 1, 0, 1, 1, 1, 1]
    assert f.n_prompts == 2 and f.n_leaves == 5 and len(f) == 10
    assert f.prefix_anchors().tolist() == [2, 6, 7]


def test_arrays_are_read_only_copies():
    parent = np.array([-1, 0, 0])
    f = RolloutForest.from_parents(parent, [NAN, 1, 0])
    parent[1] = 5
    assert f.parent.tolist() == [-1, 0, 0]
    with pytest.raises(ValueError):
        f.reward[1] = 0.0


@pytest.mark.parametrize(
    "parent, reward, kwargs, message",
    [
        ([-1, 2, 1], [NAN, 1, 1], {}, r"the parent links form a cycle through nodes \[1, 2\]"),
        ([-1, 1], [NAN, 1], {}, r"cycle through nodes \[1\]"),
        ([-1, 2, 0], [NAN, 1, NAN], {}, r"node 1 comes before its parent 2; nodes must be in topological order"),
        ([-1, 7], [NAN, 1], {}, r"node 1 has parent 7, outside \[-1, 1\]"),
        ([-1, 0, 0], [NAN, 1, NAN], {}, r"leaf 2 has no reward \(got nan\)"),
        ([-1, 0], [NAN, 0.5], {}, r"leaf 1 has reward 0.5, but rewards are declared binary"),
        ([-1, 0, 1], [0.0, NAN, 1], {}, r"internal node 0 has reward 0.0; only leaves carry rewards"),
        ([-1], [NAN], {}, r"root 0 \(prompt 0\) has no rollouts"),
        ([-1, 0, -1, 2], [NAN, 1, NAN, 0], {"prompt": [3, 3]}, r"prompt 3 has 2 roots; expected one per prompt"),
        ([-1, 0], [NAN, 1], {"prompt": [1, 2]}, r"`prompt` gives 2 ids for 1 roots"),
        ([-1, 0], [NAN, 1], {"cost": [0, -1]}, r"node 1 has cost -1.0; costs must be finite and non-negative"),
        ([-1, 0], [NAN, 1], {"origin": [0, 7]}, r"node 1 has origin code 7"),
        ([-1, 0], [NAN, 1], {"origin": [1, 1]}, r"node 0: origin ROOT is for exactly the nodes without a parent"),
        ([-1, 0, 1], [NAN, NAN, 1], {"origin": [0, 2, 1]}, r"node 2 has origin BARE but its parent 1 is a CONTINUATION turn"),
        ([-1, 0], [NAN, 1, 1], {}, r"arrays must have the same length: `parent` has 2, `reward` has 3"),
        ([[-1, 0]], [NAN, 1], {}, r"`parent` must be one-dimensional"),
        ([-1, 0.5], [NAN, 1], {}, r"`parent` must hold integers, got 0.5"),
    ],
)
def test_malformed_forests_are_rejected_with_a_clear_message(parent, reward, kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutForest.from_parents(parent, reward, **kwargs)


def test_constructor_checks_derived_fields():
    f = RolloutForest.from_nested([[1, 0]])
    fields = dict(parent=f.parent, prompt=f.prompt, depth=f.depth, reward=f.reward, is_leaf=f.is_leaf,
                  origin=f.origin, cost=f.cost)
    with pytest.raises(ValueError, match=r"node 1 has depth 2 but its parent 0 has depth 0"):
        RolloutForest(**{**fields, "depth": [0, 2, 1]})
    with pytest.raises(ValueError, match=r"node 0 is marked as a leaf but has children"):
        RolloutForest(**{**fields, "is_leaf": [True, True, True]})
    with pytest.raises(ValueError, match=r"node 2 has prompt 4 but its parent 0 has prompt 0"):
        RolloutForest(**{**fields, "prompt": [0, 0, 4]})


def test_non_binary_rewards_when_declared():
    f = RolloutForest.from_parents([-1, 0, 0], [NAN, 0.25, -3.0], binary_rewards=False)
    assert f.reward[1:].tolist() == [0.25, -3.0]


@pytest.mark.parametrize(
    "trees, message",
    [
        ([1], r"`trees\[0\]` must be a list of rollouts \(a root cannot be a leaf\)"),
        ([[]], r"trees\[0\] is an empty list: a node needs children or a reward"),
        ([[1, []]], r"trees\[0\]\[1\] is an empty list"),
        ([[1, "x"]], r"trees\[0\]\[1\] must be a list or a reward, got 'x'"),
        ("abc", r"`trees` must be a sequence of nested lists"),
    ],
)
def test_from_nested_errors(trees, message):
    with pytest.raises(ValueError, match=message):
        RolloutForest.from_nested(trees)


def naive_children(f, i):
    return [j for j in range(len(f)) if f.parent[j] == i]


def naive_leaves_under(f, i):
    out = []
    for j in range(len(f)):
        if f.is_leaf[j] and i in f.path_to_root(j).tolist():
            out.append(j)
    return out


@given(forests())
def test_traversal_helpers_match_naive_loops(f):
    for i in range(len(f)):
        assert f.children(i).tolist() == naive_children(f, i)
        assert f.leaves_under(i).tolist() == naive_leaves_under(f, i)
        path = f.path_to_root(i).tolist()
        assert path[0] == i and f.parent[path[-1]] == -1 and len(path) == f.depth[i] + 1
        assert f.leaf_count[i] == len(naive_leaves_under(f, i))
        assert f.root_of[i] == path[-1]
        kids = naive_children(f, i)
        assert f.first_child[i] == (kids[0] if kids else -1)
        if f.parent[i] != -1:
            # The factual leaf follows first children down from the node.
            node = i
            while not f.is_leaf[node]:
                node = naive_children(f, node)[0]
            assert f.factual_leaf[i] == node
            # The anchor of a node's rollout: climb while the node continues its parent's rollout.
            node = i
            while f.parent[f.parent[node]] != -1 and naive_children(f, f.parent[node])[0] == node:
                node = f.parent[node]
            assert f.rollout_anchor[i] == f.parent[node]
            assert f.rollout_start[i] == node  # the first turn of the same rollout
        else:
            assert f.rollout_start[i] == -1
    values = np.arange(len(f), dtype=float)
    sums = f.subtree_sum(values)
    for i in range(len(f)):
        assert sums[i] == sum(values[j] for j in f.descendants(i))


@given(forests())
def test_append_extends_without_touching_existing_nodes(f):
    anchors = np.flatnonzero(~f.is_leaf & (f.parent != -1))
    if anchors.size == 0:
        return
    g = f.append(np.array([anchors[0], len(f)]), [NAN, 1.0], origin=Origin.CONTINUATION, cost=[5, 6])
    assert len(g) == len(f) + 2
    assert np.array_equal(g.parent[: len(f)], f.parent)
    assert g.leaf_count[anchors[0]] == f.leaf_count[anchors[0]] + 1
    assert g.origin[-2:].tolist() == [Origin.CONTINUATION] * 2 and g.cost[-2:].tolist() == [5.0, 6.0]


FIELDS = ("parent", "prompt", "depth", "reward", "is_leaf", "origin", "cost", "binary_rewards")


def assert_same_forest(a, b):
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and not x.flags.writeable and not y.flags.writeable, name
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
        else:
            assert x == y, name


@st.composite
def growth(draw, f):
    """Appended turns for ``f``: parents among its unfinished nodes or earlier appended ones."""
    open_ = np.flatnonzero(~f.is_leaf).tolist()
    n = draw(st.integers(1, 12))
    parent = []
    for j in range(n):
        parent.append(draw(st.sampled_from(open_ + [len(f) + i for i in range(j)])))
    parent = np.array(parent)
    leaf = ~np.isin(len(f) + np.arange(n), parent)
    reward = np.where(leaf, np.array(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n))), np.nan)
    origin = draw(st.sampled_from([Origin.BARE, Origin.CONTINUATION]))
    cost = draw(st.one_of(st.just(1.0), st.lists(st.integers(0, 9), min_size=n, max_size=n).map(np.array)))
    return parent, reward, origin, cost


@given(st.data())
def test_trusted_append_builds_exactly_the_validated_forest(data):
    f = data.draw(forests())
    parent, reward, origin, cost = data.draw(growth(f))
    # Origin BARE below a continuation is invalid; keep the comparison to growth that validates.
    if origin == Origin.BARE and (f.origin[parent[parent < len(f)]] == Origin.CONTINUATION).any():
        origin = Origin.CONTINUATION
    checked = f.append(parent, reward, origin=origin, cost=cost)
    trusted = f.append(parent, reward, origin=origin, cost=cost, validate=False)
    assert_same_forest(trusted, checked)
    assert trusted.validate() is trusted
    # Grown twice, the trusted forest still matches one built from scratch.
    again = trusted.append([len(f)] if not trusted.is_leaf[len(f)] else [f.roots[0]], [1.0], origin=Origin.CONTINUATION,
                           validate=False)
    scratch = RolloutForest.from_parents(again.parent, again.reward, prompt=again.prompt[again.roots],
                                         origin=again.origin, cost=again.cost)
    assert_same_forest(again, scratch)


@given(forests())
def test_trusted_from_parents_builds_exactly_the_validated_forest(f):
    args = (f.parent.copy(), f.reward.copy())
    kwargs = dict(prompt=f.prompt[f.roots] + 3, origin=f.origin.copy(), cost=f.cost.copy())
    trusted = RolloutForest.from_parents(*args, **kwargs, validate=False)
    assert_same_forest(trusted, RolloutForest.from_parents(*args, **kwargs))
    given_depth = RolloutForest.from_parents(*args, **kwargs, validate=False, depth=f.depth)
    assert_same_forest(given_depth, RolloutForest.from_parents(*args, **kwargs, depth=f.depth))
    assert_same_forest(given_depth, trusted)
    args[0][:] = 0  # the trusted forest owns its arrays
    assert trusted.validate().parent[0] == -1


def test_a_given_depth_is_checked_against_the_links_unless_trusted():
    parent, reward = [-1, 0, 1], [NAN, NAN, 1.0]
    with pytest.raises(ValueError, match=r"`depth` does not match the parent links \(first at node 2\)"):
        RolloutForest.from_parents(parent, reward, depth=[0, 1, 1])
    assert RolloutForest.from_parents(parent, reward, depth=[0, 1, 2]).depth.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "parent, reward, message",
    [
        ([9], [1.0], r"appended node 5 has parent 9; it must be an existing node or an earlier appended one, in \[0, 4\]"),
        ([2, 6], [NAN, 1.0], r"appended node 6 has parent 6"),
        ([2], [NAN], r"leaf 5 has no reward"),
        ([2], [0.5], r"leaf 5 has reward 0.5, but rewards are declared binary"),
        ([2, 2], [1.0], r"arrays must have the same length"),
        ([2.5], [1.0], r"`parent` must hold integers, got 2.5"),
    ],
)
def test_validated_append_rejects_bad_growth(parent, reward, message):
    f = RolloutForest.from_nested([[1, [0, 1]]])
    with pytest.raises(ValueError, match=message):
        f.append(parent, reward, origin=Origin.CONTINUATION)


def test_trusted_forest_is_checked_when_validated():
    """The trusted path checks nothing; ``validate()`` afterwards finds what it let through."""
    f = RolloutForest.from_nested([[1, [0, 1]]])
    bad = f.append([2], [0.5], origin=Origin.CONTINUATION, validate=False)
    with pytest.raises(ValueError, match=r"leaf 5 has reward 0.5"):
        bad.validate()


def test_append_rejects_children_of_finished_leaves_and_new_roots():
    f = RolloutForest.from_nested([[1, [0, 1]]])
    with pytest.raises(ValueError, match=r"node 1 is a finished leaf \(reward 1.0\) and cannot get children"):
        f.append([1], [0.0], origin=Origin.CONTINUATION)
    with pytest.raises(ValueError, match=r"`parent` of an appended node must be an existing or appended node"):
        f.append([-1], [NAN], origin=Origin.ROOT)


def test_node_argument_checks():
    f = RolloutForest.from_nested([[1, 0]])
    with pytest.raises(ValueError, match=r"`node` must be a node id in \[0, 2\], got 3"):
        f.children(3)
    with pytest.raises(ValueError, match=r"`node` must be a non-negative integer, got -1"):
        f.path_to_root(-1)


class ForestBuilderMachine(RuleBasedStateMachine):
    """Grow a forest through ForestBuilder, mirroring it in plain Python, and compare on build."""

    def __init__(self):
        super().__init__()
        self.builder = ForestBuilder()
        self.parent: list[int] = []
        self.reward: dict[int, float] = {}
        self.next_prompt = 0

    def open_nodes(self):
        return [i for i in range(len(self.parent)) if i not in self.reward]

    @rule()
    def add_root(self):
        node = self.builder.add_root(self.next_prompt)
        self.next_prompt += 1
        assert node == len(self.parent)
        self.parent.append(-1)

    @precondition(lambda self: self.open_nodes())
    @rule(data=st.data())
    def add_turn(self, data):
        p = data.draw(st.sampled_from(self.open_nodes()))
        node = self.builder.add_turn(p, cost=3)
        assert node == len(self.parent)
        self.parent.append(p)

    @precondition(lambda self: any(self.parent[i] != -1 and i not in self.parent for i in self.open_nodes()))
    @rule(data=st.data(), r=st.sampled_from([0.0, 1.0]))
    def finish(self, data, r):
        node = data.draw(st.sampled_from([i for i in self.open_nodes() if self.parent[i] != -1 and i not in self.parent]))
        self.builder.finish(node, r)
        self.reward[node] = r

    @rule()
    def finishing_twice_or_below_a_leaf_is_rejected(self):
        if self.reward:
            node = next(iter(self.reward))
            with pytest.raises(ValueError, match=r"already has reward"):
                self.builder.finish(node, 1.0)
            with pytest.raises(ValueError, match=r"is a finished leaf"):
                self.builder.add_turn(node)

    @rule(r=st.sampled_from([0.0, 1.0]))
    def finish_every_open_rollout(self, r):
        for i in self.open_nodes():
            if self.parent[i] != -1 and i not in self.parent:
                self.builder.finish(i, r)
                self.reward[i] = r

    @invariant()
    def build_matches_mirror_when_complete(self):
        complete = all(
            (i in self.reward) or (i in self.parent) for i in range(len(self.parent))
        ) and all(i in self.parent for i in range(len(self.parent)) if self.parent[i] == -1)
        if not self.parent or not complete:
            return
        f = self.builder.build()
        assert f.parent.tolist() == self.parent
        for i, r in self.reward.items():
            assert f.reward[i] == r and f.is_leaf[i]


TestForestBuilder = ForestBuilderMachine.TestCase


def test_builder_errors():
    b = ForestBuilder()
    root = b.add_root(0)
    with pytest.raises(ValueError, match=r"`parent` must be an existing node id in \[0, 0\], got 4"):
        b.add_turn(4)
    with pytest.raises(ValueError, match=r"`node` must be an existing non-root node, got 0"):
        b.finish(root, 1.0)
    turn = b.add_turn(root)
    b.add_turn(turn)
    with pytest.raises(ValueError, match=r"node 1 has children; only leaves carry rewards"):
        b.finish(turn, 1.0)
    with pytest.raises(ValueError, match=r"`prompt` must be a non-negative integer, got -2"):
        b.add_root(-2)


def test_negative_prompt_ids_are_rejected():
    with pytest.raises(ValueError, match=r"prompt ids must be non-negative, got -4"):
        RolloutForest.from_parents([-1, 0], [NAN, 1], prompt=[-4])


@given(forests())
def test_preorder_is_the_recursive_depth_first_order(f):
    """Roots in id order, each followed by its children's subtrees in creation order."""
    def visit(node):
        return [node] + [n for child in f.children(node).tolist() for n in visit(child)]

    assert f.preorder().tolist() == [n for root in f.roots.tolist() for n in visit(root)]
