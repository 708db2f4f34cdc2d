"""The simulator and the engine run the same step: given the same predictions and the same outcomes, they
make the same allocation decisions and grow the same trees.

The engine generates real rollouts (tiny model, guess-the-number games). The simulator then replays those
outcomes: its world answers "the j-th rollout from node n" with the engine's j-th rollout from the same
node, and its predictor gives the engine's predictions. Both run ``trace_theory.step.run_step``; the
trees must be identical, node for node, for every deterministic policy and every expansion round count.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from simulations.rollout import Rollouts
from simulations.runner import sample_batch
from trace_theory import POLICIES, Prediction, get_policy
from trace_train.rollout.engine import RolloutConfig, RolloutEngine
from trace_train.envs import EpisodeLimits, GuessNumberEnv, make_rows

POOL = make_rows(6, high=8, max_guesses=4, seed=1)


def _value(prompt, depth):
    return np.where(depth == 0, 0.15 + 0.12 * (prompt % 6), 0.8 / np.maximum(depth, 1))


class TurnPredictor:
    """The engine's predictor: a fixed function of the prompt and the depth."""

    def __call__(self, histories):
        return _value(np.array([h.prompt for h in histories]), np.array([h.depth for h in histories]))

    def concentration(self, histories):
        return np.full(len(histories), 4.0)


class SamePredictor:
    """The simulator's predictor with the same values, read from the replayed payload."""

    def predict(self, nodes, depth, rng):
        return Prediction(_value(nodes["prompt"], np.asarray(depth)), np.full(len(depth), 4.0))


class Replay:
    """A simulator world whose rollouts are the engine's: payload ``node`` is the engine's node id."""

    def __init__(self, forest):
        self.forest, self.served = forest, defaultdict(int)

    def sample_prompts(self, n, rng):
        f = self.forest
        node = np.full(n, -1)
        node[f.prompt[f.roots]] = f.roots
        return {"v": np.full(n, 0.5), "node": node, "prompt": np.arange(n)}

    def rollouts(self, anchors, depth, rng):
        f = self.forest
        length, reward, turns = [], [], []
        for start in anchors["node"].tolist():
            children = f.children(start)
            rollouts = children if f.parent[start] == -1 else children[1:]  # a prefix's first child is its own
            node = int(rollouts[self.served[start]])
            self.served[start] += 1
            path = [node]
            while not f.is_leaf[path[-1]]:
                path.append(int(f.first_child[path[-1]]))
            length.append(len(path)), reward.append(f.reward[path[-1]]), turns.extend(path)
        turns = np.asarray(turns, dtype=np.int64)
        return Rollouts(np.asarray(length, dtype=np.int64), np.asarray(reward, dtype=float),
                        {"v": np.where(f.is_leaf[turns], f.reward[turns], 0.5), "node": turns,
                         "prompt": f.prompt[turns]})


def _tree(forest, node):
    """A node as (origin, reward or children in creation order): equal trees, equal decisions."""
    if forest.is_leaf[node]:
        return int(forest.origin[node]), float(forest.reward[node])
    return int(forest.origin[node]), tuple(_tree(forest, int(c)) for c in forest.children(node))


def _trees(forest):
    return {int(forest.prompt[r]): _tree(forest, int(r)) for r in forest.roots}


@pytest.mark.parametrize("rounds", [1, 2])
@pytest.mark.parametrize("name", [n for n in POLICIES.names() if get_policy(n).deterministic])
def test_the_simulator_replaying_the_engines_outcomes_makes_the_same_decisions(hf_backend, name, rounds):
    # streamed places what the simulator's barrier places (tests/rollout/test_engine.py); eager does not wait
    config = RolloutConfig(policy=name, roots=8, continuations_per_root=2, group_size=4, expansion_rounds=rounds,
                           expansion="streamed",
                           limits=EpisodeLimits(max_turns=4, max_turn_tokens=8, max_context_tokens=512))
    engine = RolloutEngine(hf_backend, GuessNumberEnv, config)
    tokens_from = engine.expected_tokens(np.arange(64))  # what a token-priced policy pays, before it is learnt
    batch = engine.rollout(POOL, predictor=TurnPredictor(), seed=3)
    replay = Replay(batch.forest)
    replay.expected_turns = lambda depth: tokens_from[np.asarray(depth, dtype=np.int64)]  # the same costs
    sim = sample_batch(replay, config.allocation_policy, batch.report.planned, SamePredictor(), pool=len(POOL),
                       rng=np.random.default_rng(0), expansion_rounds=rounds)
    assert _trees(sim.sampled.forest) == _trees(batch.forest)
    assert sim.rounds == batch.report.rounds
    # Every rollout the engine generated was asked for by the simulator, exactly once.
    assert sum(replay.served.values()) == batch.report.rollouts
    # And both recorded the same predictions (the engine per node, the simulator in the order asked).
    engine_nodes = np.flatnonzero(np.isfinite(batch.predictions) & (batch.forest.parent != -1))
    np.testing.assert_allclose(np.sort(sim.predicted[sim.depth > 0]), np.sort(batch.predictions[engine_nodes]))


def test_rounds_and_the_dapo_target_are_rollout_settings():
    assert RolloutConfig(policy="dapo", dapo_target=3).allocation_policy.dynamic_target(1000) == 3
    assert RolloutConfig(policy="dapo", group_size=4).allocation_policy.dynamic_target(64) == 8  # 64 // (2 * 4)
    with pytest.raises(ValueError, match="`expansion_rounds` must be a positive integer, got 0"):
        RolloutConfig(expansion_rounds=0)
    with pytest.raises(ValueError, match="`dapo_target` is a setting of dynamic sampling; policy 'trace' has none"):
        RolloutConfig(policy="trace", dapo_target=3)
    from trace_train.config_loader import load_config
    from trace_train.train import TrainConfig

    cfg = load_config(TrainConfig, "cpu_demo", ["rollout.expansion_rounds=2", "rollout.policy=dapo",
                                                 "rollout.dapo_target=2"])
    assert cfg.rollout.expansion_rounds == 2 and cfg.rollout.dapo_target == 2
