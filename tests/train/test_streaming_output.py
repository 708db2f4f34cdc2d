"""trace-train's output read the way ``nohup``, CI, ``| tee`` and ``> log 2>&1`` read it (issue 54): step lines
arrive as they are printed (stdout is a pipe, not a terminal), each ends with the time left, the closing
lines (stderr) come after the step lines they follow, and the printed resume command keeps the environment
the run needed (``PYTHONPATH``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = 40


@pytest.mark.timeout(900)
def test_step_lines_stream_through_a_pipe_in_order_with_the_closing_lines(tmp_path):
    command = Path(sys.executable).with_name("trace-train")
    assert command.is_file(), f"trace-train is not installed next to {sys.executable}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = [str(command), "task.name=examples/parity_game/parity_env.py:ParityEnv",
            "task.train=examples/parity_game/rows.jsonl", f"run_dir={tmp_path / 'run'}", f"steps={STEPS}",
            "eval.every=0", "rollout.limits.max_turn_tokens=16"]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:  # as they come: a block-buffered stdout shows nothing until the run ends
            lines.append(line.rstrip("\n"))
            if line.startswith(f"step 1/{STEPS} "):
                proc.send_signal(signal.SIGTERM)  # the run stops after the step under way
                break
        lines += proc.stdout.read().splitlines()
    finally:
        code = proc.wait(timeout=600)
    text = "\n".join(lines)
    assert code == 128 + signal.SIGTERM, text[-3000:]  # stopped early: step 1's line came while it ran
    steps = [i for i, ln in enumerate(lines) if re.match(rf"step \d+/{STEPS} ", ln)]
    assert steps and all(re.search(r"  ETA \d+:\d\d:\d\d$", lines[i]) for i in steps if not lines[i].startswith("step 0/")), text
    last = int(lines[steps[-1]].split("/")[0].split()[1])
    assert 1 <= last < STEPS, text
    closing = [i for i, ln in enumerate(lines) if ln.startswith("trace-train: stopped by SIGTERM")]
    assert len(closing) == 1 and closing[0] > steps[-1], text  # stderr's closing line after the step lines
    assert f"saved a checkpoint of step {last}" in lines[closing[0]], lines[closing[0]]
    resume = lines[closing[0]].split("to resume: ", 1)[1]
    assert resume.startswith(f"PYTHONPATH={REPO} ") and resume.endswith(" ".join(args[1:])), resume
