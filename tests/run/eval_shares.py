"""Run under torchrun (2 CPU processes): which held-out prompts each rank plays, and what it scored.

Not a test module; ``test_eval_shares.py`` launches it. One short run with held-out evaluation before and
after its step; a spy on ``RolloutEngine.rollout`` records the calls of the held-out engine (those seeded
10_000_019 + step): the prompts given and the leaves' rewards. Writes ``<out>/rank<r>.json``:
``[{"prompts": [...], "rewards": [...]}, ...]``, one entry per evaluation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from trace_train.config_loader import load_config
from trace_train.rollout.engine import RolloutEngine
from trace_train.run.distributed import leave_distributed
from trace_train.train import TrainConfig, main as train

out, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
calls: list[dict] = []
rollout = RolloutEngine.rollout


def spy(self, pool, **kwargs):
    batch = rollout(self, pool, **kwargs)
    if kwargs.get("seed", 0) >= 10_000_019 and kwargs["seed"] < 10_000_019 + 100:
        f = batch.forest
        calls.append({"prompts": [row["target"] for row in pool], "rewards": f.reward[f.leaves].tolist()})
    return batch


RolloutEngine.rollout = spy
train(load_config(TrainConfig, "cpu_demo", [
    f"run_dir={run_dir}", "steps=1", "device=cpu", "tensorboard=false", "checkpoint_every=1", "eval.every=1",
    "eval.prompts=6", "eval.samples=2", "rollout.pool_size=4", "rollout.roots=8", "rollout.group_size=4",
    "model.tiny_warm_steps=20", "quiet=true"]))
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(calls))
leave_distributed()
