"""Run under torchrun (2 CPU processes): every tensor handed to a collective is on the rank's device.

Not a test module; ``test_distributed.py`` launches it. Every tensor collective of ``torch.distributed``
is seen by a dispatch mode (``c10d`` and ``_c10d_functional`` ops: what ``torch.distributed``, FSDP2,
DTensor and the object collectives reach), which records the devices of the tensors each was given and
refuses one off the rank's device before the back end sees it. Two parts:

1. the trainer's own collectives (``global_normaliser``, ``max_over_ranks``, ``merge_metrics``,
   ``gather_objects``, the global root allocator, the optimiser-state gather) called while torch's
   *default* device is ``meta``: a tensor made without an explicit device then lands off the rank's
   device, as a CPU tensor does on a GPU rank under NCCL;
2. a short mixed-precision training run (FSDP2 included) and its resume, under the same mode.

Also recorded: the dtypes of the weights the generator is given (``full_state_dict`` with the compute
dtype) and, per step, how many predictor examples this rank contributed (a spy on ``predictors.fitting.fit_inputs``).

Writes ``<out>/rank<r>.json``: {"helpers": [...], "training": [...], "generator_dtypes": [...],
"local_examples": [...], "roots_of_disagreeing_budgets": [...]}, one ``[name, devices]`` per collective, ``"off-device"`` where a tensor was
elsewhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

class CollectiveDevices(TorchDispatchMode):
    """Records every collective op (``c10d`` and ``_c10d_functional``, which FSDP2, DTensor and the object
    collectives all reach) with the devices of its tensors; refuses a tensor off ``expected``."""

    def __init__(self, expected: torch.device, log: list):
        super().__init__()
        self.expected, self.log = expected, log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional"):
            devices = sorted({str(t.device) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)})
            if any(torch.device(d) != self.expected for d in devices):
                self.log.append([str(func), devices, "off-device"])
                raise RuntimeError(f"{func} got tensors on {devices}, not on the rank's device {self.expected}")
            self.log.append([str(func), devices])
        return func(*args, **(kwargs or {}))


def helpers(info, expected: torch.device, log: list) -> None:
    """Each collective helper of ``trace_train.run.distributed`` with the default device moved off the rank's."""
    from trace_theory import get_policy
    from trace_train.run.distributed import (GlobalRootAllocator, checkpoint_state_dict, full_optimizer_state_dict,
                                         full_state_dict, gather_objects, global_normaliser, max_over_ranks,
                                         merge_metrics)

    model = torch.nn.Linear(3, 2)
    from trace_train.run.distributed import shard_policy

    shard_policy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    calls = {
        "global_normaliser": lambda: global_normaliser(1.5, info),
        "max_over_ranks": lambda: max_over_ranks(info.rank + 1, info),
        "merge_metrics": lambda: merge_metrics({"a": 1.0}, 1.0, info),
        "gather_objects": lambda: gather_objects(info.rank, info),
        "GlobalRootAllocator": lambda: GlobalRootAllocator(info)(get_policy("grpo"), np.full(2, 0.5), 4,
                                                                 rng=np.random.default_rng(0), concentration=None),
        "full_optimizer_state_dict": lambda: full_optimizer_state_dict(model, optimizer, info),
        "full_state_dict": lambda: full_state_dict(model, info, torch.bfloat16),
        "checkpoint_state_dict": lambda: checkpoint_state_dict(model, info),
    }
    for name, call in calls.items():
        log.append(["call", name])
        torch.set_default_device("meta")
        try:
            with CollectiveDevices(expected, log):
                call()
        except RuntimeError as err:
            log.append(["error", name, str(err).splitlines()[0]])
        finally:
            torch.set_default_device(None)
        dist.barrier()  # a refused call leaves the other rank waiting in it: realign before the next


def generator_weights(info) -> list:
    """The weights a generator gets from an FSDP2 model: their dtypes, and whether each equals the fp32
    master (gathered to rank 0 for a checkpoint) rounded once to bf16."""
    from trace_train.run.distributed import checkpoint_state_dict, full_state_dict, gather_objects, shard_policy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    shard_policy(model, compute_dtype=torch.bfloat16)
    sent = full_state_dict(model, info, torch.bfloat16)
    masters = gather_objects(checkpoint_state_dict(model, info), info)[0]  # rank 0's CPU copy, everywhere
    return [[name, str(t.dtype), str(masters[name].dtype), bool(torch.equal(t.cpu(), masters[name].to(t.dtype)))]
            for name, t in sent.items()]


def main(out: str, run_dir: str) -> None:
    import trace_train.predictors.fitting as fitting
    from trace_train.config_loader import load_config
    from trace_train.run.distributed import init_distributed, leave_distributed
    from trace_train.train import TrainConfig
    from trace_train.train import main as train

    info = init_distributed("cpu")
    expected = torch.device(info.device)
    log: dict[str, list] = {"helpers": [], "training": [], "local_examples": []}
    helpers(info, expected, log["helpers"])
    log["generator_dtypes"] = generator_weights(info)
    # ranks that estimate different budgets (each sizes M from its own tokens per rollout): one allocation
    from trace_theory import get_policy
    from trace_train.run.distributed import GlobalRootAllocator

    m = GlobalRootAllocator(info)(get_policy("trace"), np.array([0.5, 0.3, 0.9]), 8 + 4 * info.rank,
                                  rng=np.random.default_rng(info.rank), concentration=None)
    log["roots_of_disagreeing_budgets"] = m.tolist()
    fit_inputs = fitting.fit_inputs

    def spy(batch, value_target):  # observes what this rank contributes; the trainer's own function runs
        inputs = fit_inputs(batch, value_target)
        log["local_examples"].append(len(inputs[0]))
        return inputs

    fitting.fit_inputs = spy
    small = [f"run_dir={run_dir}", "device=cpu", "tensorboard=false", "checkpoint_every=2", "eval.every=0",
             "rollout.pool_size=4", "rollout.roots=8", "rollout.group_size=4", "model.tiny_warm_steps=20",
             "model.dtype=bfloat16", "quiet=true"]
    with CollectiveDevices(expected, log["training"]):
        train(load_config(TrainConfig, "cpu_demo", [*small, "steps=2"]))
        train(load_config(TrainConfig, "cpu_demo", [*small, "steps=3"]))  # resumes from step 2
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{info.rank}.json").write_text(json.dumps(log))
    leave_distributed()


if __name__ == "__main__":
    main(*sys.argv[1:])
