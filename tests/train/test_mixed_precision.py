"""Mixed precision: fp32 master weights with bf16 compute, so a small learning rate is not rounded away.

Before this, ``model.dtype=bfloat16`` loaded the policy in bf16 and ran AdamW on those parameters: at
lr 1e-6 almost every update rounded away (1.3% of matrix entries and no norm weight moved in 4 steps of
``cpu_demo``), with a normal-looking loss.
"""

import pytest
import torch

from trace_train.run import distributed
from trace_train.run.checkpoint import load_latest_checkpoint
from trace_train.config_loader import load_config
from trace_train.train import TrainConfig, main


def _moved(run_dir, dtype):
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(run_dir / "tiny_model", dtype=torch.float32).state_dict()
    after = load_latest_checkpoint(run_dir).policy
    shares = {"matrices": [], "norms": []}
    for name, w in before.items():
        assert after[name].dtype == torch.float32, f"{name} was checkpointed as {after[name].dtype}"
        shares["norms" if w.dim() == 1 else "matrices"].append(float((after[name] != w).float().mean()))
    return {k: sum(v) / len(v) for k, v in shares.items()}


@pytest.mark.slow
def test_bf16_weights_move_like_fp32_ones_at_a_small_learning_rate(tmp_path):
    torch.set_num_threads(1)
    moved = {}
    for dtype in ("float32", "bfloat16"):
        run_dir = tmp_path / dtype
        cfg = load_config(TrainConfig, "cpu_demo", [
            f"run_dir={run_dir}", "steps=2", f"model.dtype={dtype}", "optim.lr=1e-6",  # the preset's warm-up: groups mix
            "eval.every=0", "tensorboard=false", "checkpoint_every=2", "rollout.pool_size=4", "rollout.roots=8",
            "rollout.group_size=4", "quiet=true"])
        metrics = main(cfg)
        assert torch.isfinite(torch.tensor(metrics["loss"]))
        moved[dtype] = _moved(run_dir, dtype)
    assert moved["float32"]["matrices"] > 0.9 and moved["float32"]["norms"] > 0.9
    # fp32 masters: the bf16 run's updates are as visible as the fp32 run's (bf16 parameters: ~1% and 0%)
    assert moved["bfloat16"]["matrices"] > 0.9, moved
    assert moved["bfloat16"]["norms"] > 0.9, moved


def test_gpu_process_groups_route_cpu_tensors_to_gloo_and_cuda_tensors_to_nccl():
    # an NCCL-only group refuses the CPU tensors of object collectives and scalars
    assert distributed._backend(use_cuda=True) == "cpu:gloo,cuda:nccl"
    assert distributed._backend(use_cuda=False) == "gloo"


def test_collective_scalars_live_on_the_ranks_device():
    info = distributed.DistInfo(rank=0, world_size=2, device="meta")
    assert distributed._scalar(3.0, torch.float64, info).device.type == "meta"
