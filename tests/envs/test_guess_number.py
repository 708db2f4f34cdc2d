"""The environment protocol and the guess-the-number task."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_train.envs import Environment, EpisodeLimits, GuessNumberEnv, GuessState, make_rows

ROW = {"target": 6, "low": 1, "high": 8, "max_guesses": 3}


def test_is_an_environment():
    assert isinstance(GuessNumberEnv(), Environment)


def test_a_game_is_played_as_documented():
    env = GuessNumberEnv()
    messages = env.reset(ROW)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "from 1 to 8" in messages[1]["content"] and "3 guesses" in messages[1]["content"]
    assert env.step("4").observation == "Higher. 2 guesses left."
    assert env.step("I guess 7.").observation == "Lower. 1 guess left."  # first integer of the text
    result = env.step("6")
    assert (result.observation, result.done, result.invalid, env.verify()) == (
        "Correct! The number was 6.",
        True,
        False,
        1.0,
    )


@pytest.mark.parametrize("action", ["", "seven", "9", "0", "-3"])
def test_invalid_actions_become_error_observations_and_use_a_guess(action):
    env = GuessNumberEnv()
    env.reset(ROW)
    result = env.step(action)
    assert result.invalid and not result.done
    assert result.observation == "Invalid guess. Reply with one whole number from 1 to 8. 2 guesses left."
    assert env.snapshot().guesses == (None,)


def test_running_out_of_guesses_ends_with_reward_zero():
    env = GuessNumberEnv()
    env.reset(ROW)
    env.step("1"), env.step("2")
    result = env.step("x")
    assert result.done and result.invalid and env.verify() == 0.0
    assert (
        result.observation
        == "Invalid guess. Reply with one whole number from 1 to 8. Out of guesses. The number was 6."
    )
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("6")


@settings(max_examples=50, deadline=None)
@given(
    actions=st.lists(st.sampled_from(["1", "3", "5", "6", "8", "x", "12"]), min_size=1, max_size=3),
    cut=st.integers(0, 3),
)
def test_restore_replays_the_same_observations(actions, cut):
    """A fresh instance restored from a snapshot answers exactly like the original from that point."""
    env = GuessNumberEnv()
    env.reset(ROW)
    observations, snapshot = [], None
    for i, a in enumerate(actions):
        if i == cut:
            snapshot = env.snapshot()
        if env.snapshot().done:
            break
        observations.append(env.step(a))
    if snapshot is None:
        return
    fresh = GuessNumberEnv()
    fresh.restore(snapshot)
    replay = [fresh.step(a) for a in actions[cut : len(observations)]]
    assert replay == observations[cut:]
    assert fresh.verify() == env.verify()


def test_snapshots_are_immutable_values():
    env = GuessNumberEnv()
    env.reset(ROW)
    before = env.snapshot()
    env.step("2")
    assert before == GuessState(6, 1, 8, 3)
    env.restore(before)
    assert env.step("2").observation == "Higher. 2 guesses left."


def _success_probability(state: GuessState) -> Fraction:
    """Exact success probability of a guesser uniform over the numbers still possible, by enumeration."""
    if state.solved:
        return Fraction(1)
    if state.done:
        return Fraction(0)
    low, high = state.low, state.high
    for g in state.guesses:
        if g is not None and g < state.target:
            low = max(low, g + 1)
        elif g is not None and g > state.target:
            high = min(high, g - 1)
    total = Fraction(0)
    for guess in range(low, high + 1):
        env = GuessNumberEnv()
        env.restore(state)
        env.step(str(guess))
        total += _success_probability(env.snapshot())
    return total / (high - low + 1)


def test_success_probability_depends_on_the_turns_taken():
    env = GuessNumberEnv()
    env.reset({"target": 5, "low": 1, "high": 8, "max_guesses": 3})
    start = env.snapshot()
    values = {}
    for action in ["4", "1", "x"]:
        env.restore(start)
        env.step(action)
        values[action] = _success_probability(env.snapshot())
    # By hand, two guesses left. After "4": 5..8 remain; guessing 5, 6, 7, 8 wins with 1, 1, 1/2, 1/3.
    # After "1": 2..8 remain; 5 wins, g < 5 wins with 1 / (8 - g), g > 5 with 1 / (g - 2).
    # After "x" (invalid): 1..8 remain; 5 wins, g < 5 wins with 1 / (8 - g), g > 5 with 1 / (g - 1).
    assert values["4"] == Fraction(1, 4) * (1 + 1 + Fraction(1, 2) + Fraction(1, 3))
    assert values["1"] == Fraction(1, 7) * (
        1 + sum(Fraction(1, 8 - g) for g in (2, 3, 4)) + sum(Fraction(1, g - 2) for g in (6, 7, 8))
    )
    assert values["x"] == Fraction(1, 8) * (
        1 + sum(Fraction(1, 8 - g) for g in (1, 2, 3, 4)) + sum(Fraction(1, g - 1) for g in (6, 7, 8))
    )
    # Halving the range keeps success likely; a poor guess, or an invalid one, makes it much less so.
    assert values["4"] > 2 * values["1"] > 2 * values["x"]


def test_make_rows_is_seeded_and_validated():
    rows = make_rows(5, high=10, max_guesses=4, seed=3)
    assert rows == make_rows(5, high=10, max_guesses=4, seed=3)
    assert all(1 <= r["target"] <= 10 and r["max_guesses"] == 4 for r in rows)
    with pytest.raises(ValueError, match="`low` \\(5\\) must not exceed `high` \\(4\\)"):
        make_rows(1, low=5, high=4)
    with pytest.raises(ValueError, match="`max_guesses` must be at least 1"):
        make_rows(1, max_guesses=0)
    with pytest.raises(ValueError, match="need the keys \\['target'\\]"):
        GuessNumberEnv().reset({"low": 1, "high": 4, "max_guesses": 2})
    with pytest.raises(ValueError, match="`target` 9 lies outside \\[1, 8\\]"):
        GuessNumberEnv().reset({**ROW, "target": 9})


def test_using_an_environment_before_reset_is_an_error():
    with pytest.raises(RuntimeError, match="reset\\(\\) or restore\\(\\)"):
        GuessNumberEnv().step("1")
    with pytest.raises(ValueError, match="`snapshot` must be a GuessState"):
        GuessNumberEnv().restore({"target": 1})


@pytest.mark.parametrize("field", ["max_turns", "max_turn_tokens", "max_context_tokens"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_limits_are_validated(field, value):
    with pytest.raises(ValueError, match=f"`{field}` must be a positive integer"):
        EpisodeLimits(**{field: value})
