"""Run under torchrun (2 CPU processes): a resuming rank reads only its own shards' rows of a checkpoint.

Not a test module; ``test_distributed.py`` launches it. A tiny Qwen3 (vocabulary 67, so the embedding's
shards are uneven: 34 and 33 rows) is sharded with FSDP2 and takes one AdamW step; rank 0 writes a real
checkpoint (``save_checkpoint`` of the gathered weights and optimiser state). Every rank then loads it
(memory-mapped) into a fresh model twice:

1. with every row outside this rank's shards replaced by NaN: ``load_full_weights`` and
   ``load_full_optimizer_state_dict`` must give exactly the trained shards, so they read no other row;
2. through torch's own full-state-dict loading (``set_model_state_dict`` / ``set_optimizer_state_dict``
   with ``full_state_dict=True``), the reference: the two must agree bit for bit.

Writes ``<out>/rank<r>.json``: {"poisoned_equal": bool, "reference_equal": bool, "finite": bool,
"moments_are_dtensors": bool, "local_rows": [...], "next_step_equal": bool}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


def build():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trace_train.run.distributed import shard_policy

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=67, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                         tie_word_embeddings=False))
    shard_policy(model)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def train_step(model, optimizer) -> None:
    model(input_ids=torch.arange(11).view(1, 11) % 67).logits.square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def poisoned(full: torch.Tensor, like) -> torch.Tensor:
    """``full`` with NaN everywhere but the rows ``like`` (a DTensor) holds on this rank."""
    shape, offset = compute_local_shape_and_global_offset(like.shape, like.device_mesh, like.placements)
    out = torch.full_like(full, float("nan"))
    index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
    out[index] = full[index]
    return out


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def states(model, optimizer) -> list[torch.Tensor]:
    out = [local(p).detach().clone() for p in model.parameters()]
    for p in model.parameters():
        out += [local(v).clone() for _, v in sorted(optimizer.state[p].items())]
    return out


def main(out: Path, run_dir: Path) -> None:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    from trace_train.run.checkpoint import load_checkpoint, save_checkpoint
    from trace_train.run.distributed import (checkpoint_state_dict, full_optimizer_state_dict, init_distributed,
                                             leave_distributed, load_full_optimizer_state_dict, load_full_weights)

    info = init_distributed("cpu")
    model, optimizer = build()
    train_step(model, optimizer)
    weights, moments = checkpoint_state_dict(model, info), full_optimizer_state_dict(model, optimizer, info)
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_checkpoint(run_dir, 1, policy=weights, optimizer=moments)
    dist.barrier()
    ckpt = load_checkpoint(run_dir / "checkpoints" / "step_00000001", restore_random_state=False)
    trained = states(model, optimizer)

    ours, ours_opt = build()
    params = dict(ours.named_parameters())
    bad_weights = {k: poisoned(v, params[k]) if k in params else v for k, v in ckpt.policy.items()}
    bad_moments = {"param_groups": ckpt.optimizer["param_groups"],
                   "state": {k: {n: v if v.dim() == 0 else poisoned(v, params[k]) for n, v in s.items()}
                             for k, s in ckpt.optimizer["state"].items()}}
    load_full_weights(ours, bad_weights, info)
    load_full_optimizer_state_dict(ours, ours_opt, bad_moments, info)

    ref, ref_opt = build()
    set_model_state_dict(ref, ckpt.policy, options=StateDictOptions(full_state_dict=True))
    set_optimizer_state_dict(ref, ref_opt, optim_state_dict=ckpt.optimizer, options=StateDictOptions(full_state_dict=True))

    loaded, reference = states(ours, ours_opt), states(ref, ref_opt)
    train_step(ours, ours_opt), train_step(ref, ref_opt), train_step(model, optimizer)
    result = {
        "poisoned_equal": len(loaded) == len(trained) and all(torch.equal(a, b) for a, b in zip(loaded, trained)),
        "reference_equal": all(torch.equal(a, b) for a, b in zip(loaded, reference)),
        "finite": all(bool(torch.isfinite(t).all()) for t in loaded),
        "moments_are_dtensors": all(isinstance(v, DTensor) for p in ours.parameters()
                                    for k, v in ours_opt.state[p].items() if k != "step"),
        "local_rows": [int(local(p).shape[0]) for p in ours.parameters()][:1],
        "next_step_equal": all(torch.equal(a, b) for a, b in zip(states(ours, ours_opt), states(model, optimizer))),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{info.rank}.json").write_text(json.dumps(result))
    leave_distributed()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
