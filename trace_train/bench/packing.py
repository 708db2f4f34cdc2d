"""Benchmark: the policy update on per-leaf rows against packed trees (tokens, time, peak memory).

Cases, each updated with ``algorithm.packing=leaf`` and ``=tree`` in the same run:

* ``demo-trace``, ``demo-grpo``: the first step's batch of the CPU demo (``--config cpu_demo``: the tiny
  warm-started Qwen3 on guess-the-number, 48 roots, TRACE's or GRPO's allocation), updated with the
  preset's settings (KL reference model included, micro-batches of 16 rows for ``leaf``, the default
  token budget for ``tree``);
* ``prefix-P-xk``: one synthetic tree whose shared prefix holds P tokens (1k-8k), branching into k
  continuations (2-8) of 128 generated tokens each; a tiny Qwen3 (2 layers, hidden 64, random weights:
  time and memory do not depend on them), a token budget of 16,384 for ``tree``.

Each (case, packing) runs in a fresh process (so that one run's freed memory cannot hide the next one's
peak) with ``--threads`` torch threads: it builds the rows (timed), runs one untimed update, then
``--repeats`` timed updates (SGD with learning rate 0, so every repeat does the same work). Peak memory
is the highest resident set size sampled every 2 ms during the timed updates, minus the size just before
them (on CUDA: ``torch.cuda.max_memory_allocated``). Times are medians of wall clock and of this
process's CPU time (which a busy shared machine disturbs less).

    python -m trace_train.bench.packing                 # about 5 min on 2 cores; results/bench_packing.json
    python -m trace_train.bench.packing --learning      # cpu_demo with leaf and with tree, seeds 0-2
    python -m trace_train.bench.packing --logprob-memory  # the update's peak at a 152k vocabulary, chunked vs full

``--logprob-memory``: one update (``_policy_update``, no KL reference) of a synthetic tree (a 1,024-token
prefix and 2 continuations of 128 tokens, packed: 1,280 positions) on a tiny Qwen3 with Qwen3's
vocabulary of 151,936 (hidden 64, 2 layers, untied output layer), with ``algorithm.logprob_chunk_tokens``
= 0 (the full log-softmax) and chunks of 256 and 1,024 positions, each in a fresh process; prints the
measured peak next to the output-layer term of ``trace_train.update.logprobs``'s formula.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trace_train.child_python import spawn_pool
from . import origin

__all__ = ["BenchConfig", "main", "learning", "measure_update", "measure_logprob_memory", "long_prefix_batch",
           "large_vocab_model"]


@dataclass(frozen=True)
class BenchConfig:
    prefixes: tuple[int, ...] = (1024, 2048, 4096, 8192)
    """Shared prefix lengths of the synthetic trees (tokens)."""
    continuations: tuple[int, ...] = (2, 8)
    """Continuations branching from the prefix."""
    continuation_tokens: int = 128
    """Generated tokens of each continuation."""
    demo: bool = True
    """Measure the CPU demo's TRACE and GRPO batches."""
    demo_budgets: tuple[int, ...] = (2048,)
    """Also pack the demo batches with these token budgets (``tree/B`` rows): memory against budget."""
    repeats: int = 3
    """Timed updates per case and packing (after one untimed one)."""
    threads: int = 1
    """torch threads in every measuring process."""
    seed: int = 0
    out: str = "results/bench_packing.json"

    def __post_init__(self):
        if self.repeats < 1 or self.threads < 1 or self.continuation_tokens < 1:
            raise ValueError("`repeats`, `threads` and `continuation_tokens` must be at least 1")
        if any(b < 1 for b in self.demo_budgets):
            raise ValueError(f"`demo_budgets` must be positive token counts, got {self.demo_budgets}")
        if any(p < 64 for p in self.prefixes) or any(k < 1 for k in self.continuations):
            raise ValueError("`prefixes` must be at least 64 tokens and `continuations` at least 1")


# ---------------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------------


def demo_batch(policy: str, run_dir: str, seed: int):
    """The first training step's batch of ``trace-train --config cpu_demo rollout.policy=policy``, without
    environment snapshots (so it can be sent to a measuring process); returns (batch, model path)."""
    import torch

    from ..config_loader import load_config
    from ..rollout.engine import RolloutEngine
    from ..chat import ChatFormat
    from ..predictors import build_predictor
    from ..tasks import build_task
    from ..configs import TrainConfig
    from ..backends import training_backend
    from ..run.policy import load_policy, model_path
    from ..train import PromptSampler, _rollout_config, _step_seed

    cfg = load_config(TrainConfig, "cpu_demo", [f"run_dir={run_dir}", f"rollout.policy={policy}", f"seed={seed}"])
    task = build_task(cfg.task, seed=cfg.seed)
    path = model_path(cfg.model, cfg.run_dir, seed=cfg.seed)
    model, tokenizer = load_policy(path, "cpu", getattr(torch, cfg.model.dtype))
    backend = training_backend(cfg, path, device="cpu", policy=model, tokenizer=tokenizer, sharded=False)
    chat = ChatFormat(backend.tokenizer, tools=task.make_env.tools, template_kwargs=cfg.rollout.chat_template_kwargs)
    engine = RolloutEngine(backend, task.make_env, _rollout_config(cfg, task), chat=chat)
    pool = PromptSampler(task.train_rows, cfg.rollout.pool_size, seed=cfg.seed).next_pool()
    batch = engine.rollout(pool, predictor=build_predictor(cfg.predictor), seed=_step_seed(cfg.seed, 0, 0))
    nodes = tuple(dataclasses.replace(p, snapshot=None) for p in batch.nodes)
    return dataclasses.replace(batch, nodes=nodes, rows={}), path


def long_prefix_batch(prefix: int, k: int, generated: int, *, vocab: int, seed: int = 0):
    """One tree: a 32-token prompt, one turn (64 generated tokens, then observation) filling the prefix
    to ``prefix`` tokens, and ``k`` continuations of ``generated`` tokens from it (the first is the
    bare rollout's own last turn)."""
    from trace_theory import Origin, RolloutForest

    from ..rollout.batch import NodePayload, RolloutBatch

    rng = np.random.default_rng(seed)
    parent = np.array([-1, 0] + [1] * k)
    origin = np.array([Origin.ROOT, Origin.BARE, Origin.BARE] + [Origin.CONTINUATION] * (k - 1))
    reward = np.array([np.nan, np.nan] + [float(i % 2) for i in range(k)])
    forest = RolloutForest.from_parents(parent, reward, origin=origin)
    ids = lambda n: tuple(rng.integers(10, vocab, n).tolist())  # noqa: E731

    def node(action: int, observation: int) -> NodePayload:
        return NodePayload(ids(action), tuple([-1.0] * action), "", ids(observation), "", (), None)

    nodes = (node(0, 32), node(64, prefix - 96)) + tuple(node(generated, 0) for _ in range(k))
    return RolloutBatch(forest, nodes, {}, np.full(len(parent), np.nan), None)


# ---------------------------------------------------------------------------------------------------
# One measurement (in its own process)
# ---------------------------------------------------------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakMemory:
    """Peak resident set size (CPU, sampled) or allocated CUDA memory, above the level at start."""

    def __init__(self, cuda: bool):
        self.cuda, self.peak, self._stop = cuda, 0, threading.Event()

    def __enter__(self):
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = self.peak = _rss()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        import torch

        if self.cuda:
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, _rss())

    @property
    def megabytes(self) -> float:
        return (self.peak - self.base) / 2**20


def measure_update(job: dict) -> dict:
    """One update's time and peak memory: ``job`` names the packing, the config overrides, the model (None:
    a tiny random Qwen3 on ``job["tree"]``'s synthetic tree), the repeats and threads (see :func:`_jobs`)."""
    import torch

    from ..config_loader import load_config
    from ..run.distributed import DistInfo
    from ..update.packing import training_batch_for
    from ..train import TrainConfig
    from ..update.optimizer_step import policy_update as _policy_update
    from trace_theory import compute_advantages

    torch.set_num_threads(job["threads"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = load_config(TrainConfig, "cpu_demo", [f"algorithm.packing={job['packing']}", *job["overrides"]])
    if job["model"] is None:  # synthetic trees: a tiny random Qwen3 long enough for them
        from ..tiny import build_model, build_tokenizer

        model = build_model(build_tokenizer(), max_positions=job["positions"]).to(device)
        batch = long_prefix_batch(**job["tree"], vocab=model.config.vocab_size)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32).to(device)
        batch = job["batch"]
    ref = None
    if cfg.algorithm.loss.kl_coef > 0:
        import copy

        ref = copy.deepcopy(model).requires_grad_(False).eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    adv = compute_advantages(batch.forest, cfg.algorithm.advantage)
    t0 = time.perf_counter()
    seqs = training_batch_for(batch, adv, cfg, pad_token_id=model.config.pad_token_id)
    build_s = time.perf_counter() - t0
    _policy_update(model, optimizer, seqs, cfg, DistInfo(), ref=ref)  # warm-up
    times, cpu_times = [], []
    with _PeakMemory(device == "cuda") as mem:
        for _ in range(job["repeats"]):
            t0, c0 = time.perf_counter(), time.process_time()
            stats = _policy_update(model, optimizer, seqs, cfg, DistInfo(), ref=ref)
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
    return {"case": job["case"], "packing": job.get("label", job["packing"]), "forward_tokens": seqs.forward_tokens,
            "unique_tokens": seqs.unique_tokens, "micro_batches": len(seqs.micro_batches()),
            "build_s": build_s, "update_s": float(np.median(times)), "update_s_all": times,
            "update_cpu_s": float(np.median(cpu_times)),
            "peak_mb": mem.megabytes, "loss": stats["loss"], "grad_norm": stats["grad_norm"], "device": device}


QWEN3_VOCAB = 151936


def large_vocab_model(vocab: int = QWEN3_VOCAB, positions: int = 2048, device: str = "cpu"):
    """A tiny Qwen3 (hidden 64, 2 layers, random weights) with a full-size vocabulary and its own output layer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=positions,
                         tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).to(device)


def measure_logprob_memory(job: dict) -> dict:
    """Peak memory of one update at vocabulary ``job["vocab"]`` with ``job["chunk"]`` chunked log-probabilities
    (0: the full log-softmax) on a synthetic tree (``prefix``, ``k``, ``generated``), with the output layer's
    formula (``trace_train.update.logprobs``)."""
    import torch

    from trace_theory import compute_advantages

    from ..config_loader import load_config
    from ..run.distributed import DistInfo
    from ..update.packing import training_batch_for
    from ..train import TrainConfig
    from ..update.optimizer_step import policy_update as _policy_update

    torch.set_num_threads(job["threads"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = job.get("vocab", QWEN3_VOCAB)
    model = large_vocab_model(vocab, device=device)
    batch = long_prefix_batch(job["prefix"], job["k"], job["generated"], vocab=vocab)
    cfg = load_config(TrainConfig, "cpu_demo", ["algorithm.loss.kl_coef=0", "algorithm.pack_tokens=16384",
                                                f"algorithm.logprob_chunk_tokens={job['chunk']}"])
    seqs = training_batch_for(batch, compute_advantages(batch.forest, cfg.algorithm.advantage), cfg, pad_token_id=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    _policy_update(model, optimizer, seqs, cfg, DistInfo())  # warm-up: gradients allocated, first-call costs
    with _PeakMemory(device == "cuda") as mem:
        t0 = time.perf_counter()
        _policy_update(model, optimizer, seqs, cfg, DistInfo())
        seconds = time.perf_counter() - t0
    positions = seqs.input_ids.numel()  # rows x width: what the full log-softmax covers
    trained = int((seqs.loss_mask > 0).sum())  # what the chunked one computes (trained_only)
    chunk = job["chunk"]
    head = (min(chunk, trained) * vocab * 8) if chunk else positions * vocab * 12  # fp32: s = 4
    return {"vocab": vocab, "chunk_tokens": chunk, "positions": positions, "trained_positions": trained, "peak_mb": mem.megabytes,
            "update_s": seconds, "output_layer_formula_mb": head / 2**20, "device": device}


def logprob_memory(chunks=(0, 256, 1024), threads: int = 1, out: str = "results/bench_logprob_memory.json") -> dict:
    """Peak memory of one update at Qwen3's vocabulary, full log-softmax (chunk 0) against chunks."""
    rows = []
    for chunk in chunks:
        job = {"chunk": chunk, "threads": threads, "prefix": 1024, "k": 2, "generated": 128}
        with spawn_pool(1) as pool:
            row = pool.apply(measure_logprob_memory, (job,))
        rows.append(row)
        print(f"logprob_chunk_tokens={chunk:5d}  positions {row['positions']} (trained {row['trained_positions']})  peak {row['peak_mb']:7.0f} MB "
              f"(output-layer formula {row['output_layer_formula_mb']:6.0f} MB)  update {row['update_s']:.2f} s",
              flush=True)
    result = {**origin("trace_train.bench.packing"), "vocab": QWEN3_VOCAB, "rows": rows,
              "load_average": os.getloadavg()}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1, default=float))
    return result


# ---------------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------------


def _jobs(config: BenchConfig, tmp: str) -> list[dict]:
    base = {"repeats": config.repeats, "threads": config.threads}
    jobs = []
    if config.demo:
        for policy in ("trace", "grpo"):
            batch, path = demo_batch(policy, os.path.join(tmp, policy), config.seed)
            jobs.append({**base, "case": f"demo-{policy}", "model": path, "batch": batch,
                         "overrides": [f"rollout.policy={policy}"]})
    for prefix in config.prefixes:
        for k in config.continuations:
            tree = {"prefix": prefix, "k": k, "generated": config.continuation_tokens, "seed": config.seed}
            jobs.append({**base, "case": f"prefix-{prefix}-x{k}", "model": None, "tree": tree,
                         "positions": prefix + config.continuation_tokens + 64,
                         "overrides": ["algorithm.pack_tokens=16384"]})
    variants = [{**job, "packing": p} for job in jobs for p in ("leaf", "tree")]
    variants += [{**job, "packing": "tree", "label": f"tree/{b}", "overrides": [*job["overrides"], f"algorithm.pack_tokens={b}"]}
                 for job in jobs if job["case"].startswith("demo") for b in config.demo_budgets]
    return variants


def main(config: BenchConfig) -> dict:
    """Measure every case with both packings; print a table and write ``config.out``."""
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", str(config.threads))
    torch.set_num_threads(config.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = _jobs(config, tmp)
        for job in jobs:
            with spawn_pool(1) as pool:
                row = pool.apply(measure_update, (job,))
            rows.append(row)
            print(f"{row['case']:16s} {row['packing']:9s} forward {row['forward_tokens']:7d} unique "
                  f"{row['unique_tokens']:7d}  update {row['update_s']:.3f} s (cpu {row['update_cpu_s']:.3f} s)  build {row['build_s']:.3f} s  "
                  f"peak {row['peak_mb']:.0f} MB", flush=True)
    summary = _summary(rows)
    for case, s in summary.items():
        print(f"{case:16s} tokens tree/leaf {s['token_ratio']:.3f}  time tree/leaf {s['time_ratio']:.3f} (cpu {s['cpu_time_ratio']:.3f})  "
              f"peak tree/leaf {s['peak_ratio']:.2f}  forward/unique (tree) {s['tree_forward_over_unique']:.3f}")
    out = {**origin("trace_train.bench.packing"), "config": dataclasses.asdict(config), "load_average": os.getloadavg(),
           "rows": rows, "summary": summary}
    Path(config.out).parent.mkdir(parents=True, exist_ok=True)
    Path(config.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"results in {config.out} (load average {os.getloadavg()[0]:.1f})")
    return out


def _summary(rows: list[dict]) -> dict:
    by = {(r["case"], r["packing"]): r for r in rows}
    out = {}
    for case in dict.fromkeys(r["case"] for r in rows):
        leaf, tree = by[(case, "leaf")], by[(case, "tree")]
        out[case] = {"token_ratio": tree["forward_tokens"] / leaf["forward_tokens"],
                     "time_ratio": tree["update_s"] / leaf["update_s"],
                     "cpu_time_ratio": tree["update_cpu_s"] / leaf["update_cpu_s"],
                     "peak_ratio": tree["peak_mb"] / max(leaf["peak_mb"], 1e-9),
                     "tree_forward_over_unique": tree["forward_tokens"] / tree["unique_tokens"],
                     "loss_leaf": leaf["loss"], "loss_tree": tree["loss"],
                     "grad_norm_leaf": leaf["grad_norm"], "grad_norm_tree": tree["grad_norm"]}
    return out


def learning(seeds=(0, 1, 2), run_root: str = "runs/bench_packing") -> dict:
    """``trace-train --config cpu_demo`` with ``algorithm.packing=leaf`` and ``=tree`` over ``seeds``:
    held-out success at the start and the mean of the last two evaluations, per run."""
    from ..config_loader import load_config
    from ..run.metrics_log import read_metrics
    from ..train import TrainConfig
    from ..train import main as train

    out = {}
    for seed in seeds:
        for packing in ("leaf", "tree"):
            run_dir = Path(run_root) / f"{packing}-{seed}"
            cfg = load_config(TrainConfig, "cpu_demo", [f"run_dir={run_dir}", f"seed={seed}",
                                                         f"algorithm.packing={packing}", "tensorboard=false"])
            t0 = time.perf_counter()
            train(cfg)
            rows = read_metrics(run_dir / "metrics.jsonl")
            evals = [r["eval_success"] for r in rows if "eval_success" in r]
            out[f"{packing}-{seed}"] = {"start": evals[0], "end": float(np.mean(evals[-2:])), "seconds": time.perf_counter() - t0,
                                        "train_seconds": float(np.sum([r.get("train_seconds", 0.0) for r in rows]))}
            print(f"{packing} seed {seed}: {out[f'{packing}-{seed}']}", flush=True)
    return out


def _parse(argv=None) -> tuple[BenchConfig, bool]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = BenchConfig()
    parser.add_argument("--prefixes", type=int, nargs="*", default=list(defaults.prefixes))
    parser.add_argument("--continuations", type=int, nargs="+", default=list(defaults.continuations))
    parser.add_argument("--continuation-tokens", type=int, default=defaults.continuation_tokens)
    parser.add_argument("--no-demo", action="store_true", help="skip the CPU demo batches")
    parser.add_argument("--demo-budgets", type=int, nargs="*", default=list(defaults.demo_budgets))
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", default=defaults.out)
    parser.add_argument("--learning", action="store_true", help="compare learning on cpu_demo instead")
    parser.add_argument("--logprob-memory", action="store_true",
                        help="peak memory of an update at a 152k vocabulary, chunked against full log-probs")
    args = parser.parse_args(argv)
    if args.logprob_memory:
        return None, "logprob_memory"
    config = BenchConfig(tuple(args.prefixes), tuple(args.continuations), args.continuation_tokens, not args.no_demo,
                         tuple(args.demo_budgets), args.repeats, args.threads, args.seed, args.out)
    return config, args.learning


if __name__ == "__main__":
    try:
        bench_config, run_learning = _parse()
    except ValueError as err:
        raise SystemExit(f"bench_packing: {err}") from None
    if run_learning == "logprob_memory":
        logprob_memory()
    elif run_learning:
        print(json.dumps(learning(), indent=1))
    else:
        main(bench_config)
