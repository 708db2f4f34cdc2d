"""The two-rank part of the GPU check: ``torchrun --nproc_per_node 2 -m trace_train.bench.gpu_check_ranks OUT DEVICE``.

Run by ``trace_train.bench.gpu_check`` (section ``two_gpus``) with DEVICE "cuda" (NCCL, one GPU per rank) or
"cpu" (gloo, what ``--cpu-smoke`` runs). Each rank writes ``OUT/rank<r>.json`` with its checks and ``ok``:

* ``all_reduce``: a tensor of rank + 1 on the rank's device, summed over the ranks (3 everywhere);
* ``fsdp_step``: a small Qwen3 sharded with the trainer's ``shard_policy`` (fp32) takes one step of the
  trainer's own ``policy_update`` (SGD) on each rank's own packed tree batch, against the update the
  unsharded model's ``policy_update`` gradients give for both batches, weighted by their token counts
  (the global token mean): the gathered weights (``full_state_dict``) must equal it, and move;
* ``engines`` (CUDA with vLLM only): each rank builds its vLLM engine as the trainer does
  (``VLLMBackend(device=cuda:LOCAL_RANK)``, external launcher): the current device is still the rank's after
  it, the engine's memory went to the rank's own GPU and not to the other, it generates, and it takes a
  streamed weight sync from the sharded model (``iter_full_tensors``) and generates again.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path


def all_reduce(info) -> dict:
    import torch
    import torch.distributed as dist

    t = torch.full((1024,), float(info.rank + 1), device=info.device)
    dist.all_reduce(t)
    want = info.world_size * (info.world_size + 1) / 2
    return {"backend": str(dist.get_backend()), "device": str(t.device), "ok": bool((t == want).all())}


def _rank_batches(model, world: int, cfg) -> list:
    """Each rank's packed update batch (every rank builds all of them): a synthetic tree of its own seed
    (``bench.packing.long_prefix_batch``), GRPO's advantages plus 0.25 (nonzero everywhere), laid out by
    the trainer's ``training_batch_for``."""
    from trace_theory import compute_advantages

    from ..update.packing import training_batch_for
    from .packing import long_prefix_batch

    out = []
    for rank in range(world):
        batch = long_prefix_batch(128, 2, 16, vocab=model.config.vocab_size, seed=rank)
        advantages = compute_advantages(batch.forest, "grpo") + 0.25
        out.append(training_batch_for(batch, advantages, cfg, pad_token_id=0))
    return out


def fsdp_step(info) -> tuple[dict, object, object]:
    """The trainer's own ``policy_update`` (SGD, lr 100, no clipping) on the sharded policy, each rank on its
    own batch, against the update the unsharded policy's gradients give: the per-batch gradients g_r of
    ``policy_update`` on one process, weighted by each batch's token count n_r (FSDP's global token mean)."""
    import torch

    from ..config_loader import load_config
    from ..configs import TrainConfig
    from ..run.distributed import DistInfo, full_state_dict, shard_policy
    from ..tiny import build_model, build_tokenizer
    from ..update.optimizer_step import policy_update

    cfg = load_config(TrainConfig, "cpu_demo", ["optim.grad_clip=0", "algorithm.loss.kl_coef=0",
                                                "model.dtype=float32", "optim.micro_batch_size=1"])
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, layers=2, seed=0).to(info.device)
    plain = copy.deepcopy(model)
    start = {k: v.detach().clone() for k, v in plain.named_parameters()}
    batches = _rank_batches(model, info.world_size, cfg)
    shard_policy(model, compute_dtype=torch.float32)
    lr = 100.0  # the clipped loss of synthetic records has small gradients: a step that shows
    stats = policy_update(model, torch.optim.SGD(model.parameters(), lr=lr), batches[info.rank], cfg, info)
    frozen = torch.optim.SGD(plain.parameters(), lr=0.0)  # the gradients only
    weighted = {k: torch.zeros_like(v) for k, v in start.items()}
    total = sum(seqs.normaliser(True) for seqs in batches)
    for seqs in batches:
        policy_update(plain, frozen, seqs, cfg, DistInfo(device=info.device))
        for k, p in plain.named_parameters():
            if p.grad is not None:
                weighted[k] += p.grad.detach() * seqs.normaliser(True) / total
    want = {k: start[k] - lr * weighted[k] for k in start}
    gathered = full_state_dict(model, info, torch.float32)
    difference = max(float((gathered[k].float().cpu() - want[k].float().cpu()).abs().max()) for k in want)
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    row = {"runs": "policy_update", "loss": stats["loss"], "max_difference_from_unsharded": difference,
           "max_change": moved, "ok": bool(moved > 1e-4 and difference <= 1e-5 + 1e-4 * moved)}
    return row, model, tokenizer


def engines(info, model, tokenizer) -> dict:
    import torch
    import torch.distributed as dist

    from ..backends.base import GenerationRequest, Sampling
    from ..backends.vllm_backend import VLLMBackend
    from ..run.distributed import iter_full_tensors

    paths = [None]
    if info.is_main:
        from ..tiny import save_tiny

        paths = [save_tiny(Path(tempfile.mkdtemp()) / "tiny", seed=0)]
    dist.broadcast_object_list(paths, src=0)
    dist.barrier()
    count = torch.cuda.device_count()
    before = [torch.cuda.memory_reserved(i) for i in range(count)]
    backend = VLLMBackend(paths[0], dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
                          gpu_memory_utilization=0.15, device=info.device)
    after = [torch.cuda.memory_reserved(i) for i in range(count)]
    current = torch.cuda.current_device()
    prompt = tokenizer.encode("Guess a number between 1 and 6")
    sampling = Sampling(temperature=1.0, max_new_tokens=8)
    [[first]] = backend.generate([GenerationRequest(prompt, seed=3)], sampling)
    backend.update_weights(iter_full_tensors(model, info, torch.float32))  # a collective stream
    [[second]] = backend.generate([GenerationRequest(prompt, seed=3)], sampling)
    own = after[info.local_rank] - before[info.local_rank]
    others = [after[i] - before[i] for i in range(count) if i != info.local_rank]
    row = {"current_device": current, "own_gpu_reserved_mb": own / 2**20,
           "other_gpus_reserved_mb": [x / 2**20 for x in others], "generated": [len(first.token_ids),
                                                                                len(second.token_ids)]}
    row["ok"] = bool(current == info.local_rank and own > 64 * 2**20 and all(x == 0 for x in others)
                     and first.token_ids and second.token_ids)
    return row


def main(out: str, device: str) -> None:
    from ..run.distributed import init_distributed, leave_distributed
    from .gpu_check import importable

    info = init_distributed(device)
    result: dict = {"rank": info.rank, "device": info.device}
    checks = ["all_reduce", "fsdp_step"]
    for name in checks[:1]:
        try:
            result[name] = all_reduce(info)
        except Exception as err:
            result[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    try:
        result["fsdp_step"], model, tokenizer = fsdp_step(info)
    except Exception as err:
        result["fsdp_step"], model = {"ok": False, "error": f"{type(err).__name__}: {err}"}, None
    if device.startswith("cuda") and importable("vllm") and model is not None:
        checks.append("engines")
        try:
            result["engines"] = engines(info, model, tokenizer)
        except Exception as err:
            result["engines"] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    else:
        result["engines_skipped"] = "needs CUDA and vLLM"
    result["ok"] = all(result[name].get("ok") for name in checks)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{info.rank}.json").write_text(json.dumps(result, default=float))
    leave_distributed()


if __name__ == "__main__":
    main(*sys.argv[1:])
