"""Run under torchrun (2 CPU processes): what the sharded reference's root holds after its forward.

Not a test module; ``test_reference_root.py`` launches it. A tiny Qwen3 is sharded as the trainer shards its
reference (``shard_policy``, compute dtype fp32) and the trainer's own ``policy_update`` runs one step with
it (``kl_coef`` > 0). Spies on the reference's forward record, after each forward and after the update,
the bytes of the parameters that are not sharded (plain tensors instead of DTensors: what FSDP2 left
gathered). Writes ``<out>/rank<r>.json``: {"root_bytes": the plan's row for this model, "after_forward":
[...] (bytes gathered right after each forward, before the trainer reshards), "after_update": bytes}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from trace_theory import compute_advantages
from trace_train.bench.memory_plan import parameter_sizes
from trace_train.bench.packing import long_prefix_batch
from trace_train.config_loader import load_config
from trace_train.configs import TrainConfig
from trace_train.run.distributed import init_distributed, leave_distributed, shard_policy
from trace_train.tiny import build_model, build_tokenizer
from trace_train.update.optimizer_step import policy_update
from trace_train.update.packing import training_batch_for

out = Path(sys.argv[1])
info = init_distributed("cpu")
tokenizer = build_tokenizer()
policy = build_model(tokenizer, layers=2, seed=0)
ref = build_model(tokenizer, layers=2, seed=0)
shard_policy(policy), shard_policy(ref)
ref.requires_grad_(False).eval()


def gathered(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if not isinstance(p, DTensor))


after_forward = []
ref.register_forward_hook(lambda module, args, output: after_forward.append(gathered(module)))
cfg = load_config(TrainConfig, "cpu_demo", ["algorithm.loss.kl_coef=0.05", "model.dtype=float32"])
batch = long_prefix_batch(128, 2, 16, vocab=policy.config.vocab_size, seed=info.rank)
seqs = training_batch_for(batch, compute_advantages(batch.forest, "grpo") + 0.25, cfg, pad_token_id=0)
policy_update(policy, torch.optim.AdamW(policy.parameters(), lr=1e-6), seqs, cfg, info, ref=ref)
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{info.rank}.json").write_text(json.dumps({
    "root_bytes": 4 * parameter_sizes(policy.config).root, "after_forward": after_forward,
    "after_update": gathered(ref)}))
leave_distributed()
