"""A run directory holds one run, and a run tells its user what happened (issues 24 and 28)."""

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trace_train.run.metrics_log import read_metrics
from trace_train.train import cli

from .test_trainer import SMALL

REPO = Path(__file__).resolve().parents[2]

RAISING_ENV = '''
class Raising:
    """Guess-the-number rows; ``step`` (or ``verify``, or ``reset``) raises on every call."""

    def __init__(self, where="step"):
        self.where = where

    def reset(self, row):
        if self.where == "reset":
            raise OSError("the task's container image is missing")
        return [{"role": "user", "content": "Say a number."}]

    def step(self, action):
        if self.where == "step":
            raise RuntimeError("the tool server is down")
        from trace_train.envs.base import StepResult
        return StepResult("ok", done=True)

    def verify(self):
        raise ZeroDivisionError("reward function divided by zero")

    def snapshot(self):
        return None

    def restore(self, snapshot):
        pass
'''


def _args(run_dir, *extra):
    return ["--config", "cpu_demo", f"run_dir={run_dir}", *SMALL, *extra]


@pytest.mark.parametrize("where", ["step", "verify", "reset"])
def test_an_environment_that_always_raises_stops_the_run_in_one_line(tmp_path, capsys, where):
    env_file = tmp_path / "raising_env.py"
    env_file.write_text(RAISING_ENV)
    words = "".join('{"w": %d}\n' % i for i in range(16))
    (tmp_path / "rows.jsonl").write_text(words)
    run_dir = tmp_path / "run"
    code = cli(_args(run_dir, f"task.name={env_file}:Raising", f"task.train={tmp_path / 'rows.jsonl'}",
                     "task.rows={}", "task.eval_size=4", f"task.env={{where: {where}}}", "steps=3"))
    err = capsys.readouterr().err.strip().splitlines()
    expected = {"step": "RuntimeError: the tool server is down", "verify": "ZeroDivisionError: reward function",
                "reset": "OSError: the task's container image is missing"}[where]
    assert code == 1
    assert err[-1].startswith("trace-train: step 1: 16 of 16 rollouts (100%) ended in an environment failure")
    assert expected in err[-1] and "max_env_failure_share=0.5" in err[-1] and "stopped with a checkpoint of step 1" in err[-1]
    trace = run_dir / "env_errors" / "step_00000001.txt"
    assert f"traceback in {trace}" in err[-1] and "Traceback" in trace.read_text() and expected in trace.read_text()
    assert not any(line.startswith("Traceback") for line in err)
    assert (run_dir / "checkpoints" / "step_00000001").is_dir()
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1]


def test_a_second_run_into_a_directory_in_use_is_refused_naming_the_holder(tmp_path, capsys):
    from trace_train.run.files import RunLock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with RunLock(run_dir):
        code = cli(_args(run_dir))
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert "is in use by another run" in err and f"pid {os.getpid()}" in err
    assert not (run_dir / "config.yaml").exists()


def test_a_planted_config_naming_a_python_file_is_compared_as_data_never_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    marker = tmp_path / "pwned"
    (tmp_path / "planted.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nEnv = object\n")
    (run_dir / "config.yaml").write_text(f"task:\n  name: {tmp_path / 'planted.py'}:Env\n")
    code = cli(_args(run_dir))
    err = capsys.readouterr().err.strip()
    assert code == 1 and "holds another run" in err and "task.name" in err
    assert not marker.exists()


def test_a_resume_says_where_it_resumes_and_steps_print_a_metrics_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli(_args(run_dir, "steps=1")) == 0
    out = capsys.readouterr().out
    assert "step 1/1" in out and "reward" in out and "mixed/1k" in out and "tokens" in out
    assert cli(_args(run_dir, "steps=2", "--quiet")) == 0
    captured = capsys.readouterr()
    assert f"trace-train: resuming from step 1 of {run_dir}" in captured.err
    assert "step 2/2" not in captured.out  # quiet


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_run_in_one_line_with_a_checkpoint_and_the_resume_command(tmp_path, sig):
    run_dir = tmp_path / "run"
    args = _args(run_dir, "steps=50", "checkpoint_every=100", "--quiet")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trace_train.train", *args], env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err
    step = read_metrics(metrics)[-1]["step"]
    assert lines[-1].startswith("trace-train: stopped by ") and f"saved a checkpoint of step {step}" in lines[-1]
    resume = lines[-1].split("to resume: ", 1)[1]  # the environment the run needed first (issue 54), then the command
    assert resume.startswith(f"PYTHONPATH={REPO} ") and resume.endswith(
        " " + shlex.join([sys.executable, "-m", "trace_train.train", *args]))
    assert (run_dir / "checkpoints" / f"step_{step:08d}").is_dir()
    assert not (run_dir / "checkpoints" / ".step_").exists()


@pytest.mark.parametrize("typed, printed", [(".venv/bin/trace-train", [".venv/bin/trace-train"]),
                                            ("/opt/env/bin/trace-train", ["/opt/env/bin/trace-train"]),
                                            ("/x/trace_train/train.py", [sys.executable, "-m", "trace_train.train"])])
def test_the_resume_command_is_printed_the_way_it_was_invoked(monkeypatch, typed, printed):
    from trace_train.train import _invoked_as

    monkeypatch.setattr(sys, "argv", [typed, "--config", "cpu_demo"])
    assert _invoked_as() == printed


def test_a_full_disk_while_writing_the_config_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    import errno

    real = os.write

    def full(fd, data):  # the file system fills up while config.yaml (its temporary sibling) is written
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".config.yaml."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    code = cli(_args(tmp_path / "run"))
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert f"{tmp_path / 'run' / 'config.yaml'}: no space left on the device" in err and "free there" in err


STUCK_ENV = '''
import threading

HANG = threading.Event()


class Stuck:
    """Guess-the-number rows whose ``step`` never returns within the run (a tool without a timeout)."""

    def reset(self, row):
        return [{"role": "user", "content": "Say a number."}]

    def step(self, action):
        HANG.wait(20)
        from trace_train.envs.base import StepResult
        return StepResult("ok", done=True)

    def verify(self):
        return 0.0

    def snapshot(self):
        return None

    def restore(self, snapshot):
        pass
'''


def test_environment_calls_stuck_at_once_stop_the_run_with_a_checkpoint_and_one_line(tmp_path, capsys, monkeypatch):
    """Issue 52, item 3: the stuck-calls refusal is the documented stop (checkpoint, one line), not a traceback."""
    from trace_train.rollout import env_calls

    monkeypatch.setattr(env_calls, "MAX_ABANDONED", env_calls.abandoned_calls() + 2)
    env_file = tmp_path / "stuck_env.py"
    env_file.write_text(STUCK_ENV)
    (tmp_path / "rows.jsonl").write_text("".join('{"w": %d}\n' % i for i in range(16)))
    run_dir = tmp_path / "run"
    code = cli(_args(run_dir, f"task.name={env_file}:Stuck", f"task.train={tmp_path / 'rows.jsonl'}",
                     "task.rows={}", "task.eval_size=4", "steps=3", "rollout.env_timeout_s=0.3",
                     "rollout.env_workers=2"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, err[-5:]
    assert err[-1].startswith("trace-train: step 1: ") and "stuck past env_timeout_s at once" in err[-1], err[-1]
    assert "stopped with a checkpoint of step 0" in err[-1]
    assert not any(line.startswith("Traceback") for line in err)
    assert (run_dir / "checkpoints" / "step_00000000").is_dir()
