"""Math with a sandboxed Python tool: scripted agents reach reward 1; snapshots replay; no action raises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_train.envs import Environment
from trace_train.envs.math_python import NO_ACTION, MathPythonEnv, MathState, math_rows
from trace_train.tools.budget import BUDGET_EXHAUSTED
from trace_train.tools.sandbox import SandboxLimits

from .scripted import MATH, math_actions, play, tool_call

ROW = MATH[0][0]


@pytest.mark.parametrize("row, cells, answer", MATH, ids=[row["id"] for row, _, _ in MATH])
def test_python_that_computes_the_answer_passes_math_verify(row, cells, answer):
    env = MathPythonEnv()
    assert isinstance(env, Environment)
    messages = env.reset(row)
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == row["problem"]
    assert '"name": "python"' in messages[0]["content"] and "<answer>" in messages[0]["content"]
    results = play(env, math_actions(cells, answer))
    assert [r.done for r in results] == [False] * len(cells) + [True]
    assert all(r.role == "tool" and not r.invalid for r in results[:-1])
    assert results[-2].observation.strip() in ("4900", "1/2", "7.0")
    assert env.verify() == 1.0 and env.metrics() == {"correct": 1.0, "answered": 1.0,
                                                     "tool_calls": float(len(cells))}


def test_a_wrong_or_missing_answer_scores_zero():
    env = MathPythonEnv()
    env.reset(ROW)
    assert env.verify() == 0.0  # no answer yet
    env.step("<answer>4901</answer>")
    assert env.verify() == 0.0 and env.metrics()["answered"] == 1.0


def test_a_mid_episode_snapshot_replays_the_session_on_a_fresh_instance():
    row, cells, answer = MATH[2]
    env = MathPythonEnv()
    env.reset(row)
    actions = math_actions(cells, answer)
    env.step(actions[0])  # defines a, b, c
    snapshot = env.snapshot()
    factual = play(env, actions[1:])
    env.restore(snapshot)
    diverged = env.step(tool_call("python", code="a = 100\nprint(a)"))  # a branch that changes the state
    assert diverged.observation == "100"
    for instance in (MathPythonEnv(), env):  # a fresh instance, and the same one after the branch
        instance.restore(snapshot)
        assert play(instance, actions[1:]) == factual and instance.verify() == 1.0
    assert snapshot == MathState(row["problem"], row["answer"], (cells[0],), 1, None)  # untouched


def test_tool_failures_and_malformed_calls_become_observations():
    env = MathPythonEnv(limits=SandboxLimits(wall_seconds=2.0, cpu_seconds=1))
    env.reset(ROW)
    crash = env.step(tool_call("python", code="1 / 0"))
    assert "ZeroDivisionError" in crash.observation and not crash.invalid and not crash.done
    loop = env.step(tool_call("python", code="while True:\n    pass"))
    assert "[execution stopped:" in loop.observation and not loop.done
    mixed = env.step(tool_call("shell", code="ls") + tool_call("python", cmd="1") + "<tool_call>{oops")
    parts = mixed.observation.split("\n</tool_response>\n<tool_response>\n")
    assert mixed.invalid and len(parts) == 3
    assert parts[0].startswith("Error: there is no tool 'shell'")
    assert parts[1] == 'Error: python takes exactly one argument, "code", a string.'
    assert "never closed" in parts[2]
    nothing = env.step("I think the answer is large.")
    assert (nothing.observation, nothing.role) == (NO_ACTION, "user")
    assert nothing.invalid and not nothing.done
    assert env.snapshot().tool_calls == 2  # the two calls that ran; invalid ones cost nothing


def test_the_tool_call_budget_holds_per_episode_and_restores():
    env = MathPythonEnv(max_tool_calls=1)
    env.reset(ROW)
    assert env.step(tool_call("python", code="print(1)")).observation == "1"
    start = env.snapshot()
    assert env.step(tool_call("python", code="print(2)")).observation == BUDGET_EXHAUSTED
    fresh = MathPythonEnv(max_tool_calls=1)
    fresh.restore(start)
    assert fresh.step(tool_call("python", code="print(2)")).observation == BUDGET_EXHAUSTED
    assert "at most 1 times" in fresh.system_prompt


def test_user_role_wraps_each_result_as_qwen3_does():
    env = MathPythonEnv(observation_role="user")
    env.reset(ROW)
    result = env.step(tool_call("python", code="print(1)") + tool_call("python", code="print(2)"))
    assert result.role == "user"
    assert result.observation == "<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>"


def test_reasoning_is_not_read_as_an_action():
    env = MathPythonEnv()
    env.reset(ROW)
    thought = env.step(f"<think>maybe {tool_call('python', code='print(9)')} or \\boxed{{3}}</think>")
    assert thought.invalid and thought.observation == NO_ACTION
    assert env.step("<think>\\boxed{1}</think>The answer is \\boxed{4900}.").done and env.verify() == 1.0


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["", "<tool_call>", "</tool_call>", '{"name": "python"', '"arguments":',
                                 '{"code": "print(7)"}}', "<answer>", "</answer>", "\\boxed{", "}", "<think>",
                                 "</think>", "7", "x = 1/0", "\n", "garbage ✓"]), max_size=12))
def test_no_action_raises(pieces):
    env = MathPythonEnv()
    env.reset(ROW)
    result = env.step("".join(pieces))
    assert isinstance(result.observation, str) and result.observation
    assert env.verify() in (0.0, 1.0)


def test_rows_and_arguments_are_validated():
    from trace_train.data.math import MathProblem

    assert math_rows([MathProblem("7", "What is 3 + 4?", "7")]) == [
        {"id": "7", "problem": "What is 3 + 4?", "answer": "7"}]
    env = MathPythonEnv()
    with pytest.raises(ValueError, match="'problem'"):
        env.reset({"question": "x", "answer": "1"})
    with pytest.raises(ValueError, match="'answer'"):
        env.reset({"problem": "x", "answer": " "})
    assert env.reset({"problem": "x", "answer": 12}) and env.snapshot().answer == "12"
    with pytest.raises(ValueError, match="observation_role"):
        MathPythonEnv(observation_role="assistant")
    with pytest.raises(ValueError, match="limit"):
        MathPythonEnv(max_tool_calls=-1)
    with pytest.raises(ValueError, match="snapshot"):
        env.restore(("print(1)",))
    with pytest.raises(RuntimeError, match="reset"):
        MathPythonEnv().step("1")
