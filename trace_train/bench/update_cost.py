"""What one forwarded token of the policy update costs, per arm, on the same rows with each attention path.

    python -m trace_train.bench.update_cost                     # 1-8-guess games, 4 steps per arm, 5 repeats
    python -m trace_train.bench.update_cost --task mixed --steps 3

Each arm of ``bench.fit --compare`` (by default eager TRACE, streamed TRACE, barrier TRACE and GRPO) rolls
out ``--steps`` steps of ``cpu_demo`` on the chosen games (``bench.fit.TASKS``) at 600 generated tokens a
step, without training (the tiny warm-started Qwen3 of step 1 throughout); each step's batch is packed as
the trainer packs it (``update.packing.training_batch_for``). Then, on one thread, every batch is timed
(process CPU time, which a loaded machine disturbs less than the wall clock, and wall) for the forward and
backward of its trained tokens' log-probabilities, which is the policy's part of the update, through:

* ``tree_blocks``: the packed rows, SDPA in query blocks (``update.tree_attention``; the default), each
  micro-batch's rows end to end without their padding;
* ``tree_square``: the same rows padded, the masked square (one block a row: W^2 scores a row);
* ``leaf``: one causal row per leaf (``algorithm.packing=leaf``: shared prefixes forwarded again);
* ``causal_floor``: the packed rows under a plain causal mask: the wrong attention (branches see their
  siblings), timed only as the floor of what a row of that width costs;
* ``reference``: ``tree_blocks``' forward alone, without gradients, as the step's reference model (the KL
  term) runs it.

The process keeps freed memory in its heap, as the trainer does on CPU (``trace_train.run.malloc``);
``--heap glibc`` leaves glibc's defaults, under which every step faults its largest activations in
again (run both to see what that costs each arm; the setting is per process).

The repeats interleave, and within a repeat the arms go side by side (every arm's i-th batch through
a path, then the next path, then the next batch), so that a changing load touches every arm alike. Per
arm and path: the median over repeats of the repeat's CPU (and wall) microseconds per forwarded token
(all its batches' time over all their tokens), and ``cpu_ratio_to_grpo``, the median over repeats of the
repeat's ratio to GRPO's (each repeat's ratio in ``cpu_ratio_to_grpo_per_repeat``); per arm the rows,
their width, the padding share (padded positions the rows x width rectangle adds to the real tokens: what
a padded path forwards beyond them; ``tree_blocks`` forwards none) and the mean row width seen by a token
(sum of width^2 / sum of width, what a dense row's attention costs per token). The per-batch times are
kept under ``times_us_per_forward_token``. Results: ``results/update_cost.json``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from . import write_results
from ..run.malloc import keep_freed_memory, leave_glibc_defaults
from .fit import ARMS, TASKS

__all__ = ["PATHS", "arm_batches", "time_path", "main"]

PATHS = ("tree_blocks", "reference", "tree_square", "leaf", "causal_floor")
DEFAULT_ARMS = ("trace_eager", "trace", "trace_barrier", "grpo")


def arm_batches(arm: str, task: str, steps: int, token_budget: int, root: str, seed: int = 0):
    """The packed (tree) and per-leaf (leaf) batches of ``steps`` rollout steps of ``arm``, and the model."""
    import torch

    from trace_theory import compute_advantages

    from ..backends import training_backend
    from ..chat import ChatFormat
    from ..config_loader import load_config
    from ..configs import TrainConfig
    from ..predictors import build_predictor
    from ..rollout.engine import RolloutEngine
    from ..run.policy import load_policy, model_path
    from ..tasks import build_task
    from ..train import PromptSampler, _rollout_config, _step_seed
    from ..update.packing import build_training_batch, training_batch_for

    cfg = load_config(TrainConfig, "cpu_demo", [f"run_dir={root}", f"seed={seed}", *TASKS[task],
                                                f"rollout.token_budget={token_budget}", *ARMS[arm]])
    task_spec = build_task(cfg.task, seed=cfg.seed)
    path = model_path(cfg.model, cfg.run_dir, seed=cfg.seed, task=task_spec)
    model, tokenizer = load_policy(path, "cpu", torch.float32)
    backend = training_backend(cfg, path, device="cpu", policy=model, tokenizer=tokenizer, sharded=False)
    chat = ChatFormat(backend.tokenizer, tools=task_spec.make_env.tools,
                      template_kwargs=cfg.rollout.chat_template_kwargs)
    engine = RolloutEngine(backend, task_spec.make_env, _rollout_config(cfg, task_spec), chat=chat)
    sampler, predictor = PromptSampler(task_spec.train_rows, cfg.rollout.pool_size, seed=cfg.seed), build_predictor(cfg.predictor)
    pad = model.config.pad_token_id
    out = []
    for step in range(steps + (1 if engine.pipelined else 0)):  # pipelined: its first call fills the pipeline
        batch = engine.rollout(sampler.next_pool(), predictor=predictor, seed=_step_seed(cfg.seed, step, 0))
        if batch is None:
            continue
        adv = compute_advantages(batch.forest, cfg.algorithm.advantage)
        out.append({"tree": training_batch_for(batch, adv, cfg, pad_token_id=pad),
                    "leaf": build_training_batch(batch, adv, packing="leaf", pad_token_id=pad,
                                                 micro_batch_size=cfg.optim.micro_batch_size)})
    return out, model, cfg.rollout.temperature


def _forward_backward(model, seqs, path: str, temperature: float) -> None:
    import torch

    from ..update import tree_attention
    from ..update.packing import tree_logprobs

    for part in seqs.micro_batches():
        if path == "causal_floor":  # every position sees every earlier one of its row: the wrong attention
            until = torch.full_like(part.visible_until, part.visible_until.shape[1])
            predictor = part.predictor.where(part.loss_mask > 0, -1)
            logp = tree_logprobs(model, part.input_ids, part.position_ids, until, predictor, temperature=temperature)
        elif path == "tree_square":
            block, tree_attention.QUERY_BLOCK = tree_attention.QUERY_BLOCK, 1 << 30  # one block: the square
            try:  # the padded rows (no lengths), each its own square
                predictor = part.predictor.where(part.loss_mask > 0, -1)
                logp = tree_logprobs(model, part.input_ids, part.position_ids, part.visible_until, predictor,
                                     temperature=temperature)
            finally:
                tree_attention.QUERY_BLOCK = block
        elif path == "reference":  # the step's reference forward: no gradient, nothing to go backward
            with torch.no_grad():
                part.logprobs(model, temperature=temperature, trained_only=True)
            continue
        else:
            logp = part.logprobs(model, temperature=temperature, trained_only=True)
        logp.sum().backward()
    model.zero_grad(set_to_none=True)


def time_path(model, batch: dict, path: str, temperature: float) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of the forward and backward of ``batch`` through ``path``."""
    seqs = batch["leaf" if path == "leaf" else "tree"]
    c0, t0 = time.process_time(), time.perf_counter()
    _forward_backward(model, seqs, path, temperature)
    return time.process_time() - c0, time.perf_counter() - t0


def row_stats(seqs) -> dict:
    """Rows, width, padding share and the mean row width a token sees (sum w^2 / sum w)."""
    lengths = np.asarray(seqs.lengths if hasattr(seqs, "lengths") else seqs.attention_mask.sum(1), dtype=float)
    width = sum(len(m) * max(lengths[list(m)]) for m in seqs.micro) if hasattr(seqs, "micro") else None
    padded = width if width is not None else float(seqs.input_ids.numel())
    return {"rows": len(lengths), "forward_tokens": float(lengths.sum()), "widest_row": float(lengths.max()),
            "padding_share": float(padded / lengths.sum() - 1.0),
            "row_width_per_token": float((lengths ** 2).sum() / lengths.sum())}


def attention_stats(tree) -> dict:
    """What the default path's attention computes per forwarded token: the micro-batches, the keys a token
    sees on its own path (position + 1, the causal floor of a path) and the (query, key) pairs the query
    blocks compute (``update.tree_attention``: ancestors plus the block's own triangle, whole)."""
    import torch

    from ..update.tree_attention import block_plan

    pairs, path = 0, 0.0
    for part in tree.micro_batches():
        real = np.arange(part.input_ids.shape[1])[None, :] < part.lengths.numpy()[:, None]
        path += float((part.position_ids.numpy() + 1)[real].sum())
        offset = np.cumsum(part.lengths.numpy()) - part.lengths.numpy()
        until = (part.visible_until.numpy() + offset[:, None])[real][None]
        plan = block_plan(torch.as_tensor(until))
        pairs += sum(q * k for q, k in zip(plan.query_sizes, plan.key_sizes))
    tokens = tree.forward_tokens
    return {"micro_batches": len(tree.micro), "trained_share": float((tree.loss_mask > 0).sum()) / tokens,
            "path_keys_per_token": path / tokens, "block_keys_per_token": pairs / tokens}


def main(argv=None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="guess_games", choices=sorted(TASKS))
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=sorted(ARMS))
    parser.add_argument("--steps", type=int, default=4, help="rollout steps (batches) per arm")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes over every batch and path")
    parser.add_argument("--token-budget", type=int, default=600)
    parser.add_argument("--heap", default="kept", choices=("kept", "glibc"),
                        help="kept: freed memory stays in the heap, as in the trainer (run.malloc); glibc: its defaults")
    parser.add_argument("--out", default="results/update_cost.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_memory() if args.heap == "kept" else leave_glibc_defaults()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    arms = tuple(dict.fromkeys((*args.arms, "grpo")))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        batches, model = {}, None
        for arm in arms:
            batches[arm], model, temperature = arm_batches(arm, args.task, args.steps, args.token_budget, tmp)
    for arm in arms:  # one model for every arm's batches (the arms' runs build the same tiny model)
        for b in batches[arm]:
            _forward_backward(model, b["tree"], "tree_blocks", temperature)  # warm-up, not timed
    times = {(arm, path): [] for arm in arms for path in PATHS}
    totals = {(arm, path): np.zeros((args.repeats, 3)) for arm in arms for path in PATHS}  # cpu, wall, tokens
    for rep in range(args.repeats):
        for i in range(max(len(b) for b in batches.values())):
            for path in PATHS:
                for arm in arms:  # the arms side by side: one load for all of them
                    if i >= len(batches[arm]):
                        continue
                    b = batches[arm][i]
                    cpu, wall = time_path(model, b, path, temperature)
                    tokens = (b["leaf"] if path == "leaf" else b["tree"]).forward_tokens
                    times[arm, path].append((1e6 * cpu / tokens, 1e6 * wall / tokens))
                    totals[arm, path][rep] += (cpu, wall, tokens)
    summary: dict = {}
    for arm in arms:
        rows = [{**row_stats(b["tree"]), **attention_stats(b["tree"])} for b in batches[arm]]
        leaf = [row_stats(b["leaf"]) for b in batches[arm]]
        summary[arm] = {"batches": len(rows), **{k: float(np.mean([r[k] for r in rows])) for k in rows[0]},
                        "leaf_forward_tokens": float(np.mean([r["forward_tokens"] for r in leaf])),
                        "leaf_row_width_per_token": float(np.mean([r["row_width_per_token"] for r in leaf]))}
        for path in PATHS:
            cpu, wall, tokens = totals[arm, path].T
            summary[arm][path] = {"cpu_us_per_forward_token": float(np.median(1e6 * cpu / tokens)),
                                  "wall_us_per_forward_token": float(np.median(1e6 * wall / tokens))}
    for arm in arms:
        for path in PATHS:
            mine, grpo = totals[arm, path], totals["grpo", path]
            paired = (mine[:, 0] / mine[:, 2]) / (grpo[:, 0] / grpo[:, 2])  # the same repeat's arms, side by side
            cell = summary[arm][path]
            cell["cpu_ratio_to_grpo"] = float(np.median(paired))
            cell["cpu_ratio_to_grpo_per_repeat"] = paired.tolist()
        blocks, square = summary[arm]["tree_blocks"], summary[arm]["tree_square"]
        summary[arm]["blocks_vs_square_cpu"] = blocks["cpu_us_per_forward_token"] / square["cpu_us_per_forward_token"]
    lines = ["| arm | rows | fwd tokens | row width / token | padding | path keys / tok | block keys / tok | "
             + " | ".join(f"{p} us/tok (x GRPO)" for p in PATHS) + " | blocks / square |", "|---" * (8 + len(PATHS)) + "|"]
    for arm in arms:
        s = summary[arm]
        lines.append(f"| {arm} | {s['rows']:.1f} | {s['forward_tokens']:.0f} | {s['row_width_per_token']:.0f} | "
                     f"{s['padding_share']:.1%} | {s['path_keys_per_token']:.0f} | {s['block_keys_per_token']:.0f} | "
                     + " | ".join(
                         f"{s[p]['cpu_us_per_forward_token']:.1f} ({s[p]['cpu_ratio_to_grpo']:.2f})" for p in PATHS)
                     + f" | {s['blocks_vs_square_cpu']:.2f} |")
    print("\n".join(lines))
    results = {"task": args.task, "steps": args.steps, "repeats": args.repeats, "token_budget": args.token_budget,
               "heap": args.heap,
               "load_average_before": load_before, "load_average_after": os.getloadavg(), "summary": summary,
               "times_us_per_forward_token": {f"{a}/{p}": v for (a, p), v in times.items()}}
    print(f"load average before / after: {load_before} / {results['load_average_after']}")
    write_results(results, args.out, module="trace_train.bench.update_cost", argv=argv)
    return results


if __name__ == "__main__":
    main()
