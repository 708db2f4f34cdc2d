"""What only a GPU can confirm, in one script: ``python -m trace_train.gpu_check`` (about 5 min on one H200).

Needs torch and transformers on a CUDA machine; no vLLM, no network (every model is built from a config,
as the tests do). Writes one JSON (``--out``, default ``results/gpu_check.json``) with four sections:

* ``tree_packing``: FlexAttention tree packing against the dense 4-D mask and against per-leaf rows,
  forward (the update's loss, sum of weight x advantage x log pi over trained tokens) and backward (every
  parameter's gradient), in fp32 and bf16, on trees whose rows are 299 and 713 tokens wide (not multiples
  of FlexAttention's 128-token blocks). ``ok`` when the differences are within ``TOLERANCE[dtype]``.
* ``training_steps``: 4 steps of ``trace-train --config cpu_demo`` at the presets' learning rate 1e-6 on
  the transformers back end, in fp32 and with ``model.dtype=bfloat16``: the share of weight-matrix and
  norm entries that moved from the initial weights as loaded (bf16 weights updated in place round most
  such updates away, issue 23; fp32 master weights move them all).
* ``logprob_memory``: the peak CUDA memory of one update at Qwen3's 152k vocabulary (a tree of 8,192
  packed positions, 4,160 trained), the full log-softmax against chunks of 1,024 and 4,096
  (``trace_train.update.logprobs``), with the output-layer term of its formula.
* ``update_throughput``: tokens per second of one update, ``packing=tree`` against ``leaf``, on a
  synthetic tree (a long shared prefix and 8 continuations).

``--cpu-smoke`` runs the same code reduced to what a CPU can do in about a minute (fp32, FlexAttention
forward only: PyTorch has no FlexAttention backward on CPU; a 32k vocabulary; 2 training steps);
``tests/train/test_gpu_check.py`` runs it, so the script stays working. The exit status is 1 if a
comparison is outside its tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["main", "TOLERANCE"]

TOLERANCE = {"float32": {"loss": 1e-4, "grad": 1e-3}, "bfloat16": {"loss": 5e-2, "grad": 1e-1}}
"""Relative differences allowed between layouts and attention back ends (the same computation, reordered)."""

TREES = ({"prefix": 200, "k": 3, "generated": 33}, {"prefix": 513, "k": 2, "generated": 100})
"""Synthetic trees (``bench_packing.long_prefix_batch``): rows 299 and 713 tokens wide."""


def _update_terms(model, seqs, attention: str | None, backward: bool):
    """(loss, {name: grad}) of sum(weight x advantage x log pi) over trained tokens, divided by the weight."""
    import torch

    model.zero_grad(set_to_none=True)
    kwargs = {} if attention is None else {"attention": attention}
    with torch.set_grad_enabled(backward):
        logp = seqs.logprobs(model, **kwargs)
        dev = logp.device
        w = seqs.weights.to(dev) * seqs.loss_mask.to(dev)
        loss = (w * seqs.advantages.to(dev) * logp).sum() / w.sum()
    grads = {}
    if backward:
        loss.backward()
        grads = {k: p.grad.detach().float().clone() for k, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _grad_difference(g: dict, ref: dict) -> float:
    """max over parameters of |g - ref| / max|ref| (inf if the parameter sets differ)."""
    if g.keys() != ref.keys():
        return float("inf")
    return max(float((g[k] - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-12)) for k in ref)


def tree_packing(device: str, dtypes, flex_backward: bool) -> list[dict]:
    import torch

    from trace_theory import compute_advantages

    from .bench.packing import long_prefix_batch
    from .update.packing import build_training_batch
    from .tiny import build_model, build_tokenizer

    rows = []
    tokenizer = build_tokenizer()
    for dtype in dtypes:
        torch.manual_seed(0)
        model = build_model(tokenizer, max_positions=1024).to(device=device, dtype=getattr(torch, dtype))
        for tree in TREES:
            batch = long_prefix_batch(**tree, vocab=model.config.vocab_size)
            adv = compute_advantages(batch.forest, "grpo") + 0.25  # nonzero everywhere
            leaf = build_training_batch(batch, adv, packing="leaf", pad_token_id=0, micro_batch_size=64)
            packed = build_training_batch(batch, adv, packing="tree", pad_token_id=0, token_budget=16384)
            width = int(packed.input_ids.shape[1])
            ref_loss, ref_grad = _update_terms(model, leaf, None, True)
            dense_loss, dense_grad = _update_terms(model, packed, "dense", True)
            t0 = time.perf_counter()
            flex_loss, flex_grad = _update_terms(model, packed, "flex", flex_backward)
            flex_s = time.perf_counter() - t0
            tol = TOLERANCE[dtype]
            row = {"dtype": dtype, "width": width, "width_multiple_of_128": width % 128 == 0,
                   "trained_tokens": int((packed.loss_mask > 0).sum()),
                   "dense_vs_leaf": {"loss": _relative(dense_loss, ref_loss), "grad": _grad_difference(dense_grad, ref_grad)},
                   "flex_vs_dense": {"loss": _relative(flex_loss, dense_loss),
                                     "grad": _grad_difference(flex_grad, dense_grad) if flex_backward else None},
                   "flex_vs_leaf": {"loss": _relative(flex_loss, ref_loss),
                                    "grad": _grad_difference(flex_grad, ref_grad) if flex_backward else None},
                   "flex_backward": flex_backward, "flex_first_call_s": flex_s}
            row["ok"] = all(v <= tol[k] for pair in ("dense_vs_leaf", "flex_vs_dense", "flex_vs_leaf")
                            for k, v in row[pair].items() if v is not None)
            rows.append(row)
            print(f"tree packing {dtype} width {width}: {row}", flush=True)
    return rows


def training_steps(device: str, dtypes, steps: int) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    from .config_loader import load_config
    from .train import TrainConfig, main as train

    rows = []
    for dtype in dtypes:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_config(TrainConfig, "cpu_demo", [
                # the preset's warm-up (40 steps): a model warmed less mostly answers invalid guesses, and a
                # step whose every group fails has no gradient to move the weights with
                f"run_dir={tmp}/run", f"steps={steps}", f"device={device}", f"model.dtype={dtype}",
                "eval.every=0", "tensorboard=false", f"checkpoint_every={steps}",
                "rollout.pool_size=4", "rollout.roots=8", "rollout.group_size=4", "optim.lr=1e-6"])
            t0 = time.perf_counter()
            metrics = train(cfg)
            seconds = time.perf_counter() - t0
            # the initial fp32 master weights as the run loaded them, against the exported (fp32) masters
            before = AutoModelForCausalLM.from_pretrained(f"{tmp}/run/tiny_model", dtype=torch.float32).state_dict()
            after = AutoModelForCausalLM.from_pretrained(f"{tmp}/run/hf", dtype=torch.float32).state_dict()
        moved = {"matrices": [], "norms": []}
        for name, w in before.items():
            kind = "norms" if w.dim() == 1 else "matrices"
            moved[kind].append(float((after[name] != w.float()).float().mean()))
        row = {"dtype": dtype, "steps": steps, "seconds": seconds, "loss": metrics.get("loss"),
               "grad_norm": metrics.get("grad_norm"),
               "matrix_entries_moved": float(np.mean(moved["matrices"])),
               "norm_entries_moved": float(np.mean(moved["norms"]))}
        rows.append(row)
        print(f"training steps: {row}", flush=True)
    return rows


def logprob_memory(vocab: int, chunks, tree: dict) -> list[dict]:
    from .bench.packing import _measure_logprob_memory

    rows = [_measure_logprob_memory({"chunk": c, "threads": 1, **tree, "vocab": vocab}) for c in chunks]
    for row in rows:
        print(f"logprob memory: {row}", flush=True)
    return rows


def update_throughput(prefix: int, k: int, repeats: int) -> list[dict]:
    from .bench.packing import _measure

    rows = []
    for packing in ("leaf", "tree"):
        tree = {"prefix": prefix, "k": k, "generated": 128, "seed": 0}
        job = {"case": f"prefix-{prefix}-x{k}", "model": None, "tree": tree, "positions": prefix + 192,
               "overrides": ["algorithm.pack_tokens=16384"], "repeats": repeats, "threads": 1, "packing": packing}
        row = _measure(job)
        row["forward_tokens_per_s"] = row["forward_tokens"] / row["update_s"]
        row["unique_tokens_per_s"] = row["unique_tokens"] / row["update_s"]
        rows.append(row)
        print(f"update throughput {packing}: {row['unique_tokens_per_s']:.0f} unique tokens/s "
              f"({row['update_s']:.3f} s per update)", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="the reduced CPU form (what the test runs)")
    parser.add_argument("--out", default="results/gpu_check.json")
    args = parser.parse_args(argv)
    import torch

    if args.cpu_smoke:
        device, dtypes, flex_backward = "cpu", ("float32",), False
        vocab, chunks, steps, prefix, k, repeats = 32768, (0, 256), 2, 256, 2, 1
        memory_tree = {"prefix": 1024, "k": 2, "generated": 128}  # 1,280 positions, 320 trained
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    else:
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; run with --cpu-smoke on a CPU", file=sys.stderr)
            return 2
        device, dtypes, flex_backward = "cuda", ("float32", "bfloat16"), True
        vocab, chunks, steps, prefix, k, repeats = 151936, (0, 1024, 4096), 4, 4096, 8, 3
        memory_tree = {"prefix": 4096, "k": 8, "generated": 512}  # 8,192 positions, 4,160 trained
    started = time.perf_counter()
    out = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "cpu_smoke": args.cpu_smoke,
           "torch": torch.__version__}
    out["tree_packing"] = tree_packing(device, dtypes, flex_backward)
    out["training_steps"] = training_steps(device, dtypes, steps)
    out["logprob_memory"] = logprob_memory(vocab, chunks, memory_tree)
    out["update_throughput"] = update_throughput(prefix, k, repeats)
    out["ok"] = all(r["ok"] for r in out["tree_packing"])
    out["seconds"] = time.perf_counter() - started
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"gpu_check: {'ok' if out['ok'] else 'FAILED'} in {out['seconds']:.0f} s; results in {args.out}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
