"""Run under torchrun (2 CPU processes): how many rollouts each rank generates per step, per policy.

Not a test module; ``test_distributed.py`` launches it. Three short runs share one warmed tiny model:
GRPO (uniform groups), TRACE with a fresh predictor (every prediction ties) and DAPO with a target the
budget cannot reach (so it spends the whole budget). A spy on ``RolloutEngine.rollout`` records this
rank's ``report.rollouts`` per step (the engine's own call runs). Writes ``<out>/rank<r>.json``:
``{"grpo": [...], "trace": [...], "dapo": [...]}``.
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

out, root = Path(sys.argv[1]), Path(sys.argv[2])
shares: dict[str, list[int]] = {}
current = {"name": None}
rollout = RolloutEngine.rollout


def spy(self, pool, **kwargs):
    batch = rollout(self, pool, **kwargs)
    if current["name"] is not None and self.config.policy == current["name"]:
        shares[current["name"]].append(int(batch.report.rollouts))
    return batch


RolloutEngine.rollout = spy
small = ["device=cpu", "tensorboard=false", "checkpoint_every=2", "eval.every=0", "rollout.pool_size=4",
         "rollout.roots=8", "rollout.group_size=4", "model.tiny_warm_steps=20", "quiet=true", "steps=2"]
model = "tiny"
for name, extra in (("grpo", []), ("trace", []), ("dapo", ["rollout.dapo_target=64"])):
    current["name"], shares[name] = name, []
    train(load_config(TrainConfig, "cpu_demo", [*small, f"run_dir={root / name}", f"rollout.policy={name}",
                                                f"model.name_or_path={model}", *extra]))
    model = str(root / "grpo" / "tiny_model")  # warmed once, by the first run
    dist.barrier()
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(shares))
leave_distributed()
