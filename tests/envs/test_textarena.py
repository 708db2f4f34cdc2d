"""TextArena's single-player games as the ``textarena`` environment: rewards from the game's end-of-game
score, one-line refusals, an honest held-out split, exact snapshots and the scripted experts."""

from __future__ import annotations

import random

import pytest

from trace_train.configs import TaskConfig
from trace_train.envs import Environment
from trace_train.envs.registry import make_env_factory
from trace_train.envs.textarena_env import TextArenaEnv, demonstration, make_rows
from trace_train.tasks import build_task

pytest.importorskip("textarena")


def row(game: str, seed: int, **extra) -> dict:
    return {"id": f"{game}/L0/{seed}", "game": game, "seed": seed, **extra}


def test_a_frozen_lake_game_is_played_in_the_games_own_format():
    env = TextArenaEnv()
    assert isinstance(env, Environment)
    messages = env.reset(row("FrozenLake-v0", 3))
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"].startswith("Welcome to Frozen Lake!") and "P" in messages[1]["content"]
    actions = demonstration(row("FrozenLake-v0", 3))
    results = [env.step(a) for a in actions]
    assert [r.done for r in results] == [False] * (len(actions) - 1) + [True]
    assert "You reached the goal" in results[-1].observation and results[0].observation.startswith("You moved")
    assert (env.verify(), env.score(), env.metrics()) == (1.0, 1.0, {"success": 1.0, "score": 1.0, "finished": 1.0})


def test_a_loss_keeps_the_games_partial_score_and_is_reward_zero():
    game = row("FrozenLake-v0", 3)
    env = TextArenaEnv()
    env.reset(game)
    hole = _first_move_into_a_hole(env)
    assert hole is not None
    result = env.step(hole)
    assert result.done and "fell into a hole" in result.observation
    assert 0.0 <= env.score() < 1.0 and env.verify() == 0.0


def _first_move_into_a_hole(env):
    """Walk the expert's path until a neighbouring cell is a hole; return the move into it."""
    moves = {"[up]": (-1, 0), "[down]": (1, 0), "[left]": (0, -1), "[right]": (0, 1)}
    for action in demonstration(env._row):
        state = env.game.state.game_state
        r, c = state["player_pos"]
        for move, (dr, dc) in moves.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(state["grid"]) and 0 <= nc < len(state["grid"]) and state["grid"][nr][nc] == "H":
                return move
        env.step(action)
    return None


def test_a_non_binary_score_is_thresholded_as_configured():
    """A fall into a hole scores the share of the way walked; the reward is 1 when it reaches the threshold."""
    outcomes = {}
    for threshold in (1.0, 0.3, 0.5):
        env = make_env_factory("textarena", {"env_id": "FrozenLake-v0", "success_threshold": threshold})()
        env.reset(row("FrozenLake-v0", 4))
        assert env.step(_first_move_into_a_hole(env)).done
        outcomes[threshold] = (env.score(), env.verify())
    score = outcomes[1.0][0]
    assert 0.3 <= score < 0.5
    assert outcomes == {1.0: (score, 0.0), 0.3: (score, 1.0), 0.5: (score, 0.0)}


def test_two_invalid_moves_in_a_row_end_the_game():
    env = TextArenaEnv()
    env.reset(row("TowerOfHanoi-v0", 0))
    first = env.step("no idea")
    assert first.invalid and not first.done and "invalid move" in first.observation
    second = env.step("still no idea")
    assert second.invalid and second.done and env.verify() == 0.0
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("[A C]")


@pytest.mark.parametrize("env_id, message", [
    ("TicTacToe-v0", "textarena game 'TicTacToe-v0' is not a single-player game (its reset with one player says: "
                     "The number of players has to be 2, received 1)"),
    ("PublicGoodsGame-v0", "is not a single-player game (it keeps a FFAMultiPlayerState)"),
    ("Wordle-v0", "textarena game 'Wordle-v0' needs the nltk resource 'words', which is not installed"),
    ("FrozenLak-v0", "unknown textarena game 'FrozenLak-v0'; did you mean FrozenLake-v0"),
    (None, "textarena needs `env_id`"),
    ("ScorableGames-v0", "textarena game 'ScorableGames-v0' cannot be reset: FileNotFoundError"),
    ("Chess-v0", "textarena game 'Chess-v0' cannot be built: SyntaxError"),
])
def test_games_that_cannot_be_played_fail_in_one_line(env_id, message):
    with pytest.raises(ValueError) as error:
        make_env_factory("textarena", {"env_id": env_id})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_nothing_is_downloaded_for_a_word_game(monkeypatch):
    nltk = pytest.importorskip("nltk")
    calls = []
    monkeypatch.setattr(nltk, "download", lambda *a, **k: calls.append(a))
    with pytest.raises(ValueError, match="nltk resource"):
        make_env_factory("textarena", {"env_id": "Hangman-v0"})
    assert calls == []  # held off while the game module imports


@pytest.mark.parametrize("env_id, n_train", [("FrozenLake-v0-hardcore", 1500), ("Mastermind-v0", 1500),
                                             ("FrozenLake-v0", None)])
def test_no_held_out_prompt_occurs_in_training(env_id, n_train):
    """FrozenLake shows its map (openings differ by seed; the 4x4 one has only a few hundred maps, so fewer
    rows); Mastermind's hidden code does not show, so its prompts carry the game's number. Either way every
    row's prompt is distinct and no held-out prompt trains."""
    cfg = TaskConfig(name="textarena", env={"env_id": env_id}, train_size=1500, eval_size=48)
    task = build_task(cfg, seed=0)
    env = task.make_env()
    train = [tuple(m["content"] for m in env.reset(r)) for r in task.train_rows]
    held_out = [tuple(m["content"] for m in env.reset(r)) for r in task.eval_rows]
    assert len(held_out) == 48 and len(set(held_out)) == 48 and not set(train) & set(held_out)
    assert len(set(train)) == len(train) == (n_train or len(train)) and len(train) > 100


def test_rows_are_seeded_distinct_and_mix_levels():
    games = ["FrozenLake-v0", "TowerOfHanoi-v0"]
    rows = make_rows(games, 40, seed=3)
    assert rows == make_rows(games, 40, seed=3) != make_rows(games, 40, seed=4)
    assert {r["level"] for r in rows} == {0, 1} and len(rows) == 40
    assert all(r["id"] == f"{r['game']}/L{r['level']}/{r['seed']}" for r in rows)
    assert {r["numbered"] for r in rows if r["game"] == "TowerOfHanoi-v0"} == {True}
    assert {r["numbered"] for r in rows if r["game"] == "FrozenLake-v0"} == {False}
    small = make_rows("FrozenLake-v0", 2000, seed=0)  # a few hundred maps: each once, then it stops
    assert 100 < len(small) < 2000
    openings = [TextArenaEnv().reset(r)[1]["content"] for r in small]
    assert len(set(openings)) == len(openings)


def _play(env, actions):
    return [(r.observation, r.done, r.invalid) for r in map(env.step, actions)]


def test_a_branch_restored_from_a_snapshot_replays_identically_with_the_games_randomness():
    """Blackjack draws cards after reset: a restored branch draws the same cards, even when other games
    draw from ``random`` in between, and later steps do not change the snapshot."""
    factory = make_env_factory("textarena", {"env_id": "Blackjack-v0"})
    env = factory()
    env.reset(row("Blackjack-v0", 21))
    env.step("[Hit]")
    snapshot = env.snapshot()
    branch = ["[Hit]", "[Stand]", "[Hit]", "[Stand]", "[Stand]", "[Stand]"]
    factual = _play(env, branch)
    random.seed(999)
    other = factory()
    other.reset(row("Blackjack-v0", 22))
    for _ in range(3):
        restored = factory()  # never reset: the snapshot alone carries the state
        restored.restore(snapshot)
        other.step("[Hit]") if not other.game.state.done else None
        random.random()
        assert _play(restored, branch) == factual
        assert (restored.verify(), restored.score()) == (env.verify(), env.score())


def test_the_scripted_experts_win():
    for game in ("FrozenLake-v0", "FrozenLake-v0-hardcore", "TowerOfHanoi-v0", "GuessTheNumber-v0"):
        for r in make_rows(game, 6, seed=1):
            env = TextArenaEnv()
            env.reset(r)
            results = _play(env, demonstration(r))
            assert results[-1][1] and env.verify() == 1.0, (game, r["seed"])


def test_uniform_tree_continues_textarena_games_from_mid_game_states(hf_backend):
    """Through the real engine: continuations branch after one or more turns of a game, and every prefix's
    snapshot, restored on a fresh instance, answers its children's actions as the factual rollout saw."""
    import numpy as np

    from trace_theory import Origin
    from trace_train.envs import EpisodeLimits
    from trace_train.chat import ChatFormat
    from trace_train.rollout.engine import RolloutConfig, RolloutEngine

    factory = make_env_factory("textarena", {"env_id": ["FrozenLake-v0", "Blackjack-v0"]})
    rows = make_rows(["FrozenLake-v0", "Blackjack-v0"], 3, seed=5)
    config = RolloutConfig(policy="uniform_tree", roots=2 * len(rows), continuations_per_root=2, group_size=2,
                           temperature=1.0, limits=EpisodeLimits(max_turns=4, max_turn_tokens=8,
                                                                 max_context_tokens=2048), seed=0)
    engine = RolloutEngine(hf_backend, factory, config, chat=ChatFormat(hf_backend.tokenizer))
    batch = engine.rollout(rows, seed=0)
    forest, nodes = batch.forest.validate(), batch.nodes
    starts = np.flatnonzero((forest.origin == Origin.CONTINUATION) & forest.starts_rollout)
    branch_depths = forest.depth[forest.parent[starts]]
    assert len(starts) > 0 and branch_depths.max() >= 1  # some continuation starts mid-game
    checked = 0
    for node in np.flatnonzero(~forest.is_leaf & (forest.depth >= 1)).tolist():
        for child in forest.children(node).tolist():
            if nodes[child].finish_reason == "stop":
                env = factory()
                env.restore(nodes[node].snapshot)
                assert env.step(nodes[child].action).observation == nodes[child].observation
                checked += 1
    assert checked > 0


def test_trace_eval_plays_the_trainers_held_out_games(tmp_path):
    from trace_train.evaluate import EvalConfig, load_tasks, summarize

    options = {"env_id": ["FrozenLake-v0", "TowerOfHanoi-v0"]}
    config = EvalConfig(model="unused", benchmark="textarena", output_dir=str(tmp_path), env_options=options,
                        limit=16)
    task = build_task(TaskConfig(name="textarena", env=options, train_size=200, eval_size=16), seed=0)
    assert load_tasks(config) == task.eval_rows
    records = [{"id": r["id"], "rewards": [1.0, 0.0], "samples": [
        {"reward": x, "turns": 1, "end_reason": "done", "generated_tokens": 3, "metrics": {"success": x, "score": x or 0.5, "finished": 1.0}} for x in (1.0, 0.0)]}
        for r in task.eval_rows]
    metrics = summarize("textarena", records, k=2)["metrics"]
    assert metrics["success"] == 0.5 and metrics["score"] == 0.75 and metrics["pass@2"] == 1.0
    assert set(metrics["per_level"]) == {f"L{r['level']}" for r in task.eval_rows} == {"L0", "L1"}
    with pytest.raises(ValueError, match="needs the game: --env-options"):
        EvalConfig(model="unused", benchmark="textarena", output_dir=str(tmp_path))
