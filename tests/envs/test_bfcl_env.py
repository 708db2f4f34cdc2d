"""BFCL v4 multi-turn: ground truth played through the environment passes the official checker; prompts
are BFCL's own; the step limit; snapshots replay; no action raises."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from bfcl_eval.constants.default_prompts import (
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING as ADDED_PROMPTING,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_train.envs.bfcl import PYTHON_HINT, BfclEnv, bfcl_rows, bfcl_task, opening_functions
from trace_train.envs.tooling import qwen3_tools_block
from trace_train.tools.bfcl import ADDED_FUNCTIONS_PROMPT, REFUSED_CALL, SUBSETS

from .scripted import bfcl_actions, play, tool_call

ROWS = bfcl_rows()
MISS_FUNC = "multi_turn_miss_func_3"


def test_replaying_the_ground_truth_passes_the_official_checker_for_every_task():
    failures = []
    for row in ROWS:
        env = BfclEnv()
        env.reset(row)
        results = play(env, bfcl_actions(row["id"]))
        assert [r.done for r in results] == [False] * (len(results) - 1) + [True], row["id"]
        assert not any(r.invalid for r in results)
        if env.verify() != 1.0 or env.metrics() != {"accuracy": 1.0, "completed": 1.0}:
            failures.append(row["id"])
    assert len(ROWS) == 800 and failures == []


def test_prompts_are_those_bfcl_builds_for_qwen(tmp_path):
    """Against bfcl_eval.utils.load_dataset_entry (with its language hint), run in a subprocess so that
    its folders go to tmp_path: the same documents at the start, the held-out ones at their turn."""
    script = (
        "import json, sys\nfrom bfcl_eval.utils import load_dataset_entry\nout = {}\n"
        "for s in sys.argv[1:]:\n    for e in load_dataset_entry('multi_turn_' + s):\n"
        "        out[e['id']] = [e['function'], e.get('missed_function', {}), e['question']]\n"
        "print(json.dumps(out))"
    )
    env = dict(os.environ, BFCL_PROJECT_ROOT=str(tmp_path))
    official = json.loads(subprocess.run([sys.executable, "-c", script, *SUBSETS], env=env,
                                         capture_output=True, text=True, check=True).stdout)
    assert set(official) == {row["id"] for row in ROWS}
    for task_id, (functions, missed, question) in official.items():
        env = BfclEnv()
        system, first = env.reset({"id": task_id})
        assert system == {"role": "system", "content": qwen3_tools_block(functions)}
        assert first == question[0][0]
        assert opening_functions(bfcl_task(task_id)) == functions
        for turn, messages in enumerate(question[1:], 1):  # answer each turn with no call: next turn shows
            observation = env.step("No calls.").observation
            if str(turn) in missed:  # BFCL's holdout turn has no user message of its own
                expected = ADDED_PROMPTING.format(functions=missed[str(turn)])
            else:
                expected = messages[0]["content"]
            assert observation == expected, (task_id, turn)


def test_added_functions_arrive_at_their_turn():
    task = bfcl_task(MISS_FUNC)
    [(turn, docs)] = task.added_functions.items()
    env = BfclEnv()
    system, _ = env.reset({"id": MISS_FUNC})
    held = [doc["name"] for doc in docs]
    assert not any(f'"name": "{name}"' in system["content"] for name in held)
    assert system["content"].count(PYTHON_HINT) == len(task.functions)
    for _ in range(turn):
        observation = env.step("Nothing to call.").observation
    assert observation.endswith(ADDED_FUNCTIONS_PROMPT) and all(f"'name': '{n}'" in observation for n in held)
    assert PYTHON_HINT not in observation  # BFCL adds its hint to the opening documents only


def test_a_mid_episode_snapshot_replays_on_a_fresh_instance():
    task_id = "multi_turn_base_0"
    actions = bfcl_actions(task_id)
    env = BfclEnv()
    env.reset({"id": task_id})
    cut = len(actions) // 2
    play(env, actions[:cut])
    snapshot = env.snapshot()
    factual = play(env, actions[cut:])
    env.restore(snapshot)
    play(env, [tool_call("cd", folder=".."), tool_call("rm", file_name="final_report.pdf"), "Done."])
    for instance in (BfclEnv(), env):
        instance.restore(snapshot)
        assert play(instance, actions[cut:]) == factual and instance.verify() == 1.0


def test_the_step_limit_force_quits_as_bfcl_does():
    env = BfclEnv(max_steps_per_turn=2)
    env.reset({"id": "multi_turn_base_0"})
    results = play(env, [tool_call("pwd")] * 3)
    assert [r.done for r in results] == [False, False, True] and env.snapshot().forced
    assert env.verify() == 0.0 and env.metrics() == {"accuracy": 0.0, "completed": 0.0}
    with pytest.raises(RuntimeError, match="over"):
        env.step("Done.")


def test_malformed_calls_are_error_observations_and_valid_ones_still_run():
    env = BfclEnv(observation_role="user")
    env.reset({"id": "multi_turn_base_0"})
    result = env.step(tool_call("pwd") + '<tool_call>{"name": "cd", "arguments": [1]}</tool_call>'
                      + tool_call("no_such_function", x=1))
    parts = result.observation.split("\n</tool_response>\n<tool_response>\n")
    assert result.invalid and result.role == "user" and len(parts) == 3
    assert "current_working_directory" in parts[0] and parts[1].startswith("Error: the \"arguments\" of cd")
    assert parts[2] == "Error during execution: name 'no_such_function' is not defined\n</tool_response>"
    assert env.snapshot().backend.calls == ((("pwd()", REFUSED_CALL),),)  # unknown names: never checked


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["<tool_call>", "</tool_call>", '{"name": "ls", "arguments": {}}', '{"name":',
                                 '"cd"', '"arguments": {"folder": "x"}}', "<think>", "</think>", "\n", "text",
                                 '{"name": "exit"}']), max_size=10), st.integers(0, 3))
def test_no_action_raises(pieces, extra_turns):
    env = BfclEnv()
    env.reset({"id": "multi_turn_miss_param_5"})
    for _ in range(extra_turns):
        if env.step("No calls.").done:
            break
    if not env.snapshot().finished:
        assert env.step("".join(pieces)).observation
    assert env.verify() in (0.0, 1.0)


def test_rows_and_ids_are_validated():
    assert len(bfcl_rows(["base"], split="test")) == 40 and len(bfcl_rows(split="train")) == 640
    assert bfcl_rows(["miss_func"])[0] == {"id": "multi_turn_miss_func_0", "subset": "miss_func"}
    for bad in ("multi_turn_base_999", "base_0", None, "multi_turn_nothing_1"):
        with pytest.raises(ValueError, match="no BFCL multi-turn task"):
            BfclEnv().reset({"id": bad})
    with pytest.raises(ValueError, match="max_steps_per_turn"):
        BfclEnv(max_steps_per_turn=0)
    with pytest.raises(ValueError, match="snapshot"):
        BfclEnv().restore({"turn": 0})
