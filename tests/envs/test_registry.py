"""The environment registry: every entry builds environments that keep the protocol's promises."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trace_train.envs import ENVIRONMENTS, EnvFactory, Environment, make_env_factory

from .scripted import CORPUS, DEMO, MATH

OPTIONS = {"search_qa": {"corpus": str(CORPUS)}, "reasoning_gym": {"dataset": "chain_sum", "attempts": 3},
           "textarena": {"env_id": "GuessTheNumber-v0"}}
ROWS = {
    "guess_number": {"target": 3, "low": 1, "high": 8, "max_guesses": 3},
    "math_python": MATH[0][0],
    "search_qa": {"question": DEMO[0]["question"], "answers": DEMO[0]["golden_answers"]},
    "bfcl": {"id": "multi_turn_long_context_7"},
    "reasoning_gym": {"id": "chain_sum/0", "question": "State the final answer: 5 + 7 =", "answer": "12",
                      "entry": {"question": "State the final answer: 5 + 7 =", "answer": "12", "metadata": {}}},
    "textarena": {"game": "GuessTheNumber-v0", "seed": 5},
    "key_lock": {"keys": ["red", "blue"], "marks": ["star", "moon"], "lock": "moon", "right_key": "blue",
                 "lamp": "dark"},
}
ACTIONS = ["4", "no idea", '<tool_call>{"name": "ls", "arguments": {}}</tool_call>']


def test_the_environments_are_registered():
    assert ENVIRONMENTS.names()[:6] == ["guess_number", "math_python", "search_qa", "reasoning_gym", "bfcl",
                                        "textarena"]


@pytest.mark.parametrize("name", ENVIRONMENTS.names())
def test_every_environment_keeps_the_protocol(name):
    """Opening messages; snapshots restore on never-reset instances and answer like the original; actions
    meant for other environments are observations, not exceptions."""
    factory = make_env_factory(name, OPTIONS.get(name))
    assert isinstance(factory, EnvFactory) and factory.name == name
    env = factory()
    assert isinstance(env, Environment)
    messages = env.reset(ROWS[name])
    assert [m["role"] for m in messages] == ["system", "user"] and all(m["content"] for m in messages)
    first = env.step(ACTIONS[0])
    snapshot = env.snapshot()
    rest = []
    for action in ACTIONS[1:]:  # a TextArena game ends at the second invalid move in a row
        rest.append(env.step(action))
        if rest[-1].done:
            break
    fresh = factory()
    fresh.restore(snapshot)
    assert [fresh.step(action) for action in ACTIONS[1:1 + len(rest)]] == rest
    assert not first.done and fresh.verify() == env.verify() == 0.0


def test_factories_describe_tools_and_rewards():
    assert make_env_factory("math_python").tools[0]["function"]["name"] == "python"
    qa = make_env_factory("search_qa", {"corpus": str(CORPUS), "reward": "token_f1"})
    assert qa.tools[0]["function"]["name"] == "search" and not qa.binary_rewards and not qa().binary_rewards
    assert make_env_factory("bfcl").tools == () and make_env_factory("bfcl").binary_rewards
    assert make_env_factory("bfcl", {"max_steps_per_turn": 3})().max_steps_per_turn == 3
    assert make_env_factory("bfcl")().max_steps_per_turn == 20  # BFCL's own limit
    limits = make_env_factory("math_python", {"sandbox": {"wall_seconds": 3.0}})()._session.limits
    assert limits.wall_seconds == 3.0
    url = make_env_factory("search_qa", {"retriever_url": "http://127.0.0.1:9/retrieve"})
    assert url().search.retriever.url == "http://127.0.0.1:9/retrieve"


@pytest.mark.parametrize("name, options, message", [
    ("chess", {}, "unknown environment 'chess'; known: bfcl, guess_number, key_lock, math_python, reasoning_gym, search_qa, "
                  "textarena"),
    ("math_python", {"max_calls": 3}, "has no option 'max_calls'; options: max_tool_calls"),
    ("math_python", {"sandbox": {"seconds": 3}}, "fields of SandboxLimits"),
    ("math_python", {"observation_role": "system"}, "observation_role"),
    ("search_qa", {}, "exactly one of `corpus`"),
    ("search_qa", {"corpus": "x.jsonl", "retriever_url": "http://h/retrieve"}, "exactly one of `corpus`"),
    ("search_qa", {"corpus": "missing.jsonl"}, "is not a file"),
    ("search_qa", {"corpus": str(CORPUS), "reward": "em"}, "`reward` must be one of"),
    ("search_qa", {"retriever_url": "ftp://h"}, "http"),
    ("bfcl", {"max_steps_per_turn": 0}, "max_steps_per_turn"),
])
def test_bad_options_fail_when_the_factory_is_built(name, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_env_factory(name, options)


def test_imports_stay_light():
    """The environments and the evaluation module load without torch, transformers or vLLM; the package
    itself loads no tool back end until an environment is built (bm25s pulls numba; vLLM minds that)."""
    script = (
        "import json, sys\nimport trace_train.envs\nbare = sorted(sys.modules)\n"
        "import trace_train.envs.math_python, trace_train.envs.search_qa, trace_train.envs.bfcl\n"
        "import trace_train.evaluate\nprint(json.dumps([bare, sorted(sys.modules)]))"
    )
    bare, full = map(set, json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True,
                                                    text=True, check=True).stdout))
    assert not {"bm25s", "bfcl_eval", "torch", "transformers", "vllm"} & bare
    assert {"bm25s", "bfcl_eval"} <= full and not {"torch", "transformers", "vllm", "bfcl_eval.utils"} & full
