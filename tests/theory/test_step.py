"""The step driver against a scripted world whose outcomes are fixed: every policy, every round count."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trace_theory import (
    KINDS,
    POLICIES,
    ForestBuilder,
    Origin,
    RolloutForest,
    Prediction,
    RolloutBudget,
    get_policy,
    round_shares,
    run_step,
)
from trace_theory.step import Kind, in_rollout_order


class ScriptedWorld:
    """Rollouts with fixed outcomes: the j-th rollout ever started at node n has ``length(n, j)`` turns
    (at most ``horizon - depth(n)``) and reward ``reward(n, j)``; predictions are fixed functions of the
    prompt and the depth. Every question the driver asks is logged."""

    def __init__(self, pool, *, horizon=3, seed=0, prompt_v=None):
        self.pool, self.horizon = pool, horizon
        self.table = np.random.default_rng(seed).random((64, 4096))  # outcome draws, fixed by the seed
        self.prompt_v = np.linspace(0.05, 0.95, pool) if prompt_v is None else np.asarray(prompt_v, float)
        self.builder = ForestBuilder()
        self.node_prompt, self.node_depth, self.started = [], [], {}
        self.log = []

    def _draw(self, node, j, what):
        return self.table[(node * 7 + what) % 64, j % 4096]

    def predict_prompts(self, prompts, *, concentration):
        self.log.append(("predict_prompts", prompts.copy()))
        v = self.prompt_v[prompts]
        return Prediction(v, np.full(len(v), 5.0) if concentration else None)

    def predict_nodes(self, nodes, *, concentration):
        self.log.append(("predict_nodes", nodes.copy()))
        v = np.array([np.clip(self.prompt_v[self.node_prompt[n]] + 0.1 * self.node_depth[n], 0.01, 0.99) for n in nodes])
        return Prediction(v, np.full(len(v), 5.0) if concentration else None)

    def _add(self, node, parent, prompt, depth, origin=None):
        self.node_prompt.append(prompt)
        self.node_depth.append(depth)
        return node

    def _rollout(self, start, origin):
        j = self.started.get(start, 0)
        self.started[start] = j + 1
        depth, prompt = self.node_depth[start], self.node_prompt[start]
        turns = 1 + int(self._draw(start, j, 0) * (self.horizon - depth))
        node = start
        for t in range(turns):
            node = self._add(self.builder.add_turn(node, origin=origin), node, prompt, depth + t + 1)
        v = self.prompt_v[prompt]
        self.builder.finish(node, float(self._draw(start, j, 1) < v))

    def plant(self, prompts, counts, events=None):
        self.log.append(("plant", prompts.copy(), counts.copy()))
        planted = []  # per tree, the first node of each bare rollout
        for p, c in zip(prompts.tolist(), counts.tolist()):
            root = self._add(self.builder.add_root(p), -1, p, 0)
            planted.append([])
            for _ in range(c):
                planted[-1].append(len(self.node_depth))
                self._rollout(root, Origin.BARE)
        forest = self.builder.build()
        return forest if events is None else self._report(forest, planted, events)

    def _report(self, forest, planted, events):
        """A streaming mode's events, tree by tree: each bare rollout's boundaries and end (where asked),
        then the tree's end; then the rest. What each answer asks for is grown at once."""
        predict = lambda nodes: lambda concentration: self.predict_nodes(np.asarray(nodes), concentration=concentration)
        roots, anchors = forest.roots, in_rollout_order(forest, forest.prefix_anchors())
        mine = [anchors[forest.tree_index[anchors] == t] for t in range(len(roots))]
        for t, firsts in enumerate(planted):
            for j, first in enumerate(firsts if events.boundaries else []):
                length = int(forest.depth[forest.factual_leaf[first]])
                at = lambda depth: int(roots[t]) if depth == 0 else first + depth - 1  # noqa: E731
                for depth in range(1, length):
                    self._branches(events.turn_boundary(t, j, depth, predict([at(depth)])), at)
                leaf = forest.factual_leaf[first]
                self._branches(events.rollout_ended(t, j, length, float(forest.reward[leaf])), at)
            reward = forest.reward[forest.factual_leaf[mine[t]]]
            self._started(mine[t], events.tree_ended(t, reward, predict(mine[t])))
        top_ups, more = events.rest()
        self._started(roots, top_ups)
        for t in range(len(roots)):
            self._started(mine[t], more[t])
        return self.builder.build()

    def _branches(self, branches, at):
        for depth, count in branches:
            self._started([at(depth)], [count])

    def _started(self, nodes, counts):
        nodes, counts = np.asarray(nodes, dtype=np.int64), np.asarray(counts, dtype=np.int64)
        kinds = [Kind.TOP_UP if self.node_depth[n] == 0 else Kind.CONTINUATION for n in nodes.tolist()]
        self.log.append(("stream", [(int(n), kind, int(c)) for n, kind, c in zip(nodes, kinds, counts) if c]))
        for n, kind, c in zip(nodes.tolist(), kinds, counts.tolist()):
            for _ in range(c):
                self._rollout(n, Origin.BARE if kind == Kind.TOP_UP else Origin.CONTINUATION)

    def grow(self, starts):
        self.log.append(("grow", starts.tuples()))
        for node, kind, count in starts.tuples():
            origin = Origin.CONTINUATION if kind == Kind.CONTINUATION else Origin.BARE
            for _ in range(count):
                self._rollout(node, origin)
        return self.builder.build()


def _step(name, budget, *, pool=12, rounds=1, seed=0, horizon=3, **changes):
    world = ScriptedWorld(pool, seed=seed, horizon=horizon)
    policy = get_policy(name, **changes)
    record = run_step(world, policy, budget, pool=pool, rng=np.random.default_rng(seed), expansion_rounds=rounds)
    return world, policy, record


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(POLICIES.names()),
    roots=st.integers(2, 40),
    continuations=st.integers(0, 4),
    rounds=st.integers(1, 3),
    horizon=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
@example(name="trace", roots=8, continuations=3, rounds=3, horizon=1, seed=0)  # no prefix: all top-ups
def test_every_policy_spends_exactly_its_budget_in_every_round_count(name, roots, continuations, rounds, horizon, seed):
    pool = 24
    world = ScriptedWorld(pool, horizon=horizon, seed=seed % 1000)
    policy = get_policy(name, group_size=4)
    budget = RolloutBudget(roots, continuations)
    record = run_step(world, policy, budget, pool=pool, rng=np.random.default_rng(seed), expansion_rounds=rounds)
    forest = record.forest.validate()
    if policy.dynamic_sampling:
        assert forest.n_leaves <= budget.total and forest.n_leaves % 4 == 0
    else:
        assert forest.n_leaves == budget.total == record.rollouts
    # The record's counts are the forest's: bare rollouts start at roots, continuations at prefixes.
    starts = forest.starts_rollout
    assert record.counts["continuation"] == int((starts & (forest.origin == Origin.CONTINUATION)).sum())
    assert record.counts["bare"] + record.counts["top_up"] == int((starts & (forest.origin == Origin.BARE)).sum())
    assert sum(record.continuations_by_round) == record.counts["continuation"]
    groups = np.zeros(pool, dtype=np.int64)
    groups[forest.prompt[forest.roots]] = forest.n_children[forest.roots]
    assert np.array_equal(groups, record.groups)
    # Predictions are asked for exactly when a rule reads them.
    asked = {entry[0] for entry in world.log}
    assert ("predict_prompts" in asked) == policy.predicts_roots
    if "predict_nodes" in asked:
        assert policy.predicts_prefixes


@pytest.mark.parametrize("name", ["trace", "trace_beta", "prefix_only", "uniform_tree", "active_root_uniform_prefix"])
def test_one_round_is_the_two_stage_algorithm(name):
    """R = 1: roots from ``allocate_roots`` on the predictions, continuations from ``allocate_prefixes``
    on the bare rollouts' prefixes with budgets m_i N, the rest as top-ups; re-derived by hand."""
    world, policy, record = _step(name, RolloutBudget(16, 2))
    forest = record.forest
    v = world.prompt_v
    m = policy.allocate_roots(v, 16, concentration=np.full(len(v), 5.0))
    assert record.counts == {"bare": 16, "top_up": 0, "continuation": 32}  # these rollouts leave prefixes
    anchors = forest.prefix_anchors()
    if policy.predicts_prefixes:
        assert np.array_equal(record.node_ids, anchors) and set(record.node_round.tolist()) == {1}
        vp = record.node_v
    else:
        assert record.node_ids.size == 0
        vp = np.full(anchors.size, 0.5)
    np.testing.assert_array_equal(record.groups, m)
    alloc = policy.allocate_prefixes(vp, forest.reward[forest.factual_leaf[anchors]], forest.tree_index[anchors],
                                     2 * m[m > 0])
    assert np.array_equal(forest.n_children[anchors] - 1, alloc.k) and not alloc.unspent.any()
    assert world.log[0][0] == ("predict_prompts" if policy.predicts_roots else "plant")


def test_later_rounds_branch_from_the_rollouts_the_previous_round_added():
    world, policy, record = _step("trace", RolloutBudget(16, 3), rounds=3, horizon=8)
    forest = record.forest
    assert record.continuations_by_round == (16, 16, 16)  # 48 = 3 x 16, evenly; every round had anchors
    assert sorted(set(record.node_round.tolist())) == [1, 2, 3]
    grows = [entry[1] for entry in world.log if entry[0] == "grow"]
    for r, starts in zip((2, 3), grows[1:]):
        branched = np.array([node for node, kind, _ in starts if kind == Kind.CONTINUATION])
        assert np.isin(branched, record.node_ids[record.node_round == r]).all()
        # round r's anchors are prefixes of continuations, and all of them begin inside round r - 1's additions
        assert (forest.origin[branched] == Origin.CONTINUATION).all()
        previous = record.node_ids[record.node_round == r - 1]
        assert branched.min() > previous.max()


def test_rounds_split_each_prompts_budget_evenly_front_loaded():
    shares = round_shares([7, 2, 0, 3], 3)
    assert shares.tolist() == [[3, 1, 0, 1], [2, 1, 0, 1], [2, 0, 0, 1]]
    assert shares.sum(0).tolist() == [7, 2, 0, 3] and (np.diff(shares, axis=0) <= 0).all()
    with pytest.raises(ValueError, match="`rounds` must be at least 1, got 0"):
        round_shares([1], 0)


def test_no_prefix_anywhere_sends_every_round_to_top_ups():
    world = ScriptedWorld(6, horizon=1)
    record = run_step(world, get_policy("trace"), RolloutBudget(8, 2), pool=6, rng=np.random.default_rng(0),
                      expansion_rounds=3)
    assert record.counts == {"bare": 8, "top_up": 16, "continuation": 0}
    assert record.continuations_by_round == (0,)  # the first round had no anchors: the rest topped up at once
    assert record.forest.n_leaves == 24


def test_dapo_rounds_with_fixed_outcomes():
    """G = 2 and odd prompts mix: target 16 // 4 = 4 groups; round 1 draws 4 (keeps 1, 3), round 2
    draws 2 / (2/4) = 4 more (keeps 5, 7) and the batch is full after 16 rollouts."""

    class Alternating(ScriptedWorld):
        def _rollout(self, start, origin):
            j = self.started.get(start, 0)
            self.started[start] = j + 1
            node = self.builder.add_turn(start, origin=origin)
            self._add(node, start, self.node_prompt[start], 1)
            self.builder.finish(node, float(j == 0 or self.node_prompt[start] % 2 == 0))

    world = Alternating(12)
    record = run_step(world, get_policy("dapo", group_size=2), RolloutBudget(16), pool=12,
                      rng=np.random.default_rng(0))
    assert record.rounds == 2 and record.kept.tolist() == [1, 3, 5, 7]
    assert [entry[1].tolist() for entry in world.log] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert record.groups.tolist() == [2] * 8 + [0] * 4 and record.rollouts == 16
    set_target = run_step(Alternating(12), get_policy("dapo", group_size=2, dapo_target=2), RolloutBudget(16),
                          pool=12, rng=np.random.default_rng(0))
    # target 2: round 1 draws 2 prompts (keeps 1), round 2 draws 1 / (1/2) = 2 more (keeps 3)
    assert set_target.rounds == 2 and set_target.kept.tolist() == [1, 3] and set_target.rollouts == 8


def test_the_root_allocator_hook_replaces_the_local_allocation():
    calls = []

    def everything_on_the_last_two(policy, v, budget, *, rng, concentration):
        calls.append((policy.name, v.size, budget))
        m = np.zeros(v.size, dtype=np.int64)
        m[-2:] = budget // 2, budget - budget // 2
        return m

    world = ScriptedWorld(8)
    record = run_step(world, get_policy("trace"), RolloutBudget(10, 1), pool=8, rng=np.random.default_rng(0),
                      root_allocator=everything_on_the_last_two)
    assert calls == [("trace", 8, 10)]
    assert world.log[1][0] == "plant" and world.log[1][1].tolist() == [6, 7]
    assert record.rollouts == 20
    # A distributed allocator returns this rank's share of the global budget: the rest of the step is local.
    share = run_step(ScriptedWorld(8), get_policy("trace"), RolloutBudget(10, 1), pool=8,
                     rng=np.random.default_rng(0), root_allocator=lambda *args, **kwargs: np.full(8, 2))
    assert share.counts["bare"] == 16 and share.rollouts == 32
    with pytest.raises(ValueError, match="the root allocator must return 8 non-negative counts"):
        run_step(ScriptedWorld(8), get_policy("trace"), RolloutBudget(10, 1), pool=8, rng=np.random.default_rng(0),
                 root_allocator=lambda *args, **kwargs: np.ones(7, dtype=np.int64))


def test_bad_input_fails_with_one_line_messages():
    class Overconfident(ScriptedWorld):
        def predict_prompts(self, prompts, *, concentration):
            return Prediction(np.full(len(prompts), 1.5))

    with pytest.raises(ValueError, match="`expansion_rounds` must be at least 1, got 0"):
        _step("trace", RolloutBudget(8, 1), rounds=0)
    with pytest.raises(ValueError, match=r"the predictor must return 6 probabilities in \[0, 1\]"):
        run_step(Overconfident(6), get_policy("trace"), RolloutBudget(8, 1), pool=6, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="policy 'trace_beta' needs 6 positive concentrations"):
        run_step(_NoConcentration(6), get_policy("trace_beta"), RolloutBudget(8, 1), pool=6,
                 rng=np.random.default_rng(0))


class _NoConcentration(ScriptedWorld):
    def predict_prompts(self, prompts, *, concentration):
        return Prediction(self.prompt_v[prompts])


def test_kinds_and_record_predictions_per_node():
    assert KINDS == ("bare", "top_up", "continuation") and Kind.TOP_UP == 1
    world, policy, record = _step("trace", RolloutBudget(16, 2))
    per_node = record.node_predictions()
    forest = record.forest
    roots = forest.roots
    assert np.allclose(per_node[roots], world.prompt_v[forest.prompt[roots]])
    assert np.allclose(per_node[record.node_ids], record.node_v)
    assert np.isnan(per_node[forest.is_leaf]).all()


def test_rollout_order_does_not_depend_on_how_a_world_numbers_its_nodes():
    """One prompt, two bare rollouts of three turns: numbered rollout by rollout (the simulator) and turn
    by turn across rollouts (the engine). The driver lists the prefixes in the same order for both."""
    nan = float("nan")
    by_rollout = RolloutForest.from_parents([-1, 0, 1, 2, 0, 4, 5], [nan, nan, nan, 1, nan, nan, 0])
    by_turn = RolloutForest.from_parents([-1, 0, 0, 1, 2, 3, 4], [nan, nan, nan, nan, nan, 1, 0])
    same = {1: 1, 2: 3, 4: 2, 5: 4}  # a rollout-major id -> the turn-major id of the same prefix
    order = in_rollout_order(by_rollout, np.array([5, 2, 4, 1]))
    assert order.tolist() == [1, 2, 4, 5]
    assert in_rollout_order(by_turn, np.array([4, 3, 2, 1])).tolist() == [same[n] for n in order.tolist()]


@given(st.data())
def test_rollout_order_is_tree_then_first_turn_then_depth_on_any_forest_and_subset(data):
    from .strategies import forests

    forest = data.draw(forests())
    nonroot = np.flatnonzero(forest.parent != -1)
    nodes = np.array(data.draw(st.lists(st.sampled_from(nonroot.tolist()), unique=True)) if nonroot.size else [],
                     dtype=np.int64)
    if data.draw(st.booleans()):
        nodes = np.sort(nodes)  # the simulator's case: ids in order (the fast path when rollouts are contiguous)

    def first_turn(node):  # climb while the node continues its parent's rollout
        while not forest.starts_rollout[node]:
            node = forest.parent[node]
        return node

    want = sorted(nodes.tolist(), key=lambda n: (forest.tree_index[n], first_turn(n), forest.depth[n]))
    assert in_rollout_order(forest, nodes).tolist() == want


class PricedWorld(ScriptedWorld):
    """The scripted world, knowing its costs: a rollout from depth d costs horizon - d turns."""

    def predict_prompts(self, prompts, *, concentration):
        guess = super().predict_prompts(prompts, concentration=concentration)
        return Prediction(guess.v, guess.concentration, np.full(len(prompts), float(self.horizon)))

    def predict_nodes(self, nodes, *, concentration):
        guess = super().predict_nodes(nodes, concentration=concentration)
        return Prediction(guess.v, guess.concentration, self.horizon - np.array(self.node_depth)[nodes].astype(float))


@settings(max_examples=30, deadline=None)
@given(roots=st.integers(2, 30), continuations=st.integers(1, 4), horizon=st.integers(2, 5),
       seed=st.integers(0, 2**32 - 1))
def test_token_priced_step_spends_its_budget_in_tokens(roots, continuations, horizon, seed):
    budget, pool = RolloutBudget(roots, continuations), 24
    run = lambda world, name: run_step(world, get_policy(name), budget, pool=pool, rng=np.random.default_rng(seed))
    # A world that does not know its costs: token pricing is rollout pricing, decision for decision.
    plain, priced = ScriptedWorld(pool, horizon=horizon, seed=seed % 1000), ScriptedWorld(pool, horizon=horizon, seed=seed % 1000)
    run(plain, "trace"), run(priced, "trace_tokens")
    assert str(plain.log) == str(priced.log)
    # A world that knows them: equal root prices keep the roots; continuations cost (H - d) / H rollouts.
    world = PricedWorld(pool, horizon=horizon, seed=seed % 1000)
    record = run(world, "trace_tokens")
    assert record.counts["bare"] == roots
    trace = run(ScriptedWorld(pool, horizon=horizon, seed=seed % 1000), "trace")
    forest = record.forest
    cont = forest.starts_rollout & (forest.origin == Origin.CONTINUATION)
    assert cont.sum() == record.counts["continuation"]
    spent = (horizon - forest.depth[forest.parent[cont]]).sum() / horizon + record.counts["top_up"]
    assert spent <= roots * continuations + 1e-9
    assert record.counts["continuation"] >= trace.counts["continuation"]


# ---------------------------------------------------------------------------------------------------
# Streamed expansion: each tree branches as soon as its own bare rollouts end
# ---------------------------------------------------------------------------------------------------


def _streaming(base):
    """``base`` (a scripted world) that reports its trees to the driver in a shuffled order, as if
    their bare rollouts ended at different times, and grows each tree's continuations at once."""

    class Streaming(base):
        def plant(self, prompts, counts, events=None):
            forest = super().plant(prompts, counts)
            if events is None:
                return forest
            anchors = in_rollout_order(forest, forest.prefix_anchors())
            roots = forest.roots
            order = np.random.default_rng(len(self.log)).permutation(len(prompts))
            mine = {tree: anchors[forest.tree_index[anchors] == tree] for tree in order.tolist()}
            for tree in order.tolist():
                reward = forest.reward[forest.factual_leaf[mine[tree]]]
                at = mine[tree]
                k = events.tree_ended(tree, reward,
                                      lambda concentration: self.predict_nodes(at, concentration=concentration))
                self._start(tree, at, k)
            top_ups, more = events.rest()
            self.log.append(("stream", "top-ups", [(int(r), Kind.TOP_UP, int(c)) for r, c in zip(roots, top_ups) if c]))
            for root, c in zip(roots.tolist(), top_ups.tolist()):
                for _ in range(c):
                    self._rollout(root, Origin.BARE)
            for tree in range(len(prompts)):
                self._start(tree, mine[tree], more[tree])
            return self.builder.build()

        def _start(self, tree, at, k):
            self.log.append(("stream", tree, [(int(a), Kind.CONTINUATION, int(c)) for a, c in zip(at, k) if c]))
            for a, c in zip(at.tolist(), np.asarray(k).tolist()):
                for _ in range(c):
                    self._rollout(a, Origin.CONTINUATION)

    return Streaming


def _grown(world):
    """Rollouts started per (node, kind) over every grow call: what the driver decided, in any order."""
    out: dict = {}
    for entry in world.log:
        if entry[0] in ("grow", "stream"):
            for node, kind, count in entry[-1]:
                out[node, kind] = out.get((node, kind), 0) + count
    return out


STREAMABLE = [name for name in POLICIES.names() if get_policy(name).streams_prefixes]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(STREAMABLE), roots=st.integers(2, 30), continuations=st.integers(1, 4),
       horizon=st.integers(1, 5), cap=st.sampled_from([None, 1, 2]), priced=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
@example(name="trace", roots=8, continuations=3, horizon=1, cap=None, priced=False, seed=0)  # all top-ups
@example(name="trace", roots=12, continuations=4, horizon=2, cap=1, priced=False, seed=1)  # leftovers pooled
def test_streamed_expansion_decides_what_the_barrier_decides(name, roots, continuations, horizon, cap, priced,
                                                             seed):
    """Trees reported one by one, in any order: the same predictions, continuations per anchor, top-ups
    and groups as with every bare rollout ended first (allocate_prefixes = own budgets, then leftovers)."""
    pool, budget = 24, RolloutBudget(roots, continuations)
    policy = get_policy(name, max_per_anchor=cap)
    base = PricedWorld if priced else ScriptedWorld
    barrier, streamed = base(pool, horizon=horizon, seed=seed % 1000), _streaming(base)(pool, horizon=horizon, seed=seed % 1000)
    a = run_step(barrier, policy, budget, pool=pool, rng=np.random.default_rng(seed))
    b = run_step(streamed, policy, budget, pool=pool, rng=np.random.default_rng(seed), expansion="streamed")
    assert b.streamed and not a.streamed
    assert _grown(streamed) == _grown(barrier)
    assert a.counts == b.counts and np.array_equal(a.groups, b.groups)
    for field in ("prompt_ids", "prompt_v", "node_ids", "node_v", "node_round"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    if policy.posterior:
        np.testing.assert_array_equal(a.node_concentration, b.node_concentration)
    fa, fb = a.forest, b.forest
    assert fa.n_leaves == fb.n_leaves == record_total(a)
    assert sorted(fa.reward[fa.leaves].tolist()) == sorted(fb.reward[fb.leaves].tolist())
    # Nothing waits for the end of the streams: the world grows everything itself.
    assert not any(entry[0] == "grow" for entry in streamed.log)


def record_total(record):
    return record.counts["bare"] + record.counts["top_up"] + record.counts["continuation"]


@pytest.mark.parametrize("name, rounds", [("random_prefix", 1), ("trace", 2), ("grpo", 1)])
def test_streamed_falls_back_to_the_barrier_where_decisions_would_differ(name, rounds):
    """A randomised prefix rule (its draws span trees), several rounds (a round's carry spans trees) or
    a flat policy: the step runs with the barrier, and says so."""
    world = _streaming(ScriptedWorld)(12)
    record = run_step(world, get_policy(name), RolloutBudget(8, 2), pool=12, rng=np.random.default_rng(0),
                      expansion_rounds=rounds, expansion="streamed")
    assert not record.streamed and not any(entry[0] == "stream" for entry in world.log)


def test_a_world_that_skips_or_repeats_a_tree_is_refused():
    class Skips(ScriptedWorld):
        def plant(self, prompts, counts, events=None):
            return super().plant(prompts, counts)

    class Repeats(ScriptedWorld):
        def plant(self, prompts, counts, events=None):
            forest = super().plant(prompts, counts)
            events.tree_ended(0, np.zeros(0), None)
            events.tree_ended(0, np.zeros(0), None)
            return forest

    class RestsEarly(ScriptedWorld):
        def plant(self, prompts, counts, events=None):
            events.rest()

    run = lambda world: run_step(world, get_policy("prefix_only", group_size=4), RolloutBudget(8, 2), pool=12,
                                 rng=np.random.default_rng(0), expansion="streamed")
    with pytest.raises(ValueError, match=r"the world must call rest\(\) once, after expanding every tree "
                                         r"\(trees \[0, 1\] of its 2 were not\)"):
        run(Skips(12))
    with pytest.raises(ValueError, match=r"trees \[0, 1\] of its 2 were not"):
        run(RestsEarly(12))
    with pytest.raises(ValueError, match="expand each of its 2 trees once, got tree 0"):
        run(Repeats(12))
