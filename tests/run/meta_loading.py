"""Run under torchrun (2 CPU processes): the sharded policy is loaded without a full copy on rank 1.

Not a test module; ``test_distributed.py`` launches it. Rank 0 saves a tiny Qwen3 (vocabulary 67, so the
embedding's shards are uneven). Every rank then loads it twice: with ``load_sharded_policy`` (meta-device
structure, rank 0 broadcasts) while ``from_pretrained`` is watched, and the reference way (every rank
``from_pretrained`` on the CPU, then ``shard_policy``). Writes ``<out>/rank<r>.json``:
{"from_pretrained_calls": int, "meta_left": int, "shards_equal": bool, "buffers_equal": bool,
"logits_equal": bool, "dtype": str}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def main(out: Path, model_dir: Path) -> None:
    import transformers
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from trace_train.run.distributed import init_distributed, leave_distributed, shard_policy
    from trace_train.run.policy import load_sharded_policy
    from trace_train.tiny import build_tokenizer

    info = init_distributed("cpu")
    if info.is_main:
        torch.manual_seed(0)
        Qwen3ForCausalLM(Qwen3Config(vocab_size=67, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=8, rope_theta=1234.0,
                                     tie_word_embeddings=True)).save_pretrained(model_dir)
        build_tokenizer().save_pretrained(model_dir)
    dist.barrier()

    calls = []
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def watched(cls, *args, **kwargs):
        calls.append(info.rank)
        return original(cls, *args, **kwargs)

    transformers.AutoModelForCausalLM.from_pretrained = classmethod(watched)
    ours, _ = load_sharded_policy(str(model_dir), torch.float32, info, compute_dtype=torch.float32)
    transformers.AutoModelForCausalLM.from_pretrained = classmethod(original)

    reference = shard_policy(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)).eval()
    ids = torch.arange(13).view(1, 13) % 67
    with torch.no_grad():
        same_logits = torch.equal(ours(input_ids=ids).logits, reference(input_ids=ids).logits)
    result = {
        "from_pretrained_calls": len(calls),
        "meta_left": sum(t.is_meta for t in [*ours.parameters(), *ours.buffers()]),
        "shards_equal": all(torch.equal(local(a), local(b)) for a, b in zip(ours.parameters(), reference.parameters())),
        "buffers_equal": all(torch.equal(a, b) for a, b in zip(ours.buffers(), reference.buffers())),
        "logits_equal": same_logits,
        "dtype": str(next(ours.parameters()).dtype),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{info.rank}.json").write_text(json.dumps(result))
    leave_distributed()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
