"""Key, then lock (``task.name=key_lock``): rewards, parsing, rows, the held-out split and the scripted player."""

from __future__ import annotations

import numpy as np
import pytest

from trace_train.configs import TaskConfig
from trace_train.envs import Environment
from trace_train.envs.key_lock_env import KeyLockEnv, make_rows, random_player
from trace_train.envs.registry import make_env_factory
from trace_train.tasks import build_task

ROW = {"id": "key_lock/K3/0-0", "keys": ["red", "blue", "green"], "marks": ["star", "moon", "sun"], "lock": "moon",
       "right_key": "blue", "lamp": "lit", "right_chest": "left"}


def play(actions, row=ROW):
    env = KeyLockEnv()
    opening = env.reset(row)
    results = [env.step(a) for a in actions]
    return env, opening, results


def test_is_an_environment_registered_as_key_lock():
    factory = make_env_factory("key_lock")
    assert isinstance(factory(), Environment) and factory.binary_rewards


def test_the_prompt_shows_the_lock_and_every_key_with_its_mark():
    _, opening, _ = play([])
    assert [m["role"] for m in opening] == ["system", "user"]
    assert opening[1]["content"] == ("The lock bears a moon. You hold 3 keys: red key (star), blue key (moon), "
                                     "green key (sun). Which key do you use?")
    assert "lamp is lit the treasure is in the left chest" in opening[0]["content"]


@pytest.mark.parametrize("key, chest, reward", [("blue", "left", 1.0), ("blue", "right", 0.0),
                                                ("red", "left", 0.0), ("green", "right", 0.0)])
def test_the_reward_needs_the_right_key_and_the_right_chest(key, chest, reward):
    env, _, (door, end) = play([key, chest])
    assert door.observation.startswith("The door opens. The lamp is lit." if key == "blue" else "The door stays shut.")
    assert not door.done and end.done and env.verify() == reward
    assert env.metrics() == {"success": reward, "opened": float(key == "blue")}


def test_a_dark_lamp_puts_the_treasure_in_the_right_chest():
    row = dict(ROW, lamp="dark", right_chest="right")
    assert play(["blue", "right"], row)[0].verify() == 1.0 and play(["blue", "left"], row)[0].verify() == 0.0


def test_actions_are_read_as_the_first_key_or_chest_they_name():
    env, _, _ = play(["I will use the Blue key, not the red one.", "Left!"])
    assert env.verify() == 1.0
    assert play(["blueish", "left"])[0].state.key is None  # a whole word only


@pytest.mark.parametrize("action", ["", "gold", "the key", "42"])
def test_a_bad_key_gets_one_line_naming_the_keys_and_shuts_the_door(action):
    env, _, (door,) = play([action])
    assert door.invalid and not door.done
    assert door.observation == ("Invalid key: reply with one of red, blue, green. The door stays shut. "
                                "Which chest do you open, left or right?")
    env.step("left")
    assert env.verify() == 0.0


def test_a_bad_chest_ends_the_episode_with_reward_zero():
    env, _, (_, end) = play(["blue", "up"])
    assert end.invalid and end.done and end.observation == "Invalid chest: reply left or right. No chest is opened."
    assert env.verify() == 0.0
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("left")


def test_a_branch_restored_from_the_prefix_sees_what_the_prefix_saw():
    env, _, _ = play(["blue"])
    snapshot = env.snapshot()
    branch = KeyLockEnv()
    branch.restore(snapshot)
    assert branch.step("left").observation == "You found the treasure!" and branch.verify() == 1.0
    assert env.snapshot() == snapshot and env.verify() == 0.0  # the prefix is untouched


def test_bad_rows_and_options_fail_in_one_line():
    with pytest.raises(ValueError, match="need the keys") as error:
        KeyLockEnv().reset({"keys": ["red"]})
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="right key among them"):
        KeyLockEnv().reset(dict(ROW, lock="star"))
    with pytest.raises(ValueError, match="`keys` must be a key count"):
        make_rows(4, keys=[0, 2])
    with pytest.raises(ValueError, match="`keys` must be a key count"):
        make_rows(4, keys=[9])


def test_rows_are_seeded_and_mix_the_key_counts():
    rows = make_rows(600, keys=[1, 2, 4, 8], seed=3)
    assert rows == make_rows(600, keys=[1, 2, 4, 8], seed=3) and rows != make_rows(600, keys=[1, 2, 4, 8], seed=4)
    counts = np.bincount([len(r["keys"]) for r in rows], minlength=9)
    assert set(np.flatnonzero(counts)) == {1, 2, 4, 8} and counts.min(initial=600, where=counts > 0) > 100
    for r in rows:
        assert len(set(r["keys"])) == len(r["keys"]) == len(r["marks"]) and r["marks"][r["keys"].index(r["right_key"])] == r["lock"]
        assert r["right_chest"] == ("left" if r["lamp"] == "lit" else "right")
    assert abs(np.mean([r["lamp"] == "lit" for r in rows]) - 0.5) < 0.07  # 3.4 standard errors


def test_no_held_out_prompt_occurs_in_training_and_task_rows_set_the_mix():
    cfg = TaskConfig(name="key_lock", rows={"keys": [2, 8]}, train_size=400, eval_size=48)
    task = build_task(cfg, seed=0)
    env = task.make_env()
    train = {tuple(m["content"] for m in env.reset(r)) for r in task.train_rows}
    held_out = {tuple(m["content"] for m in env.reset(r)) for r in task.eval_rows}
    assert len(task.eval_rows) == 48 and not train & held_out
    assert {len(r["keys"]) for r in task.train_rows} == {2, 8}


def test_the_scripted_player_is_right_about_the_key_one_time_in_k_and_about_the_chest_half_the_time():
    """It starts the tiny model low: success about the mean of 1/(2K) (0.146 for the default mix 2, 4, 8)."""
    rows = make_rows(4000, seed=0)
    won, opened, chest_right = [], [], []
    for row in rows:
        actions = random_player(row)
        assert actions == random_player(row) and len(actions) == 2  # seeded by the row
        env, _, _ = play(actions, row)
        won.append(env.verify())
        opened.append(env.state.opened)
        if env.state.opened:
            chest_right.append(env.verify())
    expected = np.mean([1 / (2 * len(r["keys"])) for r in rows])
    assert abs(np.mean(won) - expected) < 4 * np.sqrt(expected * (1 - expected) / len(rows))
    assert abs(np.mean(chest_right) - 0.5) < 4 * np.sqrt(0.25 / len(chest_right))
    assert abs(np.mean(opened) - np.mean([1 / len(r["keys"]) for r in rows])) < 0.03
