"""TRACE against GRPO and the other policies at equal generated tokens, on guess-the-number, several seeds.

    python -m trace_train.bench_policies                       # 4 policies x 3 seeds, about 15 min on 2 cores
    python -m trace_train.bench_policies --task mixed          # prompts of very different difficulty
    python -m trace_train.bench_policies --policies trace grpo --seeds 0 1 --steps 20 --out runs/bench

Every run is the ``cpu_demo`` preset (tiny Qwen3, transformers back end) with the same token budget per
step (``rollout.token_budget``: the engine sizes M so that each step generates about that many tokens,
whatever the policy), the same seeds and the same held-out prompts. A run directory per (policy, seed)
holds the trainer's ``metrics.jsonl``; finished runs are not rerun (the trainer resumes unfinished ones),
and the summary is computed from those files alone. Reported per policy: held-out success at the start
and at the end (mean of the last two evaluations), its gain over the start with a standard error over
seeds, the mean effective ratio of the training batches and the tokens generated.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from .config import load_config
from .metrics_log import read_metrics
from .train import TrainConfig, main as train

DEFAULT_POLICIES = ("trace", "grpo", "dapo", "random_prefix")


TASKS = {
    "uniform": "{low: 1, high: 6, max_guesses: 3}",
    "mixed": "{low: 1, highs: [2, 6, 64], max_guesses: 3}",
}
"""Difficulty mixes: ``uniform`` (cpu_demo's games, every prompt about equally hard) and ``mixed`` (a third
of the prompts almost always solved, a third almost never, as in real RL data sets)."""


def run_one(out: Path, policy: str, seed: int, steps: int, token_budget: int, task: str = "uniform") -> Path:
    run_dir = out / task / f"{policy}-seed{seed}"
    done = run_dir / "metrics.jsonl"
    if done.exists() and any(r["step"] == steps for r in read_metrics(done)):
        return run_dir
    cfg = load_config(TrainConfig, "cpu_demo", [
        f"run_dir={run_dir}", f"seed={seed}", f"steps={steps}", f"rollout.policy={policy}",
        f"rollout.token_budget={token_budget}", "tensorboard=false", f"checkpoint_every={steps}",
        f"task.rows={TASKS[task]}",
    ])
    train(cfg)
    return run_dir


def summarise(run_dirs: dict[str, list[Path]]) -> dict:
    summary = {}
    for policy, dirs in run_dirs.items():
        start, end, ratio, tokens = [], [], [], []
        for d in dirs:
            rows = read_metrics(d / "metrics.jsonl")
            evals = [r["eval_success"] for r in rows if "eval_success" in r]
            start.append(evals[0])
            end.append(float(np.mean(evals[-2:])))
            ratio.append(float(np.nanmean([r["effective_ratio"] for r in rows if "effective_ratio" in r])))
            tokens.append(float(sum(r.get("generated_tokens", 0.0) for r in rows)))
        gain = np.array(end) - np.array(start)
        summary[policy] = {
            "seeds": len(dirs),
            "success_start": float(np.mean(start)),
            "success_end": float(np.mean(end)),
            "gain": float(gain.mean()),
            "gain_stderr": float(gain.std(ddof=1) / np.sqrt(len(gain))) if len(gain) > 1 else float("nan"),
            "effective_ratio": float(np.mean(ratio)),
            "generated_tokens": float(np.mean(tokens)),
        }
    return summary


def table(summary: dict) -> str:
    lines = ["| policy | held-out success: start -> end | gain (± SE over seeds) | effective ratio | tokens generated |",
             "| --- | --- | --- | --- | --- |"]
    for policy, s in summary.items():
        lines.append(f"| {policy} | {s['success_start']:.3f} -> {s['success_end']:.3f} | {s['gain']:+.3f} ± "
                     f"{s['gain_stderr']:.3f} | {s['effective_ratio']:.1%} | {s['generated_tokens']:,.0f} |")
    return "\n".join(lines)


def cli(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--token-budget", type=int, default=600, help="generated tokens per step")
    parser.add_argument("--task", choices=sorted(TASKS), default="uniform", help="difficulty mix of the games")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_policies"))
    args = parser.parse_args(argv)
    run_dirs = {p: [run_one(args.out, p, s, args.steps, args.token_budget, args.task) for s in args.seeds]
                for p in args.policies}
    summary = summarise(run_dirs)
    (args.out / args.task / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(table(summary))
    print(f"runs and summary.json in {args.out / args.task}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
