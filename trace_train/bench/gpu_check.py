"""What only a GPU can confirm, in one script: ``python -m trace_train.bench.gpu_check`` (about 5 min on one
H200).

Needs torch and transformers on a CUDA machine, nothing else of the project's optional dependencies (no vLLM,
math-verify, bm25s or datasets: every model is built from a config, as the tests do) and no network. Writes one
JSON (``--out``, default ``results/gpu_check.json``) with a section per check, each with its own ``ok``; the
verdict (``ok``, exit status 0) needs every section that ran to pass, and names the sections skipped; the file is
rewritten after every section (``finished`` false until the last), so a run cut off keeps what it measured:

* ``tree_packing``: FlexAttention tree packing against the dense 4-D mask and against per-leaf rows,
  forward (the update's loss, sum of weight x advantage x log pi over trained tokens) and backward (every
  parameter's gradient), in fp32 and bf16, on trees whose rows are 299 and 713 tokens wide (not multiples
  of FlexAttention's 128-token blocks). ok: the differences are within ``TOLERANCE[dtype]``.
* ``training_steps``: 4 steps of ``trace-train --config cpu_demo`` at the presets' learning rate 1e-6 on
  the transformers back end, in fp32 and with ``model.dtype=bfloat16``: the share of weight-matrix and
  norm entries of the policy, as the trainer holds it after its last update, that differ from its initial
  weights as it held them (in its master dtype; spied on, :mod:`.trainer_step`). ok: a finite loss, every
  master weight float32 and held as the model's files store it, and more than half of both kinds moved
  (fp32 master weights move them all; bf16 ones would round most away, issue 23).
  ``--control no-optimizer-step`` runs it with AdamW's step disabled: the check must then FAIL (a check
  that passes a trainer which never updates proves nothing).
* ``trainer_step`` (:mod:`.trainer_step`): one step of the trainer's own ``main`` on the CPU demo, in fp32
  and in bf16, judged from outside it: alignment (the loss's old log-probabilities equal the generator's
  at the same positions), direction (the step raises the log-probability of positive-advantage tokens and
  lowers that of negative ones) and real movement (fp32 masters, compared with the initial fp32 weights).
  ``tests/bench/test_broken_trainers.py`` keeps a set of broken trainers that each must fail it.
* ``logprob_memory``: the peak memory of one update at Qwen3's 152k vocabulary, the full log-softmax
  against chunks (``trace_train.update.logprobs``). ok: every chunked peak below half the full one.
* ``update_throughput``: one update, ``packing=tree`` against ``leaf``, on a synthetic tree (a long shared
  prefix and 8 continuations): tokens per second (reported, not judged). ok: finite losses and gradient
  norms, the tree forwarding each unique token once and fewer tokens than the leaf layout.
* ``activation_checkpointing``: one backward of a small Qwen3 with and without
  ``model.activation_checkpointing``. ok: the same loss and gradients (and, on CUDA, a lower peak).
* ``vllm`` (only where vLLM imports): a vLLM engine on a tiny model generates, its log-probabilities are
  compared with a transformers forward pass, the weights of another model are streamed in
  (``update_weights`` of ``run.distributed.iter_full_tensors``) and the next generation must match that
  model's forward. ok: both within 1e-3 (fp32; 5e-3 on CUDA), and the second differs from the first model's.
* ``two_gpus`` (only where 2 CUDA devices are visible; ``--cpu-smoke`` runs it on 2 gloo CPU ranks):
  2 ranks under torchrun (:mod:`trace_train.bench.gpu_check_ranks`): an all-reduce (NCCL), one step of
  the trainer's own ``policy_update`` on a small Qwen3 sharded by FSDP2 against the same update unsharded, and one vLLM engine per GPU (where vLLM imports): each
  built for its own device, generating, and taking a streamed weight sync.

``--cpu-smoke`` runs the same code reduced to what a CPU can do (fp32, FlexAttention forward only: PyTorch has
no FlexAttention backward on CPU; a 32k vocabulary; 2 training steps); ``tests/bench/test_gpu_check.py`` runs
it, so the script stays working. ``--sections`` runs some sections only. The exit status is 1 if a section
failed, 2 without CUDA (and without ``--cpu-smoke``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from trace_train.child_python import isolated_environment, module_command
from . import origin

__all__ = ["main", "TOLERANCE", "SECTIONS", "tree_packing", "training_steps", "trainer_steps", "logprob_memory",
           "update_throughput",
           "activation_checkpointing", "vllm_generate_and_sync", "two_ranks", "verdict"]

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

    from .packing import long_prefix_batch
    from ..update.packing import build_training_batch
    from ..tiny import build_model, build_tokenizer

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



@contextlib.contextmanager
def _optimizer_step_disabled(disabled: bool):
    """``--control no-optimizer-step``: AdamW's step does nothing (the trainer then never updates)."""
    import torch

    if not disabled:
        yield
        return
    step = torch.optim.AdamW.step
    torch.optim.AdamW.step = lambda self, closure=None: None
    try:
        yield
    finally:
        torch.optim.AdamW.step = step


def training_steps(device: str, dtypes, steps: int, *, no_optimizer_step: bool = False) -> list[dict]:
    from ..config_loader import load_config
    from ..train import TrainConfig, main as train
    from .trainer_step import _movement, _spies

    rows = []
    for dtype in dtypes:
        record: dict = {}
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_config(TrainConfig, "cpu_demo", [
                # the preset's warm-up (40 steps): a model warmed less mostly answers invalid guesses, and a
                # step whose every group fails has no gradient to move the weights with
                f"run_dir={tmp}/run", f"steps={steps}", f"device={device}", f"model.dtype={dtype}",
                "eval.every=0", "tensorboard=false", f"checkpoint_every={steps}", "quiet=true",
                "rollout.pool_size=4", "rollout.roots=8", "rollout.group_size=4", "optim.lr=1e-6",
                "max_length_cut_share=1"])
            t0 = time.perf_counter()
            with _optimizer_step_disabled(no_optimizer_step), _spies(record, last=True):
                metrics = train(cfg)
            seconds = time.perf_counter() - t0
            stored = _stored_weights(f"{tmp}/run/tiny_model")
        # the initial weights as the trainer held them (its master dtype) against its weights after the last
        # update: an export's upcast of bf16 masters, compared with the fp32 files, would read as movement
        moved = _movement(record["before"], record["after"], stored)
        row = {"dtype": dtype, "steps": steps, "seconds": seconds, "loss": metrics.get("loss"),
               "grad_norm": metrics.get("grad_norm"), "optimizer_step_disabled": no_optimizer_step, **moved}
        row["ok"] = bool(math.isfinite(row["loss"] if row["loss"] is not None else float("nan"))
                         and row["master_dtypes"] == ["float32"] and row["initial_weights_as_stored"]
                         and row["matrix_entries_moved"] > 0.5 and row["norm_entries_moved"] > 0.5)
        rows.append(row)
        print(f"training steps: {row}", flush=True)
    return rows


def _stored_weights(path: str) -> dict:
    """The parameters of the model at ``path`` as its files store them (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {k: v.detach() for k, v in model.named_parameters()}


def trainer_steps(device: str, dtypes) -> list[dict]:
    """:func:`.trainer_step.trainer_step` in each compute dtype: direction, alignment and real movement."""
    from .trainer_step import trainer_step

    return [trainer_step(device, dtype) for dtype in dtypes]


def logprob_memory(vocab: int, chunks, tree: dict) -> list[dict]:
    from .packing import measure_logprob_memory

    rows = [measure_logprob_memory({"chunk": c, "threads": 1, **tree, "vocab": vocab}) for c in chunks]
    full = [r["peak_mb"] for r in rows if r["chunk_tokens"] == 0]
    for row in rows:
        row["ok"] = bool(row["chunk_tokens"] == 0 or not full or row["peak_mb"] < full[0] / 2)
        print(f"logprob memory: {row}", flush=True)
    return rows


def update_throughput(prefix: int, k: int, repeats: int) -> list[dict]:
    from .packing import measure_update

    rows = []
    for packing in ("leaf", "tree"):
        tree = {"prefix": prefix, "k": k, "generated": 128, "seed": 0}
        job = {"case": f"prefix-{prefix}-x{k}", "model": None, "tree": tree, "positions": prefix + 192,
               "overrides": ["algorithm.pack_tokens=16384"], "repeats": repeats, "threads": 1, "packing": packing}
        row = measure_update(job)
        row["forward_tokens_per_s"] = row["forward_tokens"] / row["update_s"]
        row["unique_tokens_per_s"] = row["unique_tokens"] / row["update_s"]
        rows.append(row)
        print(f"update throughput {packing}: {row['unique_tokens_per_s']:.0f} unique tokens/s "
              f"({row['update_s']:.3f} s per update)", flush=True)
    leaf, tree = rows
    finite = all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    ok = finite and tree["forward_tokens"] == tree["unique_tokens"] < leaf["forward_tokens"]
    for row in rows:
        row["ok"] = bool(ok)
    return rows


def activation_checkpointing(device: str, tokens: int) -> list[dict]:
    """One forward and backward of a small Qwen3 (4 layers) on ``tokens`` tokens, with and without the
    trainer's activation checkpointing: loss, gradients and (on CUDA) the peak memory of the backward pass."""
    import torch

    from ..tiny import build_model, build_tokenizer
    from ..run.policy import checkpoint_activations

    tokenizer = build_tokenizer()
    ids = torch.randint(2, 200, (1, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    out = {}
    for checkpointed in (False, True):
        model = build_model(tokenizer, hidden_size=256, layers=4, heads=4, kv_heads=2, head_dim=64,
                            intermediate_size=1024, max_positions=tokens + 8, seed=1).to(device)
        if checkpointed:
            checkpoint_activations(model)
        model.train()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        loss = -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device == "cuda" else None
        out[checkpointed] = (float(loss.detach()), {k: p.grad.detach().clone() for k, p in model.named_parameters()},
                             peak)
    (loss0, g0, peak0), (loss1, g1, peak1) = out[False], out[True]
    grad = max(float((g1[k] - g0[k]).abs().max() / g0[k].abs().max().clamp_min(1e-12)) for k in g0)
    row = {"tokens": tokens, "loss_difference": abs(loss1 - loss0), "grad_difference": grad,
           "peak_mb_plain": peak0, "peak_mb_checkpointed": peak1}
    row["ok"] = bool(row["loss_difference"] <= 1e-6 and grad <= 1e-4 and (peak0 is None or peak1 < peak0))
    print(f"activation checkpointing: {row}", flush=True)
    return [row]


def vllm_generate_and_sync(device: str) -> list[dict]:
    """vLLM on a tiny model: generation against a transformers forward, then a streamed weight sync from
    another model and generation against that model's forward (fp32 both)."""
    import torch

    from ..backends.base import GenerationRequest, Sampling
    from ..backends.vllm_backend import VLLMBackend
    from ..run.distributed import DistInfo, iter_full_tensors
    from ..tiny import build_model, save_tiny

    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny(Path(tmp) / "tiny", seed=0)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        first = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        second = build_model(tokenizer, seed=1).eval()
        if device == "cuda":
            torch.cuda.empty_cache()  # what earlier sections left cached: vLLM checks the free memory
        options = {"gpu_memory_utilization": 0.2} if device == "cuda" else {"kv_cache_memory_bytes": 256 * 2**20}
        backend = VLLMBackend(path, dtype="float32", enforce_eager=True, max_model_len=512, seed=0, **options)
        prompts = [tokenizer.encode(text) for text in ("I guess 3", "Guess a number between 1 and 6")]
        sampling = Sampling(temperature=1.0, max_new_tokens=8)

        def worst(model) -> tuple[float, list]:
            results = backend.generate([GenerationRequest(p, n=2, seed=11 * i) for i, p in enumerate(prompts)],
                                       sampling)
            diff, logps = 0.0, []
            for prompt, samples in zip(prompts, results):
                for c in samples:
                    ids = torch.tensor([list(prompt) + list(c.token_ids)])
                    with torch.no_grad():
                        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
                    want = [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(c.token_ids)]
                    diff = max([diff] + [abs(a - b) for a, b in zip(c.logprobs, want)])
                    logps.append((tuple(c.token_ids), tuple(c.logprobs)))
            return diff, logps

        before, old = worst(first)
        backend.update_weights(iter_full_tensors(second, DistInfo(), torch.float32))
        after, new = worst(second)
        with torch.no_grad():  # the first model's log-probabilities of what the synced engine generated
            stale = 0.0
            for (tokens, logps), prompt in zip(new, [p for p in prompts for _ in range(2)]):
                ids = torch.tensor([list(prompt) + list(tokens)])
                logp = torch.log_softmax(first(input_ids=ids).logits[0].float(), -1)
                stale = max([stale] + [abs(a - float(logp[len(prompt) - 1 + j, t])) for j, (a, t) in
                                       enumerate(zip(logps, tokens))])
        del backend
    tol = 1e-3 if device == "cpu" else 5e-3  # fp32 both; CUDA kernels reorder the sums
    row = {"device": device, "logprob_difference_before_sync": before, "logprob_difference_after_sync": after,
           "difference_from_the_old_model_after_sync": stale, "tolerance": tol}
    row["ok"] = bool(before <= tol and after <= tol and stale > 10 * tol)
    print(f"vllm generate and sync: {row}", flush=True)
    return [row]


def two_ranks(device: str, timeout: int = 600) -> list[dict]:
    """:mod:`.gpu_check_ranks` on 2 processes under torchrun (``device`` "cuda": NCCL, one GPU each; "cpu":
    gloo); one row per rank with its checks."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*module_command("torch.distributed.run"), "--nproc_per_node", "2", f"--master_port={port}",
               "-m", "trace_train.bench.gpu_check_ranks", tmp, device]
        env = isolated_environment({**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rows = []
        for rank in (0, 1):
            file = Path(tmp) / f"rank{rank}.json"
            rows.append(json.loads(file.read_text()) if file.exists() else
                        {"rank": rank, "ok": False, "error": done.stderr[-2000:]})
    for row in rows:
        row["ok"] = bool(row.get("ok") and done.returncode == 0)
        if done.returncode != 0:  # the ranks' checks passed but torchrun did not: say why
            row.setdefault("error", f"torchrun exited {done.returncode}: {done.stderr[-2000:]}")
        row["seconds"] = time.perf_counter() - t0
        print(f"two ranks ({device}): {row}", flush=True)
    return rows


def importable(name: str) -> bool:
    """Whether module ``name`` can be found (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


SECTIONS = ("tree_packing", "training_steps", "trainer_step", "logprob_memory", "update_throughput", "activation_checkpointing",
            "vllm", "two_gpus")


def verdict(out: dict, ran: list[str]) -> bool:
    """Every section that ran has rows, and every row says ok."""
    return all(out.get(name) and all(row.get("ok") for row in out[name]) for name in ran)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="the reduced CPU form (what the test runs)")
    parser.add_argument("--out", default="results/gpu_check.json")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--control", choices=["no-optimizer-step"], default=None,
                        help="break the trainer on purpose: the check must then fail")
    args = parser.parse_args(argv)
    import torch

    if args.cpu_smoke:
        device, dtypes, flex_backward = "cpu", ("float32",), False
        vocab, chunks, steps, prefix, k, repeats = 32768, (0, 256), 2, 256, 2, 1
        memory_tree = {"prefix": 1024, "k": 2, "generated": 128}  # 1,280 positions, 320 trained
        ckpt_tokens = 256
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    else:
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; run with --cpu-smoke on a CPU", file=sys.stderr)
            return 2
        device, dtypes, flex_backward = "cuda", ("float32", "bfloat16"), True
        vocab, chunks, steps, prefix, k, repeats = 151936, (0, 1024, 4096), 4, 4096, 8, 3
        memory_tree = {"prefix": 4096, "k": 8, "generated": 512}  # 8,192 positions, 4,160 trained
        ckpt_tokens = 4096
    started = time.perf_counter()
    out = {**origin("trace_train.bench.gpu_check", argv),
           "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "cpu_smoke": args.cpu_smoke,
           "torch": torch.__version__, "control": args.control, "skipped": {}}
    has_vllm = importable("vllm")
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    runs = {
        "tree_packing": lambda: tree_packing(device, dtypes, flex_backward),
        "training_steps": lambda: training_steps(device, dtypes, steps,
                                                 no_optimizer_step=args.control == "no-optimizer-step"),
        "trainer_step": lambda: trainer_steps(device, ("float32", "bfloat16")),
        "logprob_memory": lambda: logprob_memory(vocab, chunks, memory_tree),
        "update_throughput": lambda: update_throughput(prefix, k, repeats),
        "activation_checkpointing": lambda: activation_checkpointing(device, ckpt_tokens),
        "vllm": lambda: vllm_generate_and_sync(device),
        "two_gpus": lambda: two_ranks(device),
    }
    ran = []
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def write(final: bool) -> None:
        """The results so far, after every section: a run cut off by a timeout keeps what it measured."""
        out.update(ran=ran, failed=[name for name in ran if not verdict(out, [name])], ok=verdict(out, ran),
                   seconds=time.perf_counter() - started, finished=final)
        part = out_path.with_name(out_path.name + ".part")
        part.write_text(json.dumps(out, indent=1, default=float))
        part.replace(out_path)

    for name in args.sections:
        if name == "vllm" and not has_vllm:
            out["skipped"][name] = "vllm is not importable"
            continue
        if name == "two_gpus" and device == "cuda" and gpus < 2:
            out["skipped"][name] = f"{gpus} CUDA device(s) visible, 2 needed"
            continue
        try:
            out[name] = runs[name]()
        except Exception as err:  # a section that crashes fails, and the others still run
            out[name] = [{"ok": False, "error": f"{type(err).__name__}: {err}"}]
            print(f"gpu_check: section {name} raised {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        ran.append(name)
        write(final=False)
    write(final=True)
    skipped = "; ".join(f"{k} skipped ({v})" for k, v in out["skipped"].items())
    print(f"gpu_check: {'ok' if out['ok'] else 'FAILED ' + ', '.join(out['failed'])} in {out['seconds']:.0f} s"
          f"{'; ' + skipped if skipped else ''}; results in {args.out}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
