"""Held-out evaluation under torchrun is dealt out over the ranks and merged: each rank plays its share of
the prompts (before issue 51 every rank played all of them, W times the work), and the logged
``eval_success`` is the mean over every rank's rollouts."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from trace_train.run.metrics_log import read_metrics


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ranks_each_evaluate_half_of_the_prompts_and_the_mean_covers_both(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={_free_port()}",
           str(Path(__file__).with_name("eval_shares.py")), str(tmp_path / "log"), str(tmp_path / "run")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    calls = [json.loads((tmp_path / "log" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [len(c) for c in calls] == [2, 2]  # before the first step and after it
    logged = {r["step"]: r["eval_success"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
              if "eval_success" in r}
    for i, step in enumerate((0, 1)):
        mine, theirs = calls[0][i], calls[1][i]
        assert len(mine["prompts"]) == len(theirs["prompts"]) == 3  # 6 prompts over 2 ranks
        assert len(mine["rewards"]) == len(theirs["rewards"]) == 6  # 2 samples each
        rewards = mine["rewards"] + theirs["rewards"]
        assert logged[step] == sum(rewards) / len(rewards)
