"""What trace-train prints: the step line with the update's numbers, the step-0 evaluation, plain lines when
not on a terminal, the libraries at warning level, and the collapse watch's two signals."""

from __future__ import annotations

import io
import math

import pytest

from trace_train.run import console
from trace_train.run.collapse import CollapseWatch


def test_the_step_line_has_loss_kl_grad_norm_and_lr():
    m = {"reward_mean": 0.41, "eval_success": 0.52, "loss": 0.0458, "kl": 0.0012, "grad_norm": 0.592,
         "effective_ratio": 0.63, "mixed_prompts_per_1k_rollouts": 312.5, "generated_tokens": 1234.0,
         "rollout_seconds": 3.0, "train_seconds": 1.1}
    line = console.metrics_line(3, 20, m, lr=1e-3)
    assert line == ("step 3/20  reward 0.410  eval 0.520  loss 0.0458  kl 0.0012  gnorm 0.592  lr 1e-03  eff 0.63  "
                    "mixed/1k 312.5  tokens 1234  4.1 s")
    assert "eval" not in console.metrics_line(4, 20, {k: v for k, v in m.items() if k != "eval_success"})


def test_the_step_zero_evaluation_has_a_line_only_when_there_is_one():
    assert console.eval_line(0, 20, {"eval_success": 0.3125}) == \
        "step 0/20  eval 0.312  (held-out success before training)"
    assert console.eval_line(0, 20, {}) is None


def test_no_progress_bar_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    steps = range(3)
    assert console.progress(steps, start=0, total=3) is steps


def test_libraries_log_warnings_only_unless_verbose_or_set(monkeypatch):
    for name in ("TRANSFORMERS_VERBOSITY", "VLLM_LOGGING_LEVEL", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    console.quiet_libraries()
    assert (console.os.environ["TRANSFORMERS_VERBOSITY"], console.os.environ["VLLM_LOGGING_LEVEL"]) == \
        ("warning", "WARNING")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY")
    console.quiet_libraries(verbose=True)
    assert (console.os.environ["TRANSFORMERS_VERBOSITY"], console.os.environ["VLLM_LOGGING_LEVEL"]) == \
        ("info", "DEBUG")  # the user's own setting wins


def _steps(tokens_per_rollout, rollouts=32):
    return [{"rollouts": float(rollouts), "generated_tokens": float(t * rollouts)} for t in tokens_per_rollout]


def test_growing_tokens_per_rollout_warn_once():
    watch = CollapseWatch(eval_rollouts=48)
    said = [w for i, m in enumerate(_steps([3.0, 2.6, 3.0, 3.3, 4.0, 8.9, 9.5, 12.7, 22.8, 60.5]), 1)
            for w in watch.check(i, m)]
    assert len(said) == 1 and said[0].startswith("step 8: 12.7 generated tokens per rollout, 4.2x the first steps' 3.0")
    assert "algorithm.loss.kl_coef" in said[0]


def test_steady_or_slightly_longer_turns_do_not_warn():
    watch = CollapseWatch(eval_rollouts=48)
    assert not [w for i, m in enumerate(_steps([3.0, 3.1, 2.9, 3.7, 5.0, 3.2, 8.9]), 1) for w in watch.check(i, m)]


def test_held_out_success_falling_below_its_start_by_two_standard_errors_warns():
    watch = CollapseWatch(eval_rollouts=48)
    history = [(0, 0.3125), (5, 0.354), (10, 0.458), (15, 0.4375)]
    assert not [w for s, p in history for w in watch.check(s, {"eval_success": p})]
    said = watch.check(20, {"eval_success": 0.25})
    p = (0.458 + 0.25) / 2
    assert 0.458 - 0.25 > 2 * math.sqrt(2 * p * (1 - p) / 48)
    assert len(said) == 1 and "fell below its start (0.312) and its best (0.458 at step 10)" in said[0]


@pytest.mark.parametrize("history", [
    [(0, 0.3125), (5, 0.354), (10, 0.458), (15, 0.4375), (20, 0.35)],   # below the best, above the start
    [(0, 0.3125), (5, 0.354), (10, 0.375), (15, 0.29)],                 # below the start, within the noise
])
def test_noise_and_a_fall_that_stays_above_the_start_do_not_warn(history):
    watch = CollapseWatch(eval_rollouts=48)
    assert not [w for s, p in history for w in watch.check(s, {"eval_success": p})]


def test_a_resumed_watch_keeps_its_baseline_and_does_not_repeat_a_warning():
    rows = [{"step": i, **m} for i, m in enumerate(_steps([3.0, 3.0, 3.0, 12.0]), 1)]
    watch = CollapseWatch(eval_rollouts=48).replay(rows)
    assert watch.check(5, _steps([30.0])[0]) == []
    fresh = CollapseWatch(eval_rollouts=48).replay(rows[:3])
    assert fresh.check(4, _steps([12.0])[0])


def test_a_progress_bar_with_the_time_left_shows_on_a_terminal_that_reports_no_size():
    """A pseudo-terminal nobody sized reports 0 x 0; tqdm draws nothing at 0 rows (issue 54)."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    code = "from trace_train.run.console import progress\nfor _ in progress(range(3), start=0, total=3): pass\n"
    try:
        done = subprocess.run([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, timeout=300)
    finally:
        os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's other end is closed and everything was read
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    text = out.decode(errors="replace")
    assert done.returncode == 0, text
    assert "train: 100%" in text and "3/3" in text and "ETA 00:00" in text, repr(text)


def test_without_a_bar_the_step_line_ends_with_the_time_left():
    clock = iter([100.0, 130.0, 190.0]).__next__
    eta = console.Eta(first=2, total=20, clock=clock)
    assert eta.text(2) is None  # no step finished yet
    assert eta.text(5) == "0:02:30"  # 30 s for 3 steps, 15 steps left
    assert eta.text(8) == "0:03:00"  # 90 s for 6 steps, 12 left
    m = {"reward_mean": 0.5, "rollout_seconds": 1.0}
    assert console.metrics_line(5, 20, m, eta="0:03:00").endswith("  ETA 0:03:00")
    assert "ETA" not in console.metrics_line(5, 20, m)


def test_stdout_is_line_buffered_when_it_is_a_pipe():
    import subprocess
    import sys

    code = ("import sys, time\nfrom trace_train.run.console import line_buffered\nline_buffered()\n"
            "print('first', flush=False)\nsys.stdin.readline()\nprint('second')\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "first\n"  # arrives while the process still waits for its input
        proc.stdin.write("go\n")
        proc.stdin.close()
        assert proc.stdout.read() == "second\n"
    finally:
        proc.wait(timeout=120)


def test_the_step_zero_evaluation_says_when_every_rollout_failed():
    assert console.eval_line(0, 20, {"eval_success": 0.0, "eval_rollouts": 48.0, "eval_env_failures": 0.0}) == \
        "step 0/20  eval 0.000  (held-out success before training; every one of its 48 rollouts failed)"
    assert console.eval_line(0, 20, {"eval_success": 0.0, "eval_rollouts": 48.0, "eval_env_failures": 48.0}) == (
        "step 0/20  eval 0.000  (held-out success before training; every one of its 48 rollouts failed, 48 of them "
        "in an environment failure)")
    assert console.eval_line(0, 20, {"eval_success": 0.0}) == "step 0/20  eval 0.000  (held-out success before training)"
