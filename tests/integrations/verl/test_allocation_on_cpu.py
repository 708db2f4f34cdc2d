"""The plugin's allocation is our engine's, node for node: one algorithm, two worlds.

Our engine generates real rollouts (tiny model, guess-the-number games, streamed expansion). The plugin's
tree growth (:func:`grow_tree`, what ``_run_prompt`` runs) and step coordinator then decide the same step
for the same pool, budget, seed and predictor, their sessions replaying the engine's outcomes: "the j-th
session from node n" is the engine's j-th rollout from n. The trees must be identical, node for node, and
a coordinator that moves one continuation must be caught. No verl is needed: these modules are plain Python.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import numpy as np
import pytest

from trace_theory import Origin, Prediction, RolloutBudget, get_policy
from trace_train.envs import EpisodeLimits, GuessNumberEnv, make_rows
from trace_train.integrations.verl.coordinator import StepCoordinator, ThreadedCoordinator, fit_predictor_on_step
from trace_train.integrations.verl.tree_growth import Prefix, Session, grow_tree
from trace_train.rollout.batch import History
from trace_train.rollout.engine import RolloutConfig, RolloutEngine

POOL = make_rows(6, high=8, max_guesses=4, seed=1)


class TurnPredictor:
    """One predictor for both worlds: a fixed function of the prompt and the depth."""

    def __call__(self, histories):
        prompt = np.array([h.prompt for h in histories])
        depth = np.array([h.depth for h in histories])
        return np.where(depth == 0, 0.15 + 0.12 * (prompt % 6), 0.8 / np.maximum(depth, 1))

    def concentration(self, histories):
        return np.full(len(histories), 4.0)


def predict_with(predictor):
    return lambda histories, concentration: Prediction(
        predictor(histories), predictor.concentration(histories) if concentration else None)


class Replay:
    """Sessions that replay the engine's forest: a session from node n is the engine's next rollout from n."""

    def __init__(self, forest):
        self.forest, self.served, self.missing = forest, defaultdict(int), 0

    def runner(self, root: int, prompt: int):
        f = self.forest

        async def run_session(start: Prefix | None, session_id: int) -> Session:
            node = root if start is None else start.state
            children = f.children(node)
            rollouts = children if node == root else children[1:]  # a prefix's first child is its own rollout
            if self.served[node] >= len(rollouts):  # a decision the engine did not make: a made-up failure
                self.missing += 1
                return Session(1, 0.0, [], [0])
            first = int(rollouts[self.served[node]])
            self.served[node] += 1
            path = [first]
            while not f.is_leaf[path[-1]]:
                path.append(int(f.first_child[path[-1]]))
            prefixes = [Prefix(int(f.depth[n]), n, History(prompt, POOL[prompt], int(f.depth[n]), (), ()))
                        for n in path[:-1]]
            await asyncio.sleep(0)  # sessions of different trees interleave, as in verl
            return Session(len(path), float(f.reward[path[-1]]), prefixes, list(range(len(path))))

        return run_session


def _tree(forest, node):
    """A node as (origin, reward or children in creation order): equal trees, equal decisions."""
    if forest.is_leaf[node]:
        return int(forest.origin[node]), float(forest.reward[node])
    return int(forest.origin[node]), tuple(_tree(forest, int(c)) for c in forest.children(node))


def trees(forest):
    return {int(forest.prompt[r]): _tree(forest, int(r)) for r in forest.roots}


def plugin_step(batch, policy, budget: RolloutBudget, seed: int, coordinator_cls=StepCoordinator):
    """The plugin's step for the engine's pool, replaying the engine's outcomes; returns (record, replay)."""
    predictor = TurnPredictor()
    openings = [History(i, row, 0, (), ()) for i, row in enumerate(POOL)]
    coordinator = coordinator_cls(policy, budget, len(POOL), predict_with(predictor), openings, seed=seed, timeout=60)
    m = coordinator.start()
    replay = Replay(batch.forest)
    root_of = {int(batch.forest.prompt[r]): int(r) for r in batch.forest.roots}

    waited = ThreadedCoordinator(coordinator)

    async def every_tree():
        active = np.flatnonzero(m)
        await asyncio.gather(*(grow_tree(replay.runner(root_of[int(p)], int(p)), waited,
                                         coordinator.tree_of(int(p)), int(m[p])) for p in active))

    asyncio.run(every_tree())
    return coordinator.record(), replay


class MovesOneContinuation(StepCoordinator):
    """A deliberately wrong decision: the first tree with two prefixes moves one continuation to the next."""

    moved = False

    def expand(self, tree, reward, histories):
        k = super().expand(tree, reward, histories)
        if not MovesOneContinuation.moved and len(k) > 1 and k.sum():
            i = int(np.argmax(k))
            k[i] -= 1
            k[(i + 1) % len(k)] += 1
            MovesOneContinuation.moved = True
        return k


def engine_batch(backend, name):
    config = RolloutConfig(policy=name, roots=8, continuations_per_root=2, group_size=4, expansion="streamed",
                           limits=EpisodeLimits(max_turns=4, max_turn_tokens=8, max_context_tokens=512))
    engine = RolloutEngine(backend, GuessNumberEnv, config)
    budget = engine.plan()
    return engine.rollout(POOL, predictor=TurnPredictor(), seed=3), config.allocation_policy, budget


@pytest.mark.parametrize("name", ["trace", "uniform_tree", "trace_beta", "grpo"])
def test_the_plugin_allocates_as_our_engine_node_for_node(hf_backend, name):
    batch, policy, budget = engine_batch(hf_backend, name)
    record, replay = plugin_step(batch, policy, budget, seed=3)
    assert replay.missing == 0
    assert trees(record.forest) == trees(batch.forest)
    assert record.counts == {"bare": batch.report.bare_rollouts - batch.report.top_up_rollouts,
                             "top_up": batch.report.top_up_rollouts, "continuation": batch.report.continuations}
    assert sum(replay.served.values()) == batch.report.rollouts  # every engine rollout asked for, once
    if policy.branches:
        assert batch.report.continuations > 0  # the comparison covers continuations, not only roots


def test_a_wrong_decision_is_caught(hf_backend):
    batch, policy, budget = engine_batch(hf_backend, "trace")
    MovesOneContinuation.moved = False
    record, _ = plugin_step(batch, policy, budget, seed=3, coordinator_cls=MovesOneContinuation)
    assert MovesOneContinuation.moved
    assert trees(record.forest) != trees(batch.forest)


def test_a_policy_the_streamed_sessions_cannot_run_is_refused():
    with pytest.raises(ValueError, match="needs the barrier"):
        StepCoordinator(get_policy("random_prefix"), RolloutBudget(4, 2), 2, None, [None, None], seed=0)


def test_a_failed_tree_drops_its_group_and_the_step_goes_on(hf_backend):
    """As verl drops a failed group: the tree whose sessions fail is dropped (named by ``failures()``, left out
    of the predictor's fit), every other tree is grown and the step's record completes."""
    batch, policy, budget = engine_batch(hf_backend, "trace")
    openings = [History(i, row, 0, (), ()) for i, row in enumerate(POOL)]
    coordinator = StepCoordinator(policy, budget, len(POOL), predict_with(TurnPredictor()), openings, seed=3,
                                  timeout=60)
    m = coordinator.start()
    replay = Replay(batch.forest)
    root_of = {int(batch.forest.prompt[r]): int(r) for r in batch.forest.roots}
    active = [int(p) for p in np.flatnonzero(m)]
    waited = ThreadedCoordinator(coordinator)

    async def broken(start, session_id):
        await asyncio.sleep(0)
        raise RuntimeError("the sandbox died")

    async def every_tree():
        return await asyncio.gather(*(grow_tree(broken if p == active[0] else replay.runner(root_of[p], p), waited,
                                                coordinator.tree_of(p), int(m[p])) for p in active),
                                    return_exceptions=True)

    results = asyncio.run(every_tree())
    assert isinstance(results[0], RuntimeError) and "the sandbox died" in str(results[0])
    assert all(isinstance(r, list) and r for r in results[1:])  # every other tree grew its leaves
    failures = coordinator.failures()
    assert failures["failed"] == [0] and failures["first"] == "RuntimeError: the sandbox died"
    record, histories = coordinator.record_with_histories()
    f = record.forest
    kept = f.tree_index != 0
    assert (f.origin[kept] == Origin.CONTINUATION).any()  # the others still branched

    from trace_train.predictors import PredictorConfig, build_predictor

    metrics = fit_predictor_on_step(build_predictor(PredictorConfig(kind="running_mean")), record, histories,
                                    failed=failures["failed"])
    assert metrics["predictor_examples"] == int((~f.is_leaf & (f.parent != -1) & kept).sum()) > 0
