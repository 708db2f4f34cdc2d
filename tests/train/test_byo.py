"""Bring your own environment: trained through the installed ``trace-train`` command, no package edits.

These run the recipes of ``docs/extending.md``: the example in ``examples/parity_game``, a module of
one's own named by ``task.name=module:Class``, and a third-party package's entry point.
"""

import json
import os
import sys
import subprocess
from pathlib import Path

import numpy as np
import pytest

from trace_train.run.metrics_log import read_metrics

REPO = Path(__file__).resolve().parents[2]
FAST = ["steps=2", "device=cpu", "tensorboard=false", "eval.every=2", "eval.prompts=4", "eval.samples=2",
        "rollout.pool_size=4", "rollout.roots=8", "rollout.group_size=4"]

MY_ENV = '''
class MyEnv:
    """Say the row's word back. Rows: {"word": ...}."""

    def __init__(self, *, greeting="Repeat the word."):
        self.greeting, self.state = greeting, None

    def reset(self, row):
        self.state = (row["word"], False)
        return [{"role": "system", "content": self.greeting}, {"role": "user", "content": row["word"]}]

    def step(self, action):
        from trace_train.envs.base import StepResult

        self.state = (self.state[0], self.state[0] in action)
        return StepResult("ok" if self.state[1] else "no", done=True)

    def verify(self):
        return float(self.state[1])

    def snapshot(self):
        return self.state

    def restore(self, snapshot):
        self.state = snapshot
'''


def _trace_train(*args, cwd, pythonpath=()):
    """The installed command (its console script), with this checkout first on the path."""
    command = Path(sys.executable).with_name("trace-train")  # the venv's script, whether or not it is on PATH
    assert command.is_file(), f"trace-train is not installed next to {sys.executable} (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(REPO)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(command), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _check_trained(run_dir: Path):
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    evals = [r["eval_success"] for r in rows if "eval_success" in r]
    assert len(evals) == 2 and all(0.0 <= e <= 1.0 for e in evals)  # held-out success at steps 0 and 2
    assert all(np.isfinite(r["loss"]) for r in rows[1:])
    assert (run_dir / "hf" / "config.json").exists()


def test_the_example_trains_with_its_config_file(tmp_path):
    out = _trace_train("--config", "examples/parity_game/config.yaml", f"run_dir={tmp_path}", *FAST, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    _check_trained(tmp_path)


def test_a_module_of_ones_own_trains_by_import_path(tmp_path):
    (tmp_path / "mymodule.py").write_text(MY_ENV)
    words = ["apple", "river", "stone", "cloud", "seven", "green", "tiger", "house"] * 3
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"word": w}) + "\n" for w in words))
    out = _trace_train("task.name=mymodule:MyEnv", "task.train=rows.jsonl", "task.eval_size=4",
                       "task.env={greeting: 'Say it back.'}", "run_dir=run", "model.tiny_warm_steps=5",
                       "rollout.limits.max_turns=1", "rollout.limits.max_turn_tokens=4",
                       "max_length_cut_share=1",  # a 5-step warm start rarely ends a word in 4 tokens: train on
                       *FAST, cwd=tmp_path, pythonpath=[tmp_path])
    assert out.returncode == 0, out.stderr[-3000:]
    _check_trained(tmp_path / "run")
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "mymodule:MyEnv" in config and "Say it back." in config


def test_import_path_errors_are_one_line(tmp_path):
    (tmp_path / "mymodule.py").write_text(MY_ENV)
    cases = [("task.name=nomodule:MyEnv", "cannot import 'nomodule' for environment 'nomodule:MyEnv'"),
             ("task.name=mymodule:Nope", "module 'mymodule' has no attribute 'Nope'"),
             ("task.name=mymodule:MyEnv", "task 'mymodule:MyEnv' needs `task.train`")]
    for override, message in cases:
        out = _trace_train("--print-config", override, cwd=tmp_path, pythonpath=[tmp_path])
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


PLUGIN = '''
from mymodule import MyEnv
from trace_train.envs.spec import TaskSpec


def counting_rows(source, *, split, subset, size, seed, start=0):
    return [{"word": str(start + i)} for i in range(size)]


class CountEnv(MyEnv):
    task_spec = TaskSpec(rows=counting_rows, row_options={"start": 0}, data="generated")


class EchoEnv(MyEnv):
    """No task spec: rows are read from task.train / task.eval."""
'''


def _install_plugin(site: Path) -> None:
    """A distribution as pip would leave it: the module and a dist-info with its entry points."""
    (site / "mymodule.py").write_text(MY_ENV)
    (site / "count_plugin.py").write_text(PLUGIN)
    info = site / "count_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: count-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[trace_rl.environments]\ncounting = count_plugin:CountEnv\n"
                                           "echo = count_plugin:EchoEnv\n")


def test_an_entry_point_registers_an_environment_with_its_task_spec(tmp_path, monkeypatch):
    _install_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from trace_train.configs import TaskConfig
    from trace_train.tasks import build_task

    task = build_task(TaskConfig(name="counting", rows={"start": 100}, train_size=6, eval_size=2), seed=0)
    # generated rows: the prompts split by hash, so training and held-out words never meet
    train, held = [r["word"] for r in task.train_rows], [r["word"] for r in task.eval_rows]
    assert len(train) == 6 and len(held) == 2 and not set(train) & set(held)
    assert all(int(word) >= 100 for word in train + held)
    assert task.make_env().reset(task.eval_rows[0])[-1] == {"role": "user", "content": held[0]}
    with pytest.raises(ValueError, match=r"task 'counting' has no row option 'stop'; row options: \['start'\]"):
        TaskConfig(name="counting", rows={"stop": 3})
    # without a spec, rows come from a local file (here Parquet) through the data loader
    import pandas as pd

    pd.DataFrame({"word": [f"w{i}" for i in range(10)]}).to_parquet(tmp_path / "rows.parquet")
    echo = build_task(TaskConfig(name="echo", train=str(tmp_path / "rows.parquet"), eval_size=2), seed=0)
    assert [r["word"] for r in echo.eval_rows] == ["w0", "w1"] and len(echo.train_rows) == 8
    # ... and the installed command finds it too
    out = _trace_train("--print-config", "task.name=counting", "task.rows={start: 5}", cwd=tmp_path, pythonpath=[tmp_path])
    assert out.returncode == 0, out.stderr
    assert "name: counting" in out.stdout


def test_unknown_names_list_the_entry_points(tmp_path, monkeypatch):
    _install_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from trace_train.envs.spec import find_environment

    with pytest.raises(ValueError, match=r"unknown environment 'chess'; known: bfcl, counting, echo, "
                                         r"guess_number, key_lock, math_python, reasoning_gym, search_qa(, textarena)? \(or an import path package.module:attribute\)"):
        find_environment("chess")


def test_an_object_that_is_not_an_environment_is_refused(tmp_path, monkeypatch):
    (tmp_path / "notenv.py").write_text("class NotEnv:\n    def reset(self, row):\n        return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from trace_train.envs.registry import make_env_factory

    with pytest.raises(ValueError, match=r"environment 'notenv:NotEnv': the factory returned a NotEnv, which lacks"):
        make_env_factory("notenv:NotEnv")
    with pytest.raises(ValueError, match=r"environment 'notenv:NotEnv' has no option 'size'; options: none"):
        make_env_factory("notenv:NotEnv", {"size": 3})


def test_a_file_path_names_an_environment():
    from trace_train.envs.registry import make_env_factory

    factory = make_env_factory(f"{REPO}/examples/parity_game/parity_env.py:ParityEnv")
    env = factory()
    env.reset({"parity": "odd", "low": 1, "high": 3, "tries": 1})
    assert env.step("2").done and env.verify() == 0.0 and factory.binary_rewards
    assert factory.name.endswith("parity_env.py:ParityEnv")
