"""Run under torchrun (2 CPU processes): rank 0's loss turns NaN at the second update, rank 1's does not.

Not a test module; ``test_distributed.py`` launches it. Each rank writes ``<out>/rank<r>.json`` with the
error the trainer raised (or none), so the test sees that both ranks stopped together instead of one
waiting forever in FSDP's backward for the other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

import trace_train.train as train
import trace_train.update.loss as loss_module
from trace_train.config_loader import load_config
from trace_train.run.distributed import leave_distributed

out, run_dir = Path(sys.argv[1]), sys.argv[2]
updates = {"n": 0}
policy_update, policy_loss = train._policy_update, loss_module.policy_loss


def counting_update(*args, **kwargs):
    updates["n"] += 1
    return policy_update(*args, **kwargs)


def poisoned_loss(*args, **kwargs):
    loss, metrics = policy_loss(*args, **kwargs)
    if dist.get_rank() == 0 and updates["n"] == 2:
        loss = loss * float("nan")
    return loss, metrics


train._policy_update, loss_module.policy_loss = counting_update, poisoned_loss
cfg = load_config(train.TrainConfig, "cpu_demo", [
    f"run_dir={run_dir}", "steps=3", "checkpoint_every=1", "device=cpu", "tensorboard=false", "eval.every=0",
    "rollout.pool_size=4", "rollout.roots=8", "model.tiny_warm_steps=20", "quiet=true"])
error = None
try:
    train.main(cfg)
except train.NonFiniteLossError as err:
    error = str(err)
out.mkdir(parents=True, exist_ok=True)
rank = dist.get_rank() if dist.is_initialized() else int(__import__("os").environ["RANK"])
(out / f"rank{rank}.json").write_text(json.dumps({"error": error, "updates": updates["n"]}))
leave_distributed()
