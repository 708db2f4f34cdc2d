"""The target-sum example (``examples/target_sum/``), a new user's all-fail task that checks the advice of
docs/training.md's "My run does not learn": its environment's rewards and parsing, its scripted expert, its
rows (regenerated exactly by its script, loaded through the documented command's config), and one training
step of the documented command through the installed ``trace-train``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trace_train.bench import newcomer
from trace_train.config_loader import load_config
from trace_train.configs import TrainConfig
from trace_train.envs.spec import find_environment
from trace_train.tasks import build_task

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "target_sum"
MARKER = "<!-- worked example: target sum -->"


def documented_commands() -> list[list[str]]:
    """The commands of the fenced block after MARKER in docs/training.md, continuations joined."""
    text = (REPO / "docs" / "training.md").read_text()
    assert MARKER in text, f"docs/training.md lost its {MARKER!r} marker"
    block = re.search(r"```(?:bash)?\n(.*?)```", text[text.index(MARKER):], re.S).group(1)
    lines = re.sub(r"\s*\\\n\s*", " ", block).splitlines()
    return [shlex.split(ln, comments=True) for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def rows(name: str = "rows.jsonl") -> list[dict]:
    return [json.loads(line) for line in (EXAMPLE / name).read_text().splitlines()]


@pytest.fixture
def env_class():
    return find_environment(f"{EXAMPLE}/target_sum_env.py:TargetSumEnv").factory


def test_an_episode_is_rewarded_only_when_the_sum_hits_the_target(env_class):
    env = env_class()
    opening = env.reset({"target": 9, "numbers": [2, 4, 7], "turns": 3})
    assert "9" in opening[-1]["content"] and "2, 4, 7" in opening[-1]["content"]
    first = env.step("I say 2")                      # the first whole number counts
    assert (first.done, first.invalid, env.verify()) == (False, False, 0.0) and "Sum 2" in first.observation
    snapshot = env.snapshot()
    assert env.step("7").done and env.verify() == 1.0
    env.restore(snapshot)                            # back to sum 2, two turns left
    wrong = env.step("5")                            # not allowed: costs the turn, the sum stays
    assert "5 is not allowed" in wrong.observation and "Sum 2" in wrong.observation and not wrong.done
    last = env.step("no idea")
    assert last.invalid and last.done and env.verify() == 0.0


def test_passing_the_target_ends_the_episode_unrewarded(env_class):
    env = env_class()
    env.reset({"target": 3, "numbers": [1, 5, 8], "turns": 2})
    result = env.step("5")
    assert result.done and env.verify() == 0.0 and "Over the target" in result.observation


def test_a_row_missing_a_key_is_one_clear_error(env_class):
    with pytest.raises(ValueError, match=r"need the keys \['turns'\]"):
        env_class().reset({"target": 3, "numbers": [1, 2]})


def test_the_scripted_expert_solves_every_row_within_its_turns():
    spec = find_environment(f"{EXAMPLE}/target_sum_env.py:TargetSumExpertEnv").spec
    make = find_environment(f"{EXAMPLE}/target_sum_env.py:TargetSumExpertEnv").factory
    for row in rows() + rows("rows_easier.jsonl"):
        env, actions = make(), spec.demonstration(row)
        env.reset(row)
        assert 1 <= len(actions) <= row["turns"]
        results = [env.step(action) for action in actions]
        assert results[-1].done and env.verify() == 1.0, row


def test_the_rows_script_writes_the_committed_files(tmp_path, monkeypatch):
    script = (EXAMPLE / "make_rows.py").read_text()
    namespace = {"__name__": "make_rows", "__file__": str(tmp_path / "make_rows.py")}
    exec(compile(script, "make_rows.py", "exec"), namespace)
    namespace["main"]()
    for name in ("rows.jsonl", "rows_heldout.jsonl", "rows_train.jsonl", "rows_easier.jsonl"):
        assert (tmp_path / name).read_text() == (EXAMPLE / name).read_text(), name
    assert len(rows()) == 96 and rows("rows_heldout.jsonl") == rows()[:24]


def test_the_documented_commands_are_the_benchmarks_settings():
    commands = documented_commands()
    assert len(commands) >= 2 and {c[0] for c in commands} == {".venv/bin/trace-train"}
    for command in commands:
        setting = command[-1].removeprefix("run_dir=runs/target_sum_")
        assert setting in newcomer.SETTINGS and command[1:-1] == newcomer.arguments(setting), command


def test_the_rows_load_through_the_documented_commands_config(monkeypatch):
    monkeypatch.chdir(REPO)
    flat = load_config(TrainConfig, None, documented_commands()[0][1:])
    plain = build_task(flat.task, seed=0, hold_out=True)
    assert (len(plain.train_rows), len(plain.eval_rows)) == (72, 24)
    assert plain.eval_rows == rows()[:24]
    easier = load_config(TrainConfig, None, newcomer.arguments("warm_easier"))  # the advice's step 2
    mixed = build_task(easier.task, seed=0, hold_out=True)
    assert mixed.eval_rows == plain.eval_rows and len(mixed.train_rows) == 144 and mixed.dropped == 0


def test_one_training_step_of_the_documented_command(tmp_path):
    command = Path(sys.executable).with_name("trace-train")
    argv = [a for a in documented_commands()[1][1:] if not a.startswith(("run_dir=", "model.tiny_warm_steps="))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(command), *argv, "steps=1", "model.tiny_warm_steps=4", f"run_dir={tmp_path}/run"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if m.get("step") == 1]
    assert trained and trained[0]["rollouts"] > 0 and 0.0 <= trained[0]["all_fail_group_share"] <= 1.0
    assert any("eval_success" in m for m in metrics) and (tmp_path / "run" / "hf").is_dir()
