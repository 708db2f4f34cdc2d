"""Each environment through the real rollout engine: a tiny Qwen3 on the transformers back end grows
branching trees; every leaf's reward is what the environment verifies on a replay, and every prefix's
snapshot reproduces its children's observations on a fresh instance."""

from __future__ import annotations

import numpy as np
import pytest

from trace_theory import Origin
from trace_train.rollout.engine import RolloutConfig, RolloutEngine
from trace_train.envs import EndReason, EpisodeLimits
from trace_train.chat import ChatFormat

from .conftest import BFCL_IDS, arithmetic_rows
from .scripted import DEMO

ROWS = {
    "math_python": arithmetic_rows(3, seed=7),  # not among the fine-tuning problems
    "search_qa": [{"id": q["id"], "question": q["question"], "answers": q["golden_answers"]}
                  for q in DEMO[:3]],
    "bfcl": [{"id": task_id} for task_id in BFCL_IDS],
}
LIMITS = {
    "math_python": EpisodeLimits(max_turns=4, max_turn_tokens=64, max_context_tokens=2048),
    "search_qa": EpisodeLimits(max_turns=4, max_turn_tokens=64, max_context_tokens=2048),
    "bfcl": EpisodeLimits(max_turns=5, max_turn_tokens=48, max_context_tokens=6144),
}


@pytest.fixture(scope="module", params=list(ROWS))
def run(request, hf_backend, factories):
    """(name, factory, rows, batch): ``uniform_tree``, 2 bare rollouts per task, 1 continuation each."""
    name = request.param
    factory = factories[name]
    config = RolloutConfig(policy="uniform_tree", roots=2 * len(ROWS[name]), continuations_per_root=1,
                           group_size=2, temperature=0.6, limits=LIMITS[name],
                           binary_rewards=factory.binary_rewards, seed=0)
    chat = ChatFormat(hf_backend.tokenizer, tools=factory.tools)
    engine = RolloutEngine(hf_backend, factory, config, chat=chat)
    return name, factory, ROWS[name], engine.rollout(ROWS[name], seed=0)


def reached_env(payload) -> bool:
    """Whether the turn's action was given to the environment (a cut turn never is)."""
    return payload.finish_reason == "stop"


def test_the_forest_is_valid_and_branches(run):
    name, _, rows, batch = run
    forest = batch.forest.validate()
    assert forest.n_prompts == len(rows) and forest.n_leaves == 4 * len(rows) == batch.report.rollouts
    assert batch.report.continuations > 0 and np.any(forest.origin == Origin.CONTINUATION)
    assert set(np.unique(forest.reward[forest.is_leaf])) <= {0.0, 1.0}
    assert sum(batch.report.end_reasons.values()) == forest.n_leaves


def test_every_leaf_scores_what_the_environment_verifies_on_a_replay(run):
    name, factory, rows, batch = run
    forest, nodes = batch.forest, batch.nodes
    for leaf in forest.leaves.tolist():
        path = forest.path_to_root(leaf)[::-1].tolist()
        env = factory()
        assert tuple(env.reset(rows[int(forest.prompt[leaf])])) == nodes[path[0]].messages
        for node in path[1:]:
            payload = nodes[node]
            if not reached_env(payload):
                assert node == leaf and payload.end_reason in (EndReason.TURN_TOKENS, EndReason.CONTEXT)
                continue
            result = env.step(payload.action)
            assert payload.messages[1] == {"role": result.role, "content": result.observation}
            assert result.done == (payload.end_reason == EndReason.DONE)
        assert env.verify() == forest.reward[leaf]
        assert _state(env.snapshot()) == _state(nodes[leaf].snapshot)


def test_each_prefix_snapshot_reproduces_its_childrens_observations(run):
    _, factory, _, batch = run
    forest, nodes = batch.forest, batch.nodes
    checked = 0
    for node in np.flatnonzero(~forest.is_leaf).tolist():
        for child in forest.children(node).tolist():
            if reached_env(nodes[child]):
                env = factory()  # never reset: the snapshot alone must carry the state
                env.restore(nodes[node].snapshot)
                assert env.step(nodes[child].action).observation == nodes[child].observation
                checked += 1
    assert checked > 0


def test_the_tools_really_ran(run):
    """The fine-tuned tiny model writes well-formed calls often enough for tools to answer; BFCL (which it
    never saw) at least moves through the task's turns."""
    name, _, _, batch = run
    observations = [(p.messages[1]["role"], p.observation) for p in batch.nodes if len(p.messages) == 2
                    and p.action]
    if name == "bfcl":
        assert any(role == "user" and "Error" not in text for role, text in observations)
    else:
        assert any(role == "tool" and not text.startswith("Error") for role, text in observations)


def _state(snapshot):
    """A comparable view of a snapshot (BFCL's holds live API objects, compared by the calls made)."""
    if hasattr(snapshot, "backend"):
        return snapshot.task_id, snapshot.turn, snapshot.steps, snapshot.finished, snapshot.backend.calls
    return snapshot
