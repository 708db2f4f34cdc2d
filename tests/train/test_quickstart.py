"""The README's quickstart runs as printed: its own-task command, parsed out of README.md (so this test fails
when the README drifts), run verbatim from a copy of the repository's examples, trains with held-out
success logged; and the defaults behind it (run directory from the task, evaluation on, held-out rows
taken only when evaluated, and said)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trace_train.config_loader import load_config
from trace_train.configs import TrainConfig
from trace_train.tasks import build_task

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- quickstart: own task -->"


def readme_own_task_command() -> list[str]:
    """The first command of the fenced block right after MARKER in README.md."""
    text = (REPO / "README.md").read_text()
    assert MARKER in text, f"README.md lost its {MARKER!r} marker"
    block = re.search(r"```(?:bash)?\n(.*?)```", text[text.index(MARKER):], re.S)
    assert block, "no fenced block after the quickstart marker"
    body = re.sub(r"\s*\\\n\s*", " ", block.group(1))  # continuation lines joined
    line = next(ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))
    return shlex.split(line, comments=True)


def test_readme_own_task_command_runs_verbatim_with_held_out_success(tmp_path):
    argv = readme_own_task_command()
    assert argv[0] == ".venv/bin/trace-train", argv
    command = Path(sys.executable).with_name("trace-train")  # the venv that runs the tests, as `.venv/bin`
    assert command.is_file(), f"trace-train is not installed next to {sys.executable}"
    shutil.copytree(REPO / "examples", tmp_path / "examples")  # a fresh clone's files; runs/ starts empty
    (tmp_path / "runs" / "cpu_demo").mkdir(parents=True)       # the demo ran first: must not be in the way
    (tmp_path / "runs" / "cpu_demo" / "config.yaml").write_text(
        (REPO / "trace_train" / "presets" / "cpu_demo.yaml").read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(command), *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    held = re.search(r"(\d+) training rows, (\d+) held out", done.stdout + done.stderr)
    repeats = re.search(r"(\d+) training rows whose prompt is held out", done.stdout + done.stderr)
    dropped = int(repeats.group(1)) if repeats else 0  # rows repeating a held-out prompt do not train
    assert held and int(held.group(1)) + int(held.group(2)) + dropped == 96 and int(held.group(2)) > 0, \
        done.stdout[-800:]
    runs = [p.parent for p in (tmp_path / "runs").glob("*/metrics.jsonl")]
    assert len(runs) == 1 and runs[0].name != "cpu_demo", runs
    rows = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    success = [r["eval_success"] for r in rows if "eval_success" in r]
    assert success and all(0.0 <= s <= 1.0 for s in success), rows[-1]


def test_run_dir_comes_from_the_task_unless_given():
    assert TrainConfig().run_dir == "runs/guess_number"
    cfg = load_config(TrainConfig, None, ["task.name=examples/parity_game/parity_env.py:ParityEnv",
                                          "task.train=examples/parity_game/rows.jsonl"])
    assert cfg.run_dir == "runs/ParityEnv"
    assert load_config(TrainConfig, "cpu_demo", []).run_dir == "runs/cpu_demo"
    assert load_config(TrainConfig, "cpu_demo", ["run_dir=elsewhere"]).run_dir == "elsewhere"


def test_held_out_evaluation_is_on_by_default():
    assert TrainConfig().eval.every > 0


@pytest.mark.parametrize("hold_out, eval_size, n_train, n_held", [(True, 64, 58, 24), (True, 16, 67, 16),
                                                                   (False, 64, 96, 0)])
def test_held_out_rows_are_taken_only_when_evaluated_and_never_most_of_the_data(hold_out, eval_size, n_train,
                                                                                 n_held, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_config(TrainConfig, None, ["task.name=examples/parity_game/parity_env.py:ParityEnv",
                                          "task.train=examples/parity_game/rows.jsonl",
                                          f"task.eval_size={eval_size}"]).task
    task = build_task(cfg, seed=0, hold_out=hold_out)
    assert (len(task.train_rows), len(task.eval_rows)) == (n_train, n_held)
    assert f"{n_train} training rows" in task.describe(cfg.name)
    # the example's rows repeat prompts: those of held-out rows are dropped from training, and said so
    assert n_train + n_held + task.dropped == 96 and (task.dropped > 0) == hold_out
