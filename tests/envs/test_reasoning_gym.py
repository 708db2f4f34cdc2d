"""reasoning-gym as a task: rows by curriculum level, binary rewards from graded scores, snapshots."""

from __future__ import annotations

import json

import pytest

from trace_train.envs import make_env_factory
from trace_train.envs.reasoning_gym_env import ReasoningGymEnv, reasoning_gym_rows
from trace_train.tasks import TaskConfig, build_task


def rows(n=8, **kwargs):
    kwargs = {"dataset": "chain_sum", "levels": [0, 1], **kwargs}
    return reasoning_gym_rows(None, split="train", subset=None, size=n, seed=kwargs.pop("seed", 0), **kwargs)


def test_rows_are_seeded_json_and_mix_the_levels():
    a = rows(40)
    assert a == rows(40) and a != rows(40, seed=1)
    assert json.loads(json.dumps(a)) == a  # rows are plain JSON (stored, logged, sent to workers)
    assert {row["level"] for row in a} == {0, 1} and len({row["id"] for row in a}) == 40
    # level 0 of chain_sum: two one-digit terms; level 1: up to three terms of up to two digits
    assert all(len(row["question"].split(":")[-1].split()) == 4 for row in a if row["level"] == 0)
    assert max(int(t) for row in a if row["level"] == 1 for t in row["question"].split(":")[-1].split()
               if t.isdigit()) >= 10


def test_a_right_answer_succeeds_and_the_raw_score_is_kept():
    env = make_env_factory("reasoning_gym", {"dataset": "chain_sum"})()
    row = rows(1, levels=[0])[0]
    opening = env.reset(row)
    assert [m["role"] for m in opening] == ["system", "user"] and opening[1]["content"] == row["question"]
    result = env.step(f"<think>easy</think><answer>{row['answer']}</answer>")
    assert result.done and env.verify() == 1.0 and env.metrics() == {"success": 1.0, "score": 1.0}
    env.reset(row)
    assert env.step("no tags, just words").done and env.verify() == 0.0


def test_graded_scores_are_thresholded_as_configured():
    """countdown scores a well-formed but wrong expression 0.05: below the default threshold (full score)
    it fails, and the raw score says how close it came; threshold 0.05 counts it."""
    row = reasoning_gym_rows(None, split="train", subset=None, size=1, seed=0, dataset="countdown", levels=[0])[0]
    strict = ReasoningGymEnv("countdown")
    strict.reset(row)
    strict.step("<answer>1 + 2</answer>")
    assert strict.verify() == 0.0 and strict.metrics()["score"] == pytest.approx(0.05)
    lenient = make_env_factory("reasoning_gym", {"dataset": "countdown", "threshold": 0.05})()
    lenient.reset(row)
    lenient.step("<answer>1 + 2</answer>")
    assert lenient.verify() == 1.0


def test_attempts_make_it_multi_turn_and_snapshots_replay():
    env = ReasoningGymEnv("chain_sum", attempts=3)
    row = rows(1, levels=[0])[0]
    env.reset(row)
    first = env.step("<answer>1000</answer>")
    assert not first.done and "2 attempts left" in first.observation
    snapshot = env.snapshot()
    rest = [env.step("<answer>999</answer>"), env.step(f"<answer>{row['answer']}</answer>")]
    fresh = ReasoningGymEnv("chain_sum", attempts=3)
    fresh.restore(snapshot)
    assert [fresh.step("<answer>999</answer>"), fresh.step(f"<answer>{row['answer']}</answer>")] == rest
    assert rest[-1].done and fresh.verify() == env.verify() == 1.0
    assert snapshot[1].attempts_left == 2  # the snapshot did not move with the episode


@pytest.mark.parametrize("options, message", [
    ({}, "set the data set, e.g. task.env.dataset=countdown"),
    ({"dataset": "countdwn"}, "did you mean 'countdown'"),
    ({"dataset": "countdown", "levels": [9]}, "curriculum has levels 0..4, got 9"),
    ({"dataset": "countdown", "levels": []}, "`levels` must be a non-empty list"),
    ({"dataset": "countdown", "config": {"sides": 3}}, "bad `config` for 'countdown'"),
    ({"dataset": "chain_sum", "threshold": 0}, "`threshold` must be a score in (0, 1]"),
    ({"dataset": "chain_sum", "attempts": 0}, "`attempts` must be a positive integer"),
])
def test_bad_options_fail_in_one_line(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        make_env_factory("reasoning_gym", options)


def test_the_task_spelling_from_a_config_trains_on_questions_never_held_out():
    cfg = TaskConfig(name="reasoning_gym", env={"dataset": "chain_sum", "levels": [0]}, train_size=400, eval_size=40)
    task = build_task(cfg, seed=0)
    held_out = {row["question"] for row in task.eval_rows}
    assert len(task.eval_rows) == 40 and len(task.train_rows) == 400
    assert not held_out & {row["question"] for row in task.train_rows}
    assert "no held-out prompt occurs in training" in task.describe(cfg.name)
    assert task.demonstration(task.train_rows[0]) == [f"<answer>{task.train_rows[0]['answer']}</answer>"]
