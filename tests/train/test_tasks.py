"""Tasks: every environment reachable from a training config, with rows and clear errors."""

import pytest

from trace_train.tasks import TaskConfig, build_task


def test_guess_number_rows_and_held_out_rows_differ():
    task = build_task(TaskConfig(rows={"high": 6, "max_guesses": 3}, train_size=50, eval_size=10), seed=0)
    assert len(task.train_rows) == 50 and len(task.eval_rows) == 10
    assert all(row["high"] - row["low"] == 5 for row in task.train_rows) and task.binary_rewards
    assert task.make_env().reset(task.train_rows[0])


def test_guess_number_can_mix_difficulties():
    task = build_task(TaskConfig(rows={"highs": [2, 64], "max_guesses": 3, "shift": 0}, train_size=200, eval_size=20),
                      seed=0, hold_out=False)
    highs = [row["high"] for row in task.train_rows]
    assert set(highs) == {2, 64} and 60 < highs.count(2) < 140
    assert task.train_rows == build_task(TaskConfig(rows={"highs": [2, 64], "max_guesses": 3, "shift": 0},
                                                    train_size=200, eval_size=20), seed=0, hold_out=False).train_rows


def test_guess_number_can_mix_episode_lengths_and_slow_steps():
    """``max_guesses`` as a list: each row draws its guess budget (binomial SE of a share of 200 draws
    is 0.035; the bounds are 3 SE around 1/2). ``step_seconds``: every step sleeps that long."""
    import time

    rows = {"highs": [2, 64], "max_guesses": [1, 8], "shift": 0}
    task = build_task(TaskConfig(rows=rows, env={"step_seconds": 0.05}, train_size=200, eval_size=20), seed=0,
                      hold_out=False)
    budgets = [row["max_guesses"] for row in task.train_rows]
    assert set(budgets) == {1, 8} and 0.395 < budgets.count(1) / 200 < 0.605
    assert {row["high"] for row in task.train_rows} == {2, 64}  # ranges drawn as without the list
    env = task.make_env()
    env.reset(task.train_rows[0])
    start = time.perf_counter()
    env.step("1")
    assert time.perf_counter() - start >= 0.05
    with pytest.raises(ValueError, match=r"`max_guesses` must be a positive integer or a non-empty list of them, got \[0\]"):
        build_task(TaskConfig(rows={"max_guesses": [0]}), seed=0)
    with pytest.raises(ValueError, match="`step_seconds` must be a non-negative number of seconds, got -1"):
        build_task(TaskConfig(env={"step_seconds": -1}), seed=0).make_env()


def test_search_qa_on_the_demo_set_keeps_held_out_rows_aside():
    task = build_task(TaskConfig(name="search_qa", train="demo", eval_size=4), seed=0)
    ids = {row["id"] for row in task.train_rows}
    assert task.eval_rows and not ids & {row["id"] for row in task.eval_rows}
    assert task.make_env.tools  # the search tool's schema goes to the chat template


def test_math_from_a_local_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(f'{{"problem": "What is {i} + {i}?", "answer": "{2 * i}"}}\n' for i in range(12)))
    task = build_task(TaskConfig(name="math_python", train=str(path), eval_size=2), seed=0)
    assert len(task.eval_rows) == 2 and len(task.train_rows) == 10
    assert task.train_rows[0]["answer"] == "4"


def test_bfcl_uses_the_stored_split():
    task = build_task(TaskConfig(name="bfcl", train="train", eval="test", train_size=8, eval_size=4,
                                 rows={"subsets": ["base"]}), seed=0)
    assert len(task.train_rows) == 8 and len(task.eval_rows) == 4
    assert not {r["id"] for r in task.train_rows} & {r["id"] for r in task.eval_rows}


def test_graded_rewards_are_declared():
    assert not TaskConfig(name="search_qa", train="demo", env={"reward": "token_f1"}).binary_rewards


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="chess"), r"unknown environment 'chess'; known: bfcl, guess_number, key_lock, math_python, reasoning_gym"),
        (dict(name="math_python"), r"task 'math_python' needs `task.train`"),
        (dict(rows={"width": 3}), r"task 'guess_number' has no row option 'width'; row options: \['high', 'highs', 'low', 'max_guesses', 'shift'\]"),
        (dict(train="x.jsonl", eval="y.jsonl", rows={"high": 4}), r"`task.rows` shapes generated rows"),
        (dict(eval_size=0), r"`train_size` and `eval_size` must be at least 1"),
    ],
)
def test_task_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TaskConfig(**kwargs)


def test_unknown_environment_option_fails_when_the_task_is_built():
    with pytest.raises(ValueError, match=r"environment 'math_python' has no option 'max_calls'"):
        build_task(TaskConfig(name="math_python", train="demo.jsonl", env={"max_calls": 3}), seed=0)


def test_stored_rows_replace_generated_ones(tmp_path):
    """Any environment reads rows from a file: guess_number's training games from JSONL, held-out generated."""
    import json

    games = [{"target": t, "low": 1, "high": 9, "max_guesses": 4} for t in (3, 7, 5, 2)]
    (tmp_path / "games.jsonl").write_text("".join(json.dumps(g) + "\n" for g in games))
    task = build_task(TaskConfig(train=str(tmp_path / "games.jsonl"), eval_size=2), seed=0)
    assert task.train_rows == games
    assert len(task.eval_rows) == 2 and all(r["high"] - r["low"] == 15 for r in task.eval_rows)  # generated, defaults


# ---------------------------------------------------------------------------------------------------
# Held-out prompts never occur in training, for every registered task
# ---------------------------------------------------------------------------------------------------

def _math_file(tmp_path):
    """Problems where the first rows (held out) repeat later (training) rows: the repeats must not train."""
    path = tmp_path / "train.jsonl"
    problems = [i % 9 for i in range(24)]
    path.write_text("".join(f'{{"problem": "What is {i} + {i}?", "answer": "{2 * i}"}}\n' for i in problems))
    return dict(name="math_python", train=str(path), eval_size=6)


HELD_OUT_CONFIGS = {
    "guess_number": lambda tmp: dict(train_size=300, eval_size=32),
    "math_python": _math_file,
    "search_qa": lambda tmp: dict(name="search_qa", train="demo", eval_size=4),
    "bfcl": lambda tmp: dict(name="bfcl", train="train", eval="test", train_size=8, eval_size=4,
                             rows={"subsets": ["base"]}),
    "reasoning_gym": lambda tmp: dict(name="reasoning_gym", env={"dataset": "chain_sum", "levels": [0]},
                                      train_size=300, eval_size=32),
    "textarena": lambda tmp: dict(name="textarena", env={"env_id": ["FrozenLake-v0", "Mastermind-v0"]},
                                  train_size=300, eval_size=32),
    "key_lock": lambda tmp: dict(name="key_lock", train_size=300, eval_size=32),
}


def test_every_registered_task_has_a_held_out_case():
    from trace_train.envs import ENVIRONMENTS

    assert set(ENVIRONMENTS.names()) <= set(HELD_OUT_CONFIGS), "add the new environment to HELD_OUT_CONFIGS"


@pytest.mark.parametrize("name", sorted(HELD_OUT_CONFIGS))
def test_no_held_out_prompt_occurs_in_training(name, tmp_path):
    """What the model is shown at the start of an episode (the opening messages) of a held-out row is never
    the opening of a training row: held-out success measures prompts the policy never trained on."""
    import json

    task = build_task(TaskConfig(**HELD_OUT_CONFIGS[name](tmp_path)), seed=0)
    env = task.make_env()
    opening = lambda rows: {json.dumps(env.reset(row), sort_keys=True) for row in rows}  # noqa: E731
    assert task.eval_rows and task.train_rows
    assert not opening(task.eval_rows) & opening(task.train_rows)


def test_repeated_prompts_are_dropped_from_training_and_the_start_up_line_says_so(tmp_path):
    task = build_task(TaskConfig(**_math_file(tmp_path)), seed=0)
    # rows 0-5 are held out (problems 0-5); training keeps rows 6-23 except repeats of 0-5 (rows 9-14, 18-23)
    assert [row["problem"] for row in task.eval_rows] == [f"What is {i} + {i}?" for i in range(6)]
    assert len(task.train_rows) == 6 and task.dropped == 12
    assert "6 training rows, 6 held out" in task.describe("math_python")
    assert "12 training rows whose prompt is held out were dropped" in task.describe("math_python")


def test_guess_number_rows_show_their_range_so_held_out_games_are_new_ranges():
    task = build_task(TaskConfig(rows={"high": 6, "max_guesses": 3}, train_size=300, eval_size=16), seed=0)
    held = {(r["low"], r["high"]) for r in task.eval_rows}
    assert len({(r["low"], r["high"]) for r in task.train_rows}) > 10 and held and not held & {
        (r["low"], r["high"]) for r in task.train_rows}
    assert all(r["high"] - r["low"] == 5 and r["low"] <= r["target"] <= r["high"] for r in task.train_rows)
    # one range, no shift: one prompt, which cannot be both trained on and held out
    with pytest.raises(ValueError, match=r"none of its generated prompts is (held out|left for training).*task.rows.shift"):
        build_task(TaskConfig(rows={"high": 6, "max_guesses": 3, "shift": 0}, train_size=300, eval_size=16), seed=0)
